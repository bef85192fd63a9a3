#!/usr/bin/env python3
"""What pg_stride adds to a statement, counted in instructions: a machine-independent
companion to the overhead rounds of scheduling.py, whose tps and CPU-time ratios move
by several percent between runs on a shared virtual machine.

The server runs under valgrind's cachegrind (`--trace-children=yes`: every backend
forked by the postmaster is counted). One pgbench client sends N transactions; the
backend that served it is the process with the most instructions. Each workload runs
with N1 and N2 transactions, so that connection start-up cancels out:
instructions per transaction = (I(N2) - I(N1)) / (N2 - N1). Variants: library not
loaded, and loaded with every statement going through admission (an ordinary role,
exempt_superuser off). The loaded variant runs once more under callgrind, whose
inclusive counts give what admission itself costs: the instructions spent in
`pg_stride::admission::{admit, release, switch_group}` and everything they call.
Needs valgrind; takes a few minutes.

Writes bench/results/INSTRUCTIONS.md. Usage: bench/instructions.py
"""

import glob
import os
import shutil
import subprocess
import tempfile
import time

from scheduling import write_report

PGBIN = "/usr/lib/postgresql/15/bin"
PORT = 5495
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
ENV = {k: v for k, v in os.environ.items() if not k.startswith("RUST_")}
HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = (("not loaded", ""),
            ("loaded", "shared_preload_libraries = 'pg_stride'\npg_stride.exempt_superuser = off\n"))
WORKLOADS = (("pgbench -S (one primary-key SELECT)", ["-S"], 1000, 5000),
             ("pgbench TPC-B (5 statements)", [], 500, 2500))


def run(*args, **kw):
    return subprocess.run(AS_POSTGRES + list(args), env=ENV, check=True, **kw)


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pg_stride_instructions_")
        if AS_POSTGRES:
            shutil.chown(self.dir, "postgres")
        self.data = os.path.join(self.dir, "data")
        self.counts = os.path.join(self.dir, "counts")
        os.mkdir(self.counts)
        if AS_POSTGRES:
            shutil.chown(self.counts, "postgres")
        run(f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = ''\nunix_socket_directories = '{self.dir}'\nport = {PORT}\n"
                    "jit = off\nautovacuum = off\nsynchronous_commit = off\n"
                    "include_if_exists = 'variant.conf'\n")
        self.process = None

    def start(self, settings, valgrind, tool="cachegrind"):
        path = os.path.join(self.data, "variant.conf")
        with open(path, "w") as f:
            f.write(settings)
        if AS_POSTGRES:
            shutil.chown(path, "postgres")
        for old in glob.glob(os.path.join(self.counts, "*")):
            os.remove(old)
        options = ["--cache-sim=no"] if tool == "cachegrind" else []
        tool = ["valgrind", f"--tool={tool}", *options, "--trace-children=yes",
                f"--{tool}-out-file={self.counts}/%p"] if valgrind else []
        self.process = subprocess.Popen(AS_POSTGRES + tool + [f"{PGBIN}/postgres", "-D", self.data], env=ENV,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(120):
            if subprocess.run(AS_POSTGRES + [f"{PGBIN}/pg_isready", "-q", "-h", self.dir, "-p", str(PORT)],
                              env=ENV).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("the server did not start")

    def stop(self):
        run(f"{PGBIN}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", stdout=subprocess.DEVNULL)
        self.process.wait()

    def psql(self, sql):
        run(f"{PGBIN}/psql", "-X", "-q", "-h", self.dir, "-p", str(PORT), "-U", "postgres", "-d", "postgres",
            "-v", "ON_ERROR_STOP=1", "-c", sql, stdout=subprocess.DEVNULL)

    def pgbench(self, *args):
        run(f"{PGBIN}/pgbench", "-n", "-c", "1", "-M", "prepared", "-h", self.dir, "-p", str(PORT),
            "-U", "r_plain", *args, "postgres", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def busiest_backend(self):
        """Instructions of the process that executed the most (the pgbench backend), and
        its output file."""
        best = (0, None)
        for path in glob.glob(os.path.join(self.counts, "*")):
            with open(path) as f:
                for line in f:
                    if line.startswith(("summary:", "totals:")):
                        best = max(best, (int(line.split()[1]), path))
        return best


def admission_instructions(path):
    """Inclusive instructions of admission's entry points in a callgrind output file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = 0
    for line in out.splitlines():
        fields = line.split()
        if fields and any(line.rstrip().endswith(f) or f"{f} [" in line for f in ADMISSION_FUNCTIONS):
            total += int(fields[0].replace(",", ""))
    return total


# Admission's entry points, called once per statement; none calls another.
ADMISSION_FUNCTIONS = ("pg_stride::admission::admit", "pg_stride::admission::release",
                       "pg_stride::admission::switch_group")


def main():
    s = Server()
    results = {}
    try:
        s.start("", valgrind=False)
        run(f"{PGBIN}/pgbench", "-i", "-s", "1", "-q", "-h", s.dir, "-p", str(PORT), "-U", "postgres", "postgres",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s.psql("CREATE ROLE r_plain LOGIN; GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO r_plain")
        s.stop()
        for label, args, n1, n2 in WORKLOADS:
            for variant, settings in VARIANTS:
                counts = []
                for n in (n1, n2):
                    s.start(settings, valgrind=True)
                    s.pgbench(*args, "-t", str(n))
                    s.stop()
                    counts.append(s.busiest_backend()[0])
                results[(label, variant)] = (counts[1] - counts[0]) / (n2 - n1)
                print(f"{label}, {variant}: {results[(label, variant)]:.0f} instructions per transaction", flush=True)
            counts = []
            for n in (n1, n2):
                s.start(VARIANTS[1][1], valgrind=True, tool="callgrind")
                s.pgbench(*args, "-t", str(n))
                s.stop()
                counts.append(admission_instructions(s.busiest_backend()[1]))
            results[(label, "admission")] = (counts[1] - counts[0]) / (n2 - n1)
            print(f"{label}, admission: {results[(label, 'admission')]:.0f} instructions per transaction", flush=True)
    finally:
        if s.process and s.process.poll() is None:
            s.process.kill()
        shutil.rmtree(s.dir, ignore_errors=True)
    lines = ["# Instructions per transaction, pg_stride not loaded and loaded", "",
             f"Written by bench/instructions.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
             "valgrind cachegrind, one pgbench client, as an ordinary role (every statement "
             "goes through admission), release build. Admission: inclusive instructions of "
             "admission's entry points (`admit`, `release`, `switch_group`), from callgrind.", "",
             "| workload | not loaded | loaded | added | loaded / not loaded | admission | admission / not loaded |",
             "|---|---|---|---|---|---|---|"]
    for label, _, _, _ in WORKLOADS:
        a, b = results[(label, "not loaded")], results[(label, "loaded")]
        c = results[(label, "admission")]
        lines.append(f"| {label} | {a:.0f} | {b:.0f} | {b - a:+.0f} | {b / a:.3f} | {c:.0f} | {100 * c / a:.2f} % |")
    write_report(os.path.join(HERE, "results", "INSTRUCTIONS.md"), lines)


if __name__ == "__main__":
    main()
