#!/usr/bin/env python3
"""pg_stride's overhead on OLTP statements, measured side by side: two servers, one with the library
loaded and one without, take turns on the whole machine in one-second slots.

Why this way. On a shared virtual machine the throughput of one configuration moves by
±10 % between rounds a minute apart, more than the overhead to be measured. Running
both servers at the same time does not cure it: two identical servers then differ by
up to ±5 % too. What was found: that difference is fixed when a server starts (where
its shared memory lands), and within one start two identical servers whose clients
take turns in one-second slots agree to about 1 %. So each round restarts both
servers and compares them in interleaved slots, and the per-start differences average
out over many short rounds; with `huge_pages` the per-start spread is about half as
large (it is `try` here; reserve pages with `sysctl vm.nr_hugepages`, 1100 for the two
1 GB buffer pools, for the tighter figure — the report says which it had).

Each round: both servers restarted with their settings and pgbench's tables and
indexes read into shared buffers (pg_prewarm); pgbench with 8 clients on each (TPC-B,
or select-only: one primary-key SELECT per transaction), as an ordinary role so that
every statement goes through admission, the side with the first slot connecting
first; 3 s in which both run (connections, caches), then the two pgbench processes take turns, one
resumed (SIGCONT) for a slot while the other is stopped (SIGSTOP), in the order
A B B A A B B A … so that neither is favoured by its position, until each had SECONDS
of slots. A side's rate: the transactions that ended inside its slots (pgbench's
per-transaction log) divided by the length of its slots. The round's ratio: loaded /
not loaded. Rounds alternate which server is loaded and which side has the first
slot (each in half of every four rounds); an A/A series (neither loaded) in the same run shows the method's own spread.

`--within-start` measures what the two-server series cannot tell apart from the
per-start spread: the cost of pg_stride's mechanisms (admission, the tiny-statement
bypass, the hooks' work), with no server start between the sides. One server, pg_stride
loaded, two databases with their own pgbench tables (TPC-B's two sides write one each,
so that a stopped client's row locks never block the other side; select-only's both
read the first) and two roles: `r_on`, and `r_off` with
`ALTER ROLE r_off SET pg_stride.enabled = off`, whose statements pass straight through
every hook. Each round restarts the server, and the two roles' pgbench take turns as
above; rounds alternate which side goes first, and TPC-B's the databases. Ratio: enabled /
disabled. What is left of the overhead, a disabled library's hooks passing statements
on, is counted exactly by bench/instructions.py.

Writes bench/results/OVERHEAD_AB.md (`--within-start`: OVERHEAD_WITHIN_START.md). Usage:
bench/overhead_ab.py [--within-start] [--rounds N] [--seconds S] [--workloads tpcb,select]
(defaults 12, 60 and both; rounds are rounded up to a multiple of 4, A/A has half as
many, at least 4). Every slot's rate goes to bench/out/overhead_*_slots.json.
"""

import bisect
import glob
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from scheduling import ENV, PGBIN, Server, write_report
from stride_bench import analysis

HERE = os.path.dirname(os.path.abspath(__file__))
# Rounds come in fours, so that each side has the first slot (and connects first) in
# half of them, in both orders of the databases (see series, series_within_start).
ROUNDS = -(-int(sys.argv[sys.argv.index("--rounds") + 1] if "--rounds" in sys.argv else 12) // 4) * 4
AA_ROUNDS = max(4, -(-(ROUNDS // 2) // 4) * 4)
SECONDS = int(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 60
# pgbench's arguments for each workload, and whether it only reads.
WORKLOADS = {"tpcb": ("TPC-B", [], False), "select": ("select-only", ["-S"], True)}
CHOSEN = (sys.argv[sys.argv.index("--workloads") + 1].split(",") if "--workloads" in sys.argv
          else list(WORKLOADS))
WITHIN_START = "--within-start" in sys.argv
SLOT_S = 1.0
WARMUP_S = 3.0
STOCK = ["huge_pages = try"]
LOADED = STOCK + ["shared_preload_libraries = 'pg_stride'", "pg_stride.exempt_superuser = off"]
# --within-start: the two databases, and the roles whose sessions have pg_stride on and off.
DATABASES = ["ab0", "ab1"]
ON, OFF = "r_on", "r_off"


def pgbench_tables(server, db, roles):
    """pgbench's tables at scale 10 in `db`, readable and writable by `roles`."""
    server.run(f"{PGBIN}/pgbench", "-i", "-s", "10", "-q", "-h", server.dir, "-p", str(server.port),
               "-U", "postgres", db, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.sql(f"GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO {', '.join(roles)}",
               db=db)
    server.sql("VACUUM ANALYZE", db=db)
    server.sql("CREATE EXTENSION pg_prewarm", db=db)


def prewarm(server, db):
    """Reads pgbench's tables and indexes in `db` into shared buffers: after a restart
    they are cold, and a round's first slots would otherwise run slower than its last
    (select-only's first four ran at 42,900, 35,000, 49,800 and 56,700 transactions
    per second in one round)."""
    server.sql("SELECT sum(pg_prewarm(oid)) FROM pg_class "
               "WHERE relname LIKE 'pgbench\\_%' AND relkind IN ('r', 'i')", db=db)


def prepare(server):
    server.restart(STOCK)
    server.sql("CREATE ROLE r_plain LOGIN")
    pgbench_tables(server, "postgres", ["r_plain"])


def prepare_within_start(server):
    server.restart(LOADED)
    server.sql(f"CREATE ROLE {ON} LOGIN; CREATE ROLE {OFF} LOGIN; "
               f"ALTER ROLE {OFF} SET pg_stride.enabled = off")
    for db in DATABASES:
        server.sql(f"CREATE DATABASE {db}")
        pgbench_tables(server, db, [ON, OFF])
    # The comparison rests on the role setting reaching pgbench's sessions.
    seen = [server.sql("SHOW pg_stride.enabled", user=user, db=DATABASES[0]) for user in (ON, OFF)]
    if seen != ["on", "off"]:
        raise RuntimeError(f"pg_stride.enabled is {seen} for {ON}, {OFF}, not on, off")


def start_pgbench(server, seconds, log_prefix, workload, user="r_plain", db="postgres"):
    """pgbench running `workload` (pgbench arguments) as `user` in `db`, 8 clients,
    logging every transaction. Started directly (not through runuser), so that the
    signals below reach pgbench itself."""
    cmd = [f"{PGBIN}/pgbench", "-n", *workload, "-h", server.dir, "-p", str(server.port), "-U", user,
           "-c", "8", "-j", "1", "-M", "prepared", "-T", str(seconds), "-l", f"--log-prefix={log_prefix}",
           db]
    return subprocess.Popen(cmd, env=ENV, cwd=os.path.dirname(log_prefix), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def end_times(log_prefix):
    """When each logged transaction ended (epoch seconds), sorted."""
    times = []
    for path in glob.glob(log_prefix + ".*"):
        with open(path) as f:
            for line in f:
                fields = line.split()
                times.append(int(fields[4]) + int(fields[5]) / 1e6)
    return sorted(times)


class Round:
    """One round's slot rates, side 0 against side 1 (`take_turns`)."""

    def __init__(self, slot_rates):
        self.slot_rates = slot_rates

    def ratio(self, slots=slice(None)):
        """Side 0's transactions per second of slot time over side 1's, over `slots`
        (all slots are of equal length)."""
        return (statistics.fmean(self.slot_rates[0][slots]) /
                statistics.fmean(self.slot_rates[1][slots]))

    def halves(self):
        half = len(self.slot_rates[0]) // 2
        return self.ratio(slice(None, half)), self.ratio(slice(half, None))


def rate(times, slots):
    done = sum(bisect.bisect_left(times, end) - bisect.bisect_left(times, start) for start, end in slots)
    return done / sum(end - start for start, end in slots)


def take_turns(sides, first, workload):
    """Both sides' pgbench (a side: (server, user, database)), taking turns in slots,
    side `first` in the first one. Returns each side's transactions per second in each
    of its slots; the k-th slots of the two sides are next to each other in time."""
    work = tempfile.mkdtemp(prefix="pg_stride_overhead_")
    runs = [None, None]
    # select-only's two sides read one database: prewarmed and vacuumed once.
    databases = {(server, db) for server, _, db in sides}
    try:
        prefixes = [os.path.join(work, f"side{i}") for i in range(2)]
        for server, db in databases:
            prewarm(server, db)
        # Long enough to outlast the slots; checked below.
        total = WARMUP_S + 2 * SECONDS + 3
        # The side with the first slot also connects first: which side's clients start
        # first then alternates with it from round to round (one run's A/A series put
        # the side started first 1.2 % behind in six rounds of six).
        for i in (first, 1 - first):
            server, user, db = sides[i]
            runs[i] = start_pgbench(server, math.ceil(total), prefixes[i], workload, user, db)
        time.sleep(WARMUP_S)
        for run in runs:
            os.kill(run.pid, signal.SIGSTOP)
        slots = ([], [])
        side = first
        for i in range(2 * round(SECONDS / SLOT_S)):
            os.kill(runs[side].pid, signal.SIGCONT)
            start = time.time()
            time.sleep(SLOT_S)
            end = time.time()
            os.kill(runs[side].pid, signal.SIGSTOP)
            slots[side].append((start, end))
            if i % 2 == 0:
                side = 1 - side
        if any(run.poll() is not None for run in runs):
            raise RuntimeError("a pgbench ended before its last slot")
        # Both finish their -T together; what they do now lies outside every slot.
        for run in runs:
            os.kill(run.pid, signal.SIGCONT)
        for run in runs:
            out, err = run.communicate()
            if run.returncode != 0:
                raise RuntimeError(out + err)
        times = [end_times(prefix) for prefix in prefixes]
        return [[rate(t, [slot]) for slot in side_slots] for t, side_slots in zip(times, slots)]
    finally:
        # After an error a pgbench may still run, or sit stopped: end it (SIGKILL ends a
        # stopped process too), so that no client is left behind.
        for run in runs:
            if run is not None and run.poll() is None:
                run.kill()
                run.wait()
        shutil.rmtree(work, ignore_errors=True)
        # Keep the tables from growing apart: both sides get the same clean-up.
        for server, db in databases:
            server.sql("VACUUM pgbench_branches, pgbench_tellers", db=db)


def round_rates(servers, settings, first, workload):
    """One round with servers[i] running settings[i]; side `first` has the first slot."""
    for server, conf in zip(servers, settings):
        server.restart(conf)
    return Round(take_turns([(server, "r_plain", "postgres") for server in servers], first, workload))


def show(name, i, r, note):
    first_half, second_half = r.halves()
    print(f"{name} round {i + 1}: {r.ratio():.3f} (halves {first_half:.3f}, {second_half:.3f};"
          f" {note})", flush=True)


def series(servers, rounds, name, variant, workload):
    """`rounds` rounds, the variant on servers[0] in even rounds and on servers[1] in odd
    ones; the variant's side has the first slot in the first two rounds of every four. Returns
    the rounds, each as variant / stock, printing each."""
    out = []
    for i in range(rounds):
        mine = i % 2
        settings = (variant, STOCK) if mine == 0 else (STOCK, variant)
        first = mine if (i // 2) % 2 == 0 else 1 - mine
        r = round_rates(servers, settings, first, workload)
        out.append(Round(r.slot_rates[::-1] if mine else r.slot_rates))
        show(name, i, out[-1], f"{name} side {'first' if first == mine else 'second'}")
    return out


def series_within_start(server, rounds, name, users, workload, reads_only):
    """`rounds` rounds on one server restarted before each, `users[0]` against
    `users[1]`; users[0]'s side has the first slot in the first two rounds of every
    four. A workload that writes gives each side a database of its own (a stopped
    client's row locks must not hold up the other side): users[0] in the first one in
    even rounds and in the second in odd ones. A read-only workload has both sides read
    the same tables, so that no difference between two copies of them enters the ratio.
    Returns the rounds, each as users[0] / users[1], printing each."""
    out = []
    for i in range(rounds):
        if reads_only:
            dbs = [DATABASES[0]] * 2
        else:
            dbs = DATABASES if i % 2 == 0 else DATABASES[::-1]
        first = 0 if (i // 2) % 2 == 0 else 1
        server.restart(LOADED)
        out.append(Round(take_turns([(server, users[0], dbs[0]), (server, users[1], dbs[1])],
                                    first, workload)))
        show(name, i, out[-1], f"{users[0]} in {dbs[0]}, {'first' if first == 0 else 'second'}")
    return out


def half_correlation(rounds):
    """Pearson correlation, over the rounds, of the log ratio of a round's first half of
    slots with that of its second half. Near 0: the rounds' spread is noise from slot to
    slot, which longer rounds average out. Near 1: each round carries a deviation of its
    own for its whole length (fixed at its start: where its backends run, what memory
    they got), which only more rounds average out."""
    if len(rounds) < 3:
        return float("nan")
    a, b = zip(*[(math.log(h0), math.log(h1)) for h0, h1 in (r.halves() for r in rounds)])
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:  # a half the same in every round
        return float("nan")


def summary(ratios):
    """Geometric mean with its 95 % confidence interval (t on the log ratios), median,
    range."""
    mean, low, high = analysis.ratio_interval(ratios)
    return (f"geometric mean {mean:.3f} (95 % CI {low:.3f}–{high:.3f}), "
            f"median {statistics.median(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f}")


def row(label, series_name, rounds):
    """The report's row for a series: each round's ratio over all its slots, their
    summary, and the halves' correlation."""
    ratios = [r.ratio() for r in rounds]
    return (f"| {label} | {series_name} | {len(rounds)} | {', '.join(f'{x:.3f}' for x in ratios)} | "
            f"{summary(ratios)} | {half_correlation(rounds):.2f} |")


TABLE_HEAD = [
    "The last column: over the rounds, the correlation of a round's ratio over the first half "
    "of its slots with its ratio over the second half. Near 0, a round's deviation comes from "
    "slot to slot, and longer rounds narrow the interval as much as more rounds do; near 1, "
    "something fixed for a whole round (where its processes run, its database, which side went "
    "first) moves it, and only more rounds narrow the interval. From few rounds it is a rough "
    "guide.", "",
    "| workload | series | rounds | per-round ratios | summary | halves' correlation |",
    "|---|---|---|---|---|---|"]


def dump(rows_of_rounds, name):
    """Every slot's rate, for a look at the rounds beyond the report (bench/out)."""
    out = os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        json.dump({key: [r.slot_rates for r in rounds] for key, rounds in rows_of_rounds.items()}, f)


def huge_pages_reserved():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("HugePages_Total:"):
                return int(line.split()[1])
    return 0


def main_within_start():
    server = Server(port=5496)
    huge = huge_pages_reserved()
    rows, kept = [], {}
    try:
        prepare_within_start(server)
        for key in CHOSEN:
            label, workload, reads_only = WORKLOADS[key]
            aa = series_within_start(server, AA_ROUNDS, f"{key} off/off", [OFF, OFF],
                                     workload, reads_only)
            ab = series_within_start(server, ROUNDS, f"{key} on/off", [ON, OFF], workload, reads_only)
            kept[f"{key} off/off"], kept[f"{key} on/off"] = aa, ab
            dump(kept, "overhead_within_start_slots.json")
            rows += [row(label, "A/A: both disabled (calibration)", aa),
                     row(label, "enabled / disabled", ab)]
    finally:
        server.stop()
    lines = ["# OLTP overhead of pg_stride's mechanisms, within one server start", "",
             f"Written by bench/overhead_ab.py --within-start on "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, {huge} huge "
             f"pages reserved: one server with pg_stride loaded, restarted every round, pgbench "
             f"(8 clients, prepared statements) as `{ON}` (pg_stride on) and as `{OFF}` "
             f"(`pg_stride.enabled = off` for the role: every hook passes statements straight on), "
             f"taking turns in {SLOT_S:.0f}-s slots (A B B A …) until each had "
             f"{SECONDS} s; select-only's two sides read the same tables, TPC-B's sides write tables of "
             f"their own. Ratio: transactions per second of slot time, one side / the other.", "",
             *TABLE_HEAD, *rows]
    write_report(os.path.join(HERE, "results", "OVERHEAD_WITHIN_START.md"), lines)


def main():
    if WITHIN_START:
        return main_within_start()
    servers = [Server(port=5496), Server(port=5497)]
    huge = huge_pages_reserved()
    rows, kept = [], {}
    try:
        for server in servers:
            prepare(server)
        for key in CHOSEN:
            label, workload, _ = WORKLOADS[key]
            aa = series(servers, AA_ROUNDS, f"{key} stock", STOCK, workload)
            ab = series(servers, ROUNDS, f"{key} loaded", LOADED, workload)
            kept[f"{key} stock"], kept[f"{key} loaded"] = aa, ab
            dump(kept, "overhead_ab_slots.json")
            rows += [row(label, "A/A: neither loaded (calibration)", aa),
                     row(label, "loaded / not loaded", ab)]
    finally:
        for server in servers:
            server.stop()
    lines = ["# OLTP overhead, side by side", "",
             f"Written by bench/overhead_ab.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} CPUs, {huge} huge pages reserved: two servers, one with pg_stride loaded, "
             f"each with pgbench (8 clients, an ordinary role, prepared statements); in every round both are "
             f"restarted and take turns in {SLOT_S:.0f}-s slots (A B B A …) until each "
             f"had {SECONDS} s. Ratio: transactions per second of slot time, one side / the other.", "",
             *TABLE_HEAD, *rows]
    write_report(os.path.join(HERE, "results", "OVERHEAD_AB.md"), lines)


if __name__ == "__main__":
    main()
