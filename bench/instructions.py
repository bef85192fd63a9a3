#!/usr/bin/env python3
"""What pg_stride adds to a statement, counted in instructions: a machine-independent
companion to the overhead rounds of scheduling.py, whose tps and CPU-time ratios move
by several percent between runs on a shared virtual machine.

The server runs under valgrind's cachegrind (`--trace-children=yes`: every backend
forked by the postmaster is counted). One pgbench client sends N transactions; the
backend that served it is the process with the most instructions. Each workload runs
with N1 and N2 transactions, so that connection start-up cancels out:
instructions per transaction = (I(N2) - I(N1)) / (N2 - N1). Every run draws the same
accounts (one pgbench seed) and starts from the same copy of the data directory, so that
runs of the same library count nearly the same whatever their order. Variants: library not
loaded, and loaded with every statement going through admission (an ordinary role,
exempt_superuser off). The loaded variant runs once more under callgrind, whose
inclusive counts give what admission itself costs: the instructions spent in
`pg_stride::admission::{admit, release, switch_group}` and everything they call.
Needs valgrind; takes a few minutes.

A third workload counts a scan-heavy statement: count(*) over a table of 500
partitions (100,000 rows), run serially, which has 500 wrapped scans whose yield
points look their scan up for every row; for it the script also times both variants
without valgrind (pgbench -T, interleaved rounds).

With --cache-sim, cachegrind also simulates the first-level caches, and the report gives
the misses per transaction of each variant: instruction fetches (I1) and data reads and
writes (D1) that missed. On a path this short, a miss costs as much as tens of
instructions, so added code that runs cold at every statement costs more time than its
instruction count says (bench/results/oltp-overhead/README.md).

Writes bench/results/INSTRUCTIONS.md. Usage: bench/instructions.py [--only WORKLOAD…]
(select, tpcb, partitions) [--protocol prepared|extended|simple] [--cache-sim] [--out FILE]; PGBIN
(scripts/pg-env) picks the server.
"""

import argparse

import glob
import os
import shutil
import subprocess
import sys
import time

from scheduling import write_report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import pgserver  # noqa: E402
from pgserver import AS_POSTGRES, PGBIN  # noqa: E402

PORT = 5495
HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = (("not loaded", ""),
            ("loaded", "shared_preload_libraries = 'pg_stride'\npg_stride.exempt_superuser = off\n"))
PARTITIONS_SCRIPT = "partitions.sql"
WORKLOADS = (("pgbench -S (one primary-key SELECT)", ["-S"], 1000, 5000),
             ("pgbench TPC-B (5 statements)", [], 500, 2500),
             ("count(*) over 500 partitions, serial", ["-f", PARTITIONS_SCRIPT], 5, 25))
KEYS = {"select": WORKLOADS[0], "tpcb": WORKLOADS[1], "partitions": WORKLOADS[2]}
# pgbench's query mode (--protocol): prepared, as in most overhead figures, or simple, as
# an application that sends its statements as text (each one parsed, analysed and planned).
PROTOCOL = "prepared"
# Whether cachegrind simulates the caches (--cache-sim): slower, and adds the misses.
CACHE_SIM = False
# The simulated caches' miss counts that the report gives, as cachegrind names them:
# first-level instruction-fetch, data-read and data-write misses.
MISSES = ("I1mr", "D1mr", "D1mw")


class Server(pgserver.Server):
    """pylib/pgserver.py's server, started by hand (under valgrind or not) with each
    variant's settings in variant.conf; valgrind's files go to `counts`."""

    def __init__(self):
        super().__init__(PORT, prefix="pg_stride_instructions_")
        self.counts = os.path.join(self.dir, "counts")
        os.mkdir(self.counts)
        if AS_POSTGRES:
            shutil.chown(self.counts, "postgres")
        self.initdb("jit = off\nautovacuum = off\nsynchronous_commit = off\ninclude_if_exists = 'variant.conf'\n")
        self.process = None

    def start(self, settings, valgrind, tool="cachegrind"):
        self.script(os.path.join("data", "variant.conf"), settings)
        for old in glob.glob(os.path.join(self.counts, "*")):
            os.remove(old)
        options = [f"--cache-sim={'yes' if CACHE_SIM else 'no'}"] if tool == "cachegrind" else []
        tool = ["valgrind", f"--tool={tool}", *options, "--trace-children=yes",
                f"--{tool}-out-file={self.counts}/%p"] if valgrind else []
        self.process = subprocess.Popen(AS_POSTGRES + tool + [f"{PGBIN}/postgres", "-D", self.data], env=self.env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(120):
            if self.run(f"{PGBIN}/pg_isready", "-q", "-h", self.dir, "-p", str(self.port)).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("the server did not start")

    def stop(self):
        """Stops the server for the next variant (stop_server removes it)."""
        self.pg_ctl("-m", "fast", "-w", "stop", check=True, stdout=subprocess.DEVNULL)
        self.process.wait()

    def pgbench(self, *args, **kw):
        args = [os.path.join(self.dir, a) if a == PARTITIONS_SCRIPT else a for a in args]
        # One seed: every run draws the same accounts, so runs differ by what pg_stride
        # does and not by which rows they touched.
        return self.run(f"{PGBIN}/pgbench", "-n", "-c", "1", "-M", PROTOCOL, "--random-seed=1", "-h", self.dir,
                        "-p", str(self.port), "-U", "r_plain", *args, "postgres",
                        check=True, stderr=subprocess.DEVNULL, **kw)

    def busiest_backend(self):
        """The totals (`event_totals`) of the process that executed the most
        instructions (the pgbench backend), and its output file."""
        best = ({}, None)
        for path in glob.glob(os.path.join(self.counts, "*")):
            events = event_totals(path)
            if events.get("Ir", 0) > best[0].get("Ir", 0):
                best = (events, path)
        return best


def event_totals(path):
    """A valgrind output file's totals by event name ({"Ir": …, "I1mr": …}), or {}."""
    names = []
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                return dict(zip(names, map(int, line.split()[1:])))
    return {}


def inclusive_instructions(path, functions):
    """Inclusive instructions of `functions` in a callgrind output file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = 0
    for line in out.splitlines():
        fields = line.split()
        if fields and any(line.rstrip().endswith(f) or f"{f} [" in line for f in functions):
            total += int(fields[0].replace(",", ""))
    return total


# Admission's entry points, called once per statement; none calls another.
ADMISSION_FUNCTIONS = ("pg_stride::admission::admit", "pg_stride::admission::release",
                       "pg_stride::admission::let_waiters_in",
                       "pg_stride::admission::switch_group")
# What a backend does for runaway-query rules (the scheduler worker checks them): it
# publishes its rows at yield points and looks for a cancel or a move at check-ins.
RULE_FUNCTIONS = ("pg_stride::cpu::runaway::publish_rows", "pg_stride::cpu::runaway::cancel_if_a_rule_says_so",
                  "pg_stride::cpu::runaway::move_if_a_rule_says_so")
# The prediction of a statement's CPU: at the join of a statement that reaches a
# check-in, at its end, and at the start of a plan with a Gather.
PREDICTION_FUNCTIONS = ("pg_stride::cpu::prediction::predict", "pg_stride::cpu::prediction::record",
                        "pg_stride::parallel::predicted_short")
# PostgreSQL computing the query identifier that keys the prediction (pg_stride asks for
# it as pg_stat_statements does): at parse analysis, so once per PREPARE with -M prepared.
QUERY_ID_FUNCTIONS = ("JumbleQuery",)
# The walk of a plan for the memory it reserves, once per statement while a memory
# budget is set.
MEMORY_FUNCTIONS = ("pg_stride::plan_tree::memory::need_kb",)


def per_transaction(s, settings, args, n1, n2, *function_sets):
    """Inclusive instructions of each of `function_sets` per transaction, from callgrind
    runs of n1 and n2 transactions with `settings`."""
    counts = []
    for n in (n1, n2):
        path = counted_run(s, settings, args, n, "callgrind")[1]
        counts.append([inclusive_instructions(path, functions) for functions in function_sets])
    return [(b - a) / (n2 - n1) for a, b in zip(*counts)]


def tps(s, settings, args, seconds=5):
    """Transactions per second of `args` with `settings`: one round of `seconds`."""
    s.start(settings, valgrind=False)
    try:
        out = s.pgbench(*args, "-T", str(seconds), stdout=subprocess.PIPE, text=True).stdout
    finally:
        s.stop()
    return float(next(l for l in out.splitlines() if l.startswith("tps")).split()[2])


def timing(s, args, variants=VARIANTS, rounds=5):
    """Median tps of each of the two variants over interleaved rounds (A B B A …), and
    the median of the per-round ratios second / first."""
    runs = {v: [] for v, _ in variants}
    for i in range(rounds):
        order = variants if i % 2 == 0 else variants[::-1]
        for variant, settings in order:
            runs[variant].append(tps(s, settings, args))
    first, second = (runs[v] for v, _ in variants)
    ratios = sorted(b / a for a, b in zip(first, second))
    median = lambda xs: sorted(xs)[len(xs) // 2]
    return median(first), median(second), ratios[len(ratios) // 2]


def timing_table(workloads, results, first, second, ratio):
    """The report's lines for the workloads that were also timed (`results[(label,
    "timing")]` from `timing`), their columns named after the two variants."""
    timed = [(label, results[(label, "timing")]) for label, _, _, _ in workloads if (label, "timing") in results]
    if not timed:
        return []
    lines = ["", "Time, without valgrind: pgbench -T 5, 5 interleaved rounds per variant, medians.", "",
             f"| workload | tps {first} | tps {second} | {ratio} (median of rounds) |",
             "|---|---|---|---|"]
    for label, (a, b, r) in timed:
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {r:.3f} |")
    return lines


def misses_table(workloads, results):
    """The report's lines for the simulated first-level cache misses per transaction,
    not loaded and loaded (`results[(label, variant, "misses")]`)."""
    lines = ["", "First-level cache misses per transaction (cachegrind's simulated caches, the same "
             "runs): instruction fetches (I1), data reads and data writes (D1) that missed, not "
             "loaded → loaded (ratio).", "",
             "| workload | " + " | ".join(MISSES) + " |", "|---|" + "---|" * len(MISSES)]
    for label, _, _, _ in workloads:
        a, b = results[(label, "not loaded", "misses")], results[(label, "loaded", "misses")]
        lines.append(f"| {label} | " + " | ".join(
            f"{a[k]:.0f} → {b[k]:.0f} ({b[k] / a[k]:.3f})" if a[k] else f"{a[k]:.0f} → {b[k]:.0f}"
            for k in MISSES) + " |")
    return lines


def restore(s):
    """Puts back the data directory `prepare` left (its copy in `data.template`), so that
    every run starts from the same tables, byte for byte, whatever ran before: TPC-B
    updates its few branch and teller rows thousands of times and appends to its history,
    and a later run on that state counts over a thousand more instructions per
    transaction than an earlier one with the same library."""
    s.run("rm", "-rf", s.data, check=True)
    s.run("cp", "-a", s.data + ".template", s.data, check=True)


def counted_run(s, settings, args, n, tool="cachegrind"):
    """Runs `args` for n transactions with `settings` under valgrind's `tool`, from the
    prepared data directory; returns the busiest backend's totals and output file."""
    restore(s)
    s.start(settings, valgrind=True, tool=tool)
    s.pgbench(*args, "-t", str(n))
    s.stop()
    totals, path = s.busiest_backend()
    if path is None:
        raise RuntimeError(f"valgrind wrote no counts into {s.counts}")
    return totals, path


def instructions_per_transaction(s, settings, args, n1, n2):
    """Instructions of the busiest backend per transaction of `args`: the difference
    between runs of n1 and n2 transactions, so that connection start-up cancels out;
    with CACHE_SIM, also the MISSES per transaction (else None)."""
    first, second = (counted_run(s, settings, args, n)[0] for n in (n1, n2))
    per = {k: (second[k] - first[k]) / (n2 - n1) for k in second if k in first}
    return per["Ir"], ({k: per[k] for k in MISSES} if CACHE_SIM else None)


def prepare(s):
    """pgbench's tables at scale 1, the 500-partition table, the ordinary role and the
    partitions script, in a fresh data directory."""
    s.start("", valgrind=False)
    s.run(f"{PGBIN}/pgbench", "-i", "-s", "1", "-q", "-h", s.dir, "-p", str(s.port), "-U", "postgres", "postgres",
          check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s.sql("CREATE TABLE parts (id int, v int) PARTITION BY RANGE (id); "
          "DO $$ BEGIN FOR i IN 0..499 LOOP EXECUTE format("
          "'CREATE TABLE parts_%s PARTITION OF parts FOR VALUES FROM (%s) TO (%s)', "
          "i, i * 200, (i + 1) * 200); END LOOP; END $$")
    s.sql("INSERT INTO parts SELECT g, g % 7 FROM generate_series(0, 99999) g")
    s.sql("VACUUM ANALYZE parts")
    s.sql("CREATE ROLE r_plain LOGIN; GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO r_plain; "
          "ALTER ROLE r_plain SET max_parallel_workers_per_gather = 0")
    s.script(PARTITIONS_SCRIPT, "SELECT count(*) FROM parts WHERE v >= 0;\n")
    s.sql("VACUUM ANALYZE")
    s.sql("CHECKPOINT")
    s.stop()
    s.run("cp", "-a", s.data, s.data + ".template", check=True)


def stop_server(s):
    """Stops the server if it still runs (after a failure) and removes its directory."""
    if s.process and s.process.poll() is None:
        # The process is runuser (as root): stop the server itself.
        s.pg_ctl("-m", "immediate", "stop", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s.process.kill()
    shutil.rmtree(s.dir, ignore_errors=True)


def server_version():
    version = subprocess.run([f"{PGBIN}/postgres", "--version"], capture_output=True, text=True).stdout.strip()
    return version.replace("postgres (PostgreSQL) ", "PostgreSQL ")


def main():
    global PROTOCOL, CACHE_SIM
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", choices=sorted(KEYS), default=sorted(KEYS))
    parser.add_argument("--out", default=os.path.join(HERE, "results", "INSTRUCTIONS.md"))
    parser.add_argument("--also", metavar="SETTINGS",
                        help="measure a third variant: loaded, with these postgresql.conf lines "
                             "(e.g. \"pg_stride.memory_budget = '8GB'\")")
    parser.add_argument("--protocol", choices=("prepared", "extended", "simple"), default=PROTOCOL,
                        help="pgbench's query mode (default prepared)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate the first-level caches and report their misses")
    options = parser.parse_args()
    PROTOCOL = options.protocol
    CACHE_SIM = options.cache_sim
    variants = VARIANTS
    if options.also:
        variants += (("loaded + " + options.also.replace("\n", ", "),
                      VARIANTS[1][1] + options.also.replace("\\n", "\n") + "\n"),)
    workloads = [w for w in WORKLOADS if any(KEYS[k] is w for k in options.only)]
    s = Server()
    results = {}
    try:
        prepare(s)
        for label, args, n1, n2 in workloads:
            for variant, settings in variants:
                results[(label, variant)], results[(label, variant, "misses")] = \
                    instructions_per_transaction(s, settings, args, n1, n2)
                print(f"{label}, {variant}: {results[(label, variant)]:.0f} instructions per transaction", flush=True)
            (results[(label, "admission")], results[(label, "rules")],
             results[(label, "prediction")], results[(label, "query id")]) = per_transaction(
                s, VARIANTS[1][1], args, n1, n2, ADMISSION_FUNCTIONS, RULE_FUNCTIONS,
                PREDICTION_FUNCTIONS, QUERY_ID_FUNCTIONS)
            print(f"{label}, admission: {results[(label, 'admission')]:.0f}, rule checks: "
                  f"{results[(label, 'rules')]:.0f}, prediction: {results[(label, 'prediction')]:.0f}, "
                  f"query id: {results[(label, 'query id')]:.0f} instructions per transaction",
                  flush=True)
            for variant, settings in variants[2:]:
                (results[(label, variant, "memory")],) = per_transaction(
                    s, settings, args, n1, n2, MEMORY_FUNCTIONS)
                print(f"{label}, {variant}, memory walk: "
                      f"{results[(label, variant, 'memory')]:.0f} instructions per transaction", flush=True)
            if args[:1] == ["-f"]:
                results[(label, "timing")] = timing(s, args)
                print(f"{label}, tps not loaded / loaded / ratio: {results[(label, 'timing')]}", flush=True)
    finally:
        stop_server(s)
    version = server_version()
    lines = ["# Instructions per transaction, pg_stride not loaded and loaded", "",
             f"Written by bench/instructions.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
             f"against {version}: "
             f"valgrind cachegrind, one pgbench client (query mode {PROTOCOL}), as an ordinary role (every statement "
             "goes through admission), release build. Admission: inclusive instructions of "
             "admission's entry points (`admit`, `release`, `switch_group`), from callgrind. "
             "Rule checks: inclusive instructions of what a backend does for runaway-query rules "
             "(`pg_stride::cpu::runaway`: publishing its rows, looking for a cancel or a move), "
             "prediction: what a backend does to predict a statement's CPU and record what it "
             "used (`pg_stride::cpu::prediction`, `parallel::predicted_short`), query id: "
             "PostgreSQL's `JumbleQuery`, which pg_stride has run as pg_stat_statements does "
             "(at parse analysis: once per PREPARE in query mode prepared, once per statement "
             "otherwise), all from the same "
             "callgrind runs.", "",
             "| workload | not loaded | loaded | added | loaded / not loaded | admission | admission / not loaded "
             "| rule checks | prediction | query id |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, _, _, _ in workloads:
        a, b = results[(label, "not loaded")], results[(label, "loaded")]
        c, r = results[(label, "admission")], results[(label, "rules")]
        p, q = results[(label, "prediction")], results[(label, "query id")]
        lines.append(f"| {label} | {a:.0f} | {b:.0f} | {b - a:+.0f} | {b / a:.3f} | {c:.0f} | {100 * c / a:.2f} % "
                     f"| {r:.0f} | {p:.0f} | {q:.0f} |")
    for variant, _ in variants[2:]:
        lines += ["", f"With {variant}:", "",
                  "| workload | loaded | this variant | added | memory walk (callgrind) |",
                  "|---|---|---|---|---|"]
        for label, _, _, _ in workloads:
            b, d = results[(label, "loaded")], results[(label, variant)]
            m = results[(label, variant, "memory")]
            lines.append(f"| {label} | {b:.0f} | {d:.0f} | {d - b:+.0f} | {m:.0f} |")
    if CACHE_SIM:
        lines += misses_table(workloads, results)
    lines += timing_table(workloads, results, "not loaded", "loaded", "loaded / not loaded")
    write_report(options.out, lines)


if __name__ == "__main__":
    main()
