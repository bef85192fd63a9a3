"""The benchmark's PostgreSQL server and pgbouncer: one data directory, restarted with
each configuration's settings, plus CPU accounting of the server processes."""

import json
import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

from . import analysis
from .common import (APP_ROLE, BOUNCER_PORT, DATA, IS_ROOT, OUT, PG_BIN, PG_PORT, PGBOUNCER,
                     SERVER_USER, as_server_user, chown_server, log, ncpus, run)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _server_can_reach(path: Path) -> bool:
    """Can the server user get to `path` (every parent directory searchable)?"""
    if not IS_ROOT:
        return True
    res = subprocess.run(["runuser", "-u", SERVER_USER, "--", "test", "-x", str(path)],
                         capture_output=True)
    return res.returncode == 0


def without_altered_settings(auto_conf: str) -> tuple:
    """`postgresql.auto.conf`'s text with what ALTER SYSTEM set taken out (its header
    comments kept), and the settings taken out. They override postgresql.conf and so
    every configuration's bench_config.conf: one left by a session at the bench's server
    would run in every configuration after it."""
    kept, dropped = [], []
    for line in auto_conf.splitlines():
        (kept if not line.strip() or line.lstrip().startswith("#") else dropped).append(line)
    return "".join(f"{line}\n" for line in kept), dropped


def _server_base() -> tuple:
    """Where the server's files go: bench/data and bench/out normally; a directory under
    /var/tmp when the server user cannot reach the checkout (e.g. a clone under /root)."""
    DATA.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    if _server_can_reach(DATA) and _server_can_reach(OUT):
        return DATA, OUT
    import hashlib
    tag = hashlib.sha1(str(DATA).encode()).hexdigest()[:8]
    base = Path(f"/var/tmp/pg_stride_bench-{tag}")
    base.mkdir(parents=True, exist_ok=True)
    chown_server(base)
    log(f"the server user cannot reach {DATA}; its files go to {base}")
    return base, base


def socket_dir(server_out: Path) -> Path:
    """Unix-socket directory; short enough for the 107-byte socket path limit."""
    d = server_out / "sock"
    if len(str(d)) > 80:
        d = Path(f"/tmp/pg_stride_bench_{os.getuid()}")
    d.mkdir(parents=True, exist_ok=True)
    chown_server(d)
    os.chmod(d, 0o777)
    return d


def pkglibdir() -> Path:
    res = run([PG_BIN / "pg_config", "--pkglibdir"], capture=True, quiet=True, check=False)
    if res.returncode == 0 and res.stdout.strip():
        return Path(res.stdout.strip())
    return Path("/usr/lib/postgresql/15/lib")


def major_version() -> str:
    """The major version of the server binaries in PG_BIN ("15", "18")."""
    res = run([PG_BIN / "pg_config", "--version"], capture=True, quiet=True)
    return res.stdout.split()[1].split(".")[0]


def stride_library_problem() -> str | None:
    """Why the installed pg_stride.so cannot be benchmarked (absent, or a debug build),
    or None."""
    so = pkglibdir() / "pg_stride.so"
    if not so.exists():
        return f"{so} is not installed (make install)"
    if has_debug_info(so):
        return (f"{so} is a debug build (`make test` installs one); `make install` installs "
                "a release build")
    return None


def has_debug_info(path: Path) -> bool:
    """Whether the ELF shared object at `path` has a .debug_info section: a debug build
    of pg_stride has one (`make test` installs such a build), a release build none."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    # section header: name offset at 0, file offset of its contents at 0x18
    names_at, = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        name_off, = struct.unpack_from("<I", data, shoff + i * shentsize)
        start = names_at + name_off
        if data[start:data.index(b"\0", start)] == b".debug_info":
            return True
    return False


class Server:
    """The PostgreSQL server under test (and pgbouncer in front of it, when asked)."""

    def __init__(self):
        server_data, server_out = _server_base()
        # A data directory per major: one initialised by another major does not start.
        self.pgdata = server_data / f"pgdata-{major_version()}"
        # bench/run's clean-up trap reads this to stop a server the runner could not stop
        (OUT / "pgdata.path").write_text(str(self.pgdata) + "\n")
        self.sock = socket_dir(server_out)
        self.logdir = server_out / "pglog"
        self.logdir.mkdir(parents=True, exist_ok=True)
        chown_server(self.logdir)
        self.bouncer_dir = server_out / "pgbouncer"
        (OUT / "pgbouncer.pid.path").write_text(str(self.bouncer_dir / "pgbouncer.pid") + "\n")
        self.bouncer_proc = None
        self.settings_name = None

    # ---- connection parameters -------------------------------------------------
    def conn_args(self, db: str, through_bouncer: bool = False,
                  role: str = SERVER_USER) -> list:
        port = BOUNCER_PORT if through_bouncer else PG_PORT
        return ["-h", str(self.sock), "-p", str(port), "-U", role, db]

    def app_conn_args(self, db: str, through_bouncer: bool = False) -> list:
        """How the measured queries connect: as the application role APP_ROLE."""
        return self.conn_args(db, through_bouncer, APP_ROLE)

    def ensure_app_role(self, grants: dict):
        """Creates APP_ROLE (LOGIN, no superuser) if missing, and gives it `grants`:
        database -> [(privileges, schema)], each on all tables of the schema."""
        self.psql(f"do $$ begin create role {APP_ROLE} login; "
                  "exception when duplicate_object then null; end $$")
        for db, rows in grants.items():
            for privileges, schema in rows:
                self.psql(f"grant usage on schema {schema} to {APP_ROLE}; "
                          f"grant {privileges} on all tables in schema {schema} "
                          f"to {APP_ROLE}", db=db)

    def psql(self, sql: str, db: str = "postgres", capture=True, check=True, quiet=True):
        cmd = [PG_BIN / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
               *self.conn_args(db), "-c", sql]
        res = run(cmd, capture=capture, check=check, quiet=quiet)
        return res.stdout.strip() if capture and res.stdout else ""

    def psql_file(self, path: Path, db: str):
        run([PG_BIN / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *self.conn_args(db),
             "-f", path], quiet=True)

    # ---- data directory ----------------------------------------------------------
    def ensure_initdb(self, base_settings: list):
        if not (self.pgdata / "PG_VERSION").exists():
            self.pgdata.mkdir(parents=True, exist_ok=True)
            chown_server(self.pgdata)
            os.chmod(self.pgdata, 0o700)
            log(f"initdb {self.pgdata}")
            run(as_server_user([PG_BIN / "initdb", "-D", self.pgdata, "-A", "trust", "-U",
                                SERVER_USER, "-E", "UTF8", "--locale=C", "--no-sync"]),
                capture=True)
        conf = self.pgdata / "postgresql.conf"
        text = conf.read_text()
        marker = "# pg_stride bench includes"
        if marker not in text:
            text += (f"\n{marker}\ninclude_if_exists = 'bench_base.conf'\n"
                     f"include_if_exists = 'bench_config.conf'\n")
            self._write(conf, text)
        self._write(self.pgdata / "bench_base.conf", "\n".join(base_settings) + "\n")

    def _write(self, path: Path, text: str):
        path.write_text(text)
        if IS_ROOT:
            import pwd
            pw = pwd.getpwnam(SERVER_USER)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    # ---- start / stop --------------------------------------------------------------
    def running(self) -> bool:
        res = run(as_server_user([PG_BIN / "pg_ctl", "-D", self.pgdata, "status"]),
                  check=False, capture=True, quiet=True)
        return res.returncode == 0

    def start(self, settings: list, name: str, renice: bool = False):
        """(Re)start the server with `settings` as bench_config.conf.  `renice` (root
        only): its processes get the CAP_SYS_NICE capability (ambient), so that a backend
        may lower its nice value back to 0 after raising it, or leave SCHED_IDLE (a
        pinned holder that another outranks enters it); the kernel refuses both to an ordinary process
        (raising RLIMIT_NICE instead would need CAP_SYS_RESOURCE, which containers often
        lack)."""
        if self.running():
            self.stop()
        auto = self.pgdata / "postgresql.auto.conf"
        if auto.exists():
            text, dropped = without_altered_settings(auto.read_text())
            if dropped:
                log(f"{auto}: dropped what ALTER SYSTEM set, which would override the "
                    f"configuration's settings: {'; '.join(dropped)}")
                self._write(auto, text)
        self._write(self.pgdata / "bench_config.conf",
                    f"# configuration {name}, written by bench/run\n" + "\n".join(settings) + "\n")
        logfile = self.logdir / f"server-{name}.log"
        log(f"starting PostgreSQL ({name})")
        pg_ctl = [PG_BIN / "pg_ctl", "-D", self.pgdata, "-l", logfile, "-w", "-t", "120", "-o",
                  f"-p {PG_PORT} -k {self.sock} -c listen_addresses=''", "start"]
        if renice:
            cmd = ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups",
                   "--inh-caps=+sys_nice", "--ambient-caps=+sys_nice", "--", *pg_ctl]
        else:
            cmd = as_server_user(pg_ctl)
        res = run(cmd, check=False, capture=True, quiet=True)
        if res.returncode != 0:
            tail = logfile.read_text()[-2000:] if logfile.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start with configuration {name}:\n{tail}")
        self.settings_name = name

    def stop(self):
        if self.running():
            log("stopping PostgreSQL")
            run(as_server_user([PG_BIN / "pg_ctl", "-D", self.pgdata, "-w", "-t", "60", "-m", "fast",
                                "stop"]), check=False, capture=True, quiet=True)
            if self.running():
                run(as_server_user([PG_BIN / "pg_ctl", "-D", self.pgdata, "-m", "immediate", "stop"]),
                    check=False, capture=True, quiet=True)

    @staticmethod
    def log_dir() -> Path:
        return _server_base()[1] / "pglog"

    def log_path(self) -> Path:
        return self.logdir / f"server-{self.settings_name}.log"

    def log_size(self) -> int:
        try:
            return self.log_path().stat().st_size
        except OSError:
            return 0

    def crashes_since(self, offset: int) -> list:
        """Server-log lines since `offset` that report a crashed server process."""
        try:
            with open(self.log_path(), errors="replace") as fh:
                fh.seek(offset)
                text = fh.read()
        except OSError:
            return []
        keys = ("terminated by signal", "PANIC", "exited with exit code", "was terminated")
        return [l.strip() for l in text.splitlines() if any(k in l for k in keys)][:5]

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n")[0])
        except (OSError, ValueError):
            return None

    # ---- pgbouncer -------------------------------------------------------------------
    def start_bouncer(self, pool_size: int, databases: list):
        self.stop_bouncer()
        d = self.bouncer_dir
        d.mkdir(parents=True, exist_ok=True)
        chown_server(d)
        auth = d / "userlist.txt"
        self._write(auth, f'"{SERVER_USER}" ""\n"{APP_ROLE}" ""\n')
        dbs = "\n".join(f"{db} = host={self.sock} port={PG_PORT} dbname={db}" for db in databases)
        ini = d / "pgbouncer.ini"
        self._write(ini, f"""[databases]
{dbs}

[pgbouncer]
listen_addr =
listen_port = {BOUNCER_PORT}
unix_socket_dir = {self.sock}
auth_type = trust
auth_file = {auth}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
max_db_connections = 0
server_reset_query =
server_check_delay = 30
ignore_startup_parameters = extra_float_digits
logfile = {d / 'pgbouncer.log'}
pidfile = {d / 'pgbouncer.pid'}
log_connections = 0
log_disconnections = 0
""")
        log(f"starting pgbouncer (pool_size={pool_size})")
        self.bouncer_proc = subprocess.Popen(as_server_user([PGBOUNCER, "-q", ini]),
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if (self.sock / f".s.PGSQL.{BOUNCER_PORT}").exists():
                return
            if self.bouncer_proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not start; see {d / 'pgbouncer.log'}")

    def bouncer_pid(self) -> int | None:
        try:
            return int((self.bouncer_dir / "pgbouncer.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop_bouncer(self):
        pid = self.bouncer_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        if self.bouncer_proc is not None:
            try:
                self.bouncer_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.bouncer_proc.kill()
            self.bouncer_proc = None
        elif pid:
            for _ in range(50):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.1)

    def shutdown(self):
        """Stop everything this runner started; safe to call more than once."""
        try:
            self.stop_bouncer()
        finally:
            self.stop()

    # ---- helpers used between runs ------------------------------------------------
    def prewarm(self, db: str, schemas: list):
        """Load every table and index of `schemas` into shared_buffers."""
        self.psql("create extension if not exists pg_prewarm", db=db)
        names = ",".join(f"'{s}'" for s in schemas)
        self.psql("select sum(pg_prewarm(c.oid)) from pg_class c join pg_namespace n "
                  f"on n.oid = c.relnamespace where n.nspname in ({names}) "
                  "and c.relkind in ('r', 'i')", db=db)

    def create_extension(self, db: str, name: str) -> bool:
        """CREATE EXTENSION IF NOT EXISTS `name` in `db`; False when it is not available."""
        cmd = [PG_BIN / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *self.conn_args(db),
               "-c", f"CREATE EXTENSION IF NOT EXISTS {name}"]
        return run(cmd, capture=True, check=False, quiet=True).returncode == 0

    def define_groups(self, groups: dict):
        """Defines pg_stride's resource groups `groups` (name -> {create_group argument:
        value}) afresh in `pg_stride.database` and waits until the server has loaded
        them as given."""
        db = self.psql("show pg_stride.database")
        self.psql("create extension if not exists pg_stride", db=db)

        def sql(v):
            return str(v).lower() if isinstance(v, bool) else repr(v)

        for name, args in groups.items():
            self.psql("select pg_stride.drop_group(name) from pg_stride.resource_groups "
                      f"where name = '{name}'", db=db)
            named = "".join(f", {k} => {sql(v)}" for k, v in args.items())
            self.psql(f"select pg_stride.create_group('{name}'{named})", db=db)
        # what a DBA grants an application role that picks its statements' group itself
        self.psql(f"grant set on parameter pg_stride.resource_group to {APP_ROLE}")
        want = " and ".join(f"exists (select from pg_stride.groups where name = '{name}'"
                            + "".join(f" and {k} = {sql(v)}" for k, v in args.items()) + ")"
                            for name, args in groups.items())
        deadline = time.monotonic() + 30
        while self.psql(f"select {want}", db=db) != "t":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not load the resource groups {groups}")
            time.sleep(0.2)

    def prediction_quality(self) -> dict | None:
        """pg_stride.prediction_quality's counts (since the server started), or None
        where the installed pg_stride has no such view."""
        if not self.guc_exists("pg_stride.predict"):
            return None
        db = self.psql("show pg_stride.database")
        out = self.psql("SELECT row_to_json(q) FROM pg_stride.prediction_quality q", db=db)
        return json.loads(out) if out else None

    def guc_exists(self, name: str) -> bool:
        out = self.psql(f"select count(*) from pg_settings where name = '{name}'")
        return out == "1"

    def cancel_all(self):
        self.psql("select count(pg_cancel_backend(pid)) from pg_stat_activity "
                  "where backend_type = 'client backend' and pid <> pg_backend_pid()", check=False)


# ---- CPU accounting -----------------------------------------------------------------

def _proc_stat(pid: int):
    """(ppid, utime+stime, cutime+cstime in seconds, command name), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); fields 4, 14..17 are ppid, utime, stime, cutime, cstime
    ppid = int(rest[1])
    own = (int(rest[11]) + int(rest[12])) / CLK_TCK
    children = (int(rest[13]) + int(rest[14])) / CLK_TCK
    return ppid, own, children, raw[raw.index("(") + 1:raw.rindex(")")]


def process_tree_cpu(root_pids: list) -> float:
    """CPU seconds used so far by each root process, its exited (reaped) children and its
    live children.  The postmaster reaps backends and parallel workers, so their time ends
    up in its cutime/cstime once they exit."""
    roots = {p for p in root_pids if p}
    total = 0.0
    for pid in roots:
        st = _proc_stat(pid)
        if st:
            total += st[1] + st[2]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _proc_stat(int(entry))
        if st and st[0] in roots:
            total += st[1]
    return total


def all_processes_cpu() -> dict:
    """pid -> (command name, ppid, CPU seconds used so far) of every process now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _proc_stat(int(entry))
        if st:
            out[int(entry)] = (st[3], st[0], st[1])
    return out


def others_cpu(before: dict, after: dict, server_roots: set, top: int = 5,
               children_s: float = 0.0) -> dict:
    """CPU seconds that processes outside the server (outside `server_roots` and their
    children) used between two all_processes_cpu() snapshots: in all, and the largest by
    command name with digits folded ("kworker/N:N"). A process started in between counts
    from 0; one that ended in between is missed, except this process's own children
    (pgbench, psql), whose CPU the caller passes as `children_s` (os.times())."""
    by_name = {"pgbench and psql (the bench's children)": children_s} if children_s else {}
    for pid, (name, ppid, cpu) in after.items():
        if pid in server_roots or ppid in server_roots:
            continue
        used = cpu - before[pid][2] if pid in before else cpu
        if used > 0:
            key = analysis.command_kind(name)
            by_name[key] = by_name.get(key, 0.0) + used
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1])
    return {"total_s": sum(by_name.values()),
            "top": [[name, round(s, 3)] for name, s in ranked[:top]]}


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for."""
    t = os.times()
    return t.children_user + t.children_system


def machine_cpu() -> tuple:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    parts = Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    vals = [int(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


class MachineSampler:
    """The whole machine's busy and total CPU jiffies (/proc/stat), sampled every
    `interval_s` in a thread with each sample's epoch time and written to `path` (CSV:
    epoch, busy, total) at the end: the busy share over any part of the interval can then
    be computed afterwards (`analysis.busy_between`), such as an open-loop point's measured
    window, which only its pgbench log gives. One small file read per sample."""

    def __init__(self, path: Path, interval_s: float = 0.5):
        self.path, self.interval_s = path, interval_s
        self.samples = []
        self.stop = threading.Event()

    def sample(self):
        self.samples.append((time.time(), *machine_cpu()))

    def run(self):
        while not self.stop.wait(self.interval_s):
            self.sample()

    def __enter__(self):
        self.sample()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.sample()
        self.path.write_text("epoch,busy,total\n" + "".join(
            f"{t:.3f},{b},{n}\n" for t, b, n in self.samples))
        return False


class CpuMeter:
    """Measures server CPU (cores busy) and whole-machine CPU over an interval."""

    def __init__(self, server: Server):
        self.server = server

    def __enter__(self):
        self.pids = [self.server.postmaster_pid(), self.server.bouncer_pid()]
        self.t0 = time.monotonic()
        self.cpu0 = process_tree_cpu(self.pids)
        self.m0 = machine_cpu()
        self.procs0 = all_processes_cpu()
        self.children0 = children_cpu()
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)  # let the postmaster reap the backends that just exited
        self.wall = time.monotonic() - self.t0
        self.server_cpu_s = process_tree_cpu(self.pids) - self.cpu0
        self.others = others_cpu(self.procs0, all_processes_cpu(), {p for p in self.pids if p},
                                 children_s=children_cpu() - self.children0)
        m1 = machine_cpu()
        busy, total = m1[0] - self.m0[0], m1[1] - self.m0[1]
        self.machine_busy = busy / total if total else 0.0
        return False

    def result(self) -> dict:
        n = ncpus()
        return {"wall_s": self.wall, "server_cpu_s": self.server_cpu_s,
                "server_cpu_util": self.server_cpu_s / self.wall / n if self.wall else 0.0,
                "machine_busy": self.machine_busy, "ncpus": n, "others": self.others}
