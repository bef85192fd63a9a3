"""A throwaway PostgreSQL server, for the Python suites of regress/ and the benchmarks
bench/instructions.py and bench/scheduling.py: a temporary directory (socket, data
directory, log), initdb, a configuration the caller gives, start, psql, and an
immediate stop that removes it all. Run as root, the server and every program that
touches it run as postgres, which PostgreSQL requires.

The scripts find this module by their own path (sys.path), whatever the working
directory; bench/run's own server is another one (bench/stride_bench/pgserver.py).
"""

import os
import shutil
import subprocess
import tempfile
import time

# The PostgreSQL under test, as scripts/pg-env exports it (default: Debian's 15).
PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
# Without the caller's RUST_* variables: a server started with RUST_BACKTRACE set
# appends a Rust backtrace to the DETAIL of every error that passes through pg_stride's
# hooks. A caller that wants them sets them in its own copy.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("RUST_")}


class Server:
    """A server in a temporary directory `dir` (its socket; data directory `data`, log
    `logfile`), reached over the Unix socket only. Its programs run with `env`."""

    env = ENV

    def __init__(self, port, prefix="pg_stride_"):
        self.port = port
        self.dir = tempfile.mkdtemp(prefix=prefix)
        if AS_POSTGRES:
            shutil.chown(self.dir, "postgres")
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "log")

    def run(self, *args, **kw):
        """subprocess.run of a program as the server's user, with `env` unless given."""
        kw.setdefault("env", self.env)
        return subprocess.run(AS_POSTGRES + list(args), **kw)

    def initdb(self, conf):
        """Makes the data directory; its postgresql.conf gets the socket, the port and
        `conf` (lines)."""
        self.run(f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                 check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{self.dir}'\n"
                    f"port = {self.port}\n{conf}")

    def pg_ctl(self, *args, **kw):
        return self.run(f"{PGBIN}/pg_ctl", "-D", self.data, *args, **kw)

    def start(self):
        self.pg_ctl("-l", self.logfile, "-w", "start", check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        """Stops the server at once, if it runs, and removes its directory."""
        self.pg_ctl("-m", "immediate", "stop", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def script(self, name, text):
        """Writes `text` to the file `name` under `dir`, owned by the server's user (for
        pgbench or the server to read); returns its path."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        if AS_POSTGRES:
            shutil.chown(path, "postgres")
        return path

    def psql_args(self, sql, user="postgres", db="postgres"):
        """psql's command line: unaligned tuples only, stopping at the first error; it
        runs `sql`, or, with None, what comes on its standard input."""
        return AS_POSTGRES + [f"{PGBIN}/psql", "-X", "-q", "-A", "-t", "-h", self.dir,
                              "-p", str(self.port), "-U", user, "-d", db,
                              "-v", "ON_ERROR_STOP=1"] + ([] if sql is None else ["-c", sql])

    def sql(self, sql, user="postgres", db="postgres"):
        """Runs `sql` as `user` in database `db` and returns its output; raises
        RuntimeError with psql's error."""
        out = subprocess.run(self.psql_args(sql, user, db), env=self.env, capture_output=True,
                             text=True)
        if out.returncode != 0:
            raise RuntimeError(f"{sql!r} failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def wait_until(self, sql, expected, timeout=10.0):
        """Polls `sql` until it returns `expected`; fails the check if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.sql(sql)
            if value == expected:
                return value
            assert time.monotonic() < deadline, f"{sql!r} gave {value!r}, not {expected!r}, for {timeout} s"
            time.sleep(0.02)
