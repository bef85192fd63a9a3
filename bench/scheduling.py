#!/usr/bin/env python3
"""Side-by-side measurements of pg_stride's admission control and CPU scheduling
against stock PostgreSQL, on one data directory, in one run:

1. short queries beside long scans: the median and p99 latency of a short query
   (about 20 ms alone) issued again and again while 4 long scans (seconds each) run,
   stock PostgreSQL against pg_stride with 2 CPU slots;
2. CPU shares of two groups with weights 3:1 running identical CPU-bound queries,
   read from pg_stride.groups after a fixed time;
3. overhead: pgbench select-only with 1 client (an uncontended statement) and with 4,
   and TPC-B with 8 clients, all as an ordinary role so that every statement goes
   through admission; library not loaded against loaded, in pairs of rounds whose order
   alternates. Besides tps it reports the server's CPU time per transaction (the
   postmaster's reaped children), which the machine's noise disturbs less.

Writes bench/results/SCHEDULING.md (a --quick run: bench/out/scheduling-quick.md; a
run of some sections only: bench/out/scheduling-partial.md).
The TPC-B rounds here are pairs in time, which the drift of a shared machine moves by
more than the overhead; bench/overhead_ab.py measures that overhead side by side.

Usage: bench/scheduling.py [--quick] [--only short,shares,overhead]
"""

import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import pgserver  # noqa: E402
from pgserver import AS_POSTGRES, ENV, PGBIN  # noqa: E402

PORT = 5496
QUICK = "--quick" in sys.argv
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
HERE = os.path.dirname(os.path.abspath(__file__))

LONG = "SELECT count(*) FROM big WHERE md5(v::text) LIKE 'a%';\n"
SHORT = ("\\set lo random(1, 4900000)\n"
         "SELECT count(*) FROM big WHERE id BETWEEN :lo AND :lo + 20000 AND md5(v::text) LIKE 'a%';\n")


class Server(pgserver.Server):
    """pylib/pgserver.py's server, restarted with each variant's settings in
    variant.conf."""

    def __init__(self, port=PORT):
        super().__init__(port, prefix="pg_stride_sched_bench_")
        self.initdb("shared_buffers = '1GB'\nmax_connections = 100\njit = off\n"
                    "synchronous_commit = off\nautovacuum = off\ninclude_if_exists = 'variant.conf'\n")

    def restart(self, settings):
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self.pg_ctl("-m", "fast", "-w", "stop", check=True, stdout=subprocess.DEVNULL)
        self.script(os.path.join("data", "variant.conf"), "\n".join(settings) + "\n")
        self.start()

    def children_cpu_s(self):
        """CPU seconds of the server's ended processes (the postmaster's cutime + cstime)."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pid = f.readline().strip()
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def pgbench(self, *args, user="postgres", log_prefix=None):
        cmd = [f"{PGBIN}/pgbench", "-n", "-h", self.dir, "-p", str(self.port), "-U", user]
        if log_prefix:
            cmd += ["-l", f"--log-prefix={log_prefix}"]
        return subprocess.Popen(AS_POSTGRES + cmd + list(args) + ["postgres"], env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def tps(output):
    for line in output.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(output)


def transactions(output):
    for line in output.splitlines():
        if line.startswith("number of transactions actually processed:"):
            return int(line.split(":")[1].split("/")[0])
    raise RuntimeError(output)


def latencies_ms(s, prefix):
    values = []
    for name in os.listdir(s.dir):
        if name.startswith(os.path.basename(prefix)):
            with open(os.path.join(s.dir, name)) as f:
                values += [int(line.split()[2]) / 1000 for line in f if line.strip()]
    return values


def p99(values):
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


def short_beside_long(s, variant, settings, seconds):
    s.restart(settings)
    short = s.script("short.sql", SHORT)
    long = s.script("long.sql", LONG)
    alone = s.pgbench("-c", "1", "-T", str(seconds // 2), "-f", short, log_prefix=f"{s.dir}/alone_{variant}")
    alone.communicate()
    longs = s.pgbench("-c", "4", "-T", str(seconds + 4), "-f", long)
    time.sleep(2)
    mixed = s.pgbench("-c", "1", "-T", str(seconds), "-f", short, log_prefix=f"{s.dir}/mixed_{variant}")
    mixed.communicate()
    out, _ = longs.communicate()
    a = latencies_ms(s, f"{s.dir}/alone_{variant}")
    m = latencies_ms(s, f"{s.dir}/mixed_{variant}")
    return {"alone_median": statistics.median(a), "alone_p99": p99(a), "median": statistics.median(m),
            "p99": p99(m), "n": len(m), "long_tps": tps(out)}


def group_shares(s, settings, seconds):
    s.restart(settings)
    s.sql("CREATE EXTENSION IF NOT EXISTS pg_stride")
    for name, weight in (("gold", 300), ("bronze", 100)):
        s.sql(f"SELECT pg_stride.create_group('{name}', weight => {weight}) "
              f"WHERE NOT EXISTS (SELECT FROM pg_stride.groups WHERE name = '{name}')")
        s.sql(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'r_{name}') THEN "
              f"CREATE ROLE r_{name} LOGIN; END IF; END $$; GRANT SELECT ON big TO r_{name}; "
              f"ALTER ROLE r_{name} SET pg_stride.resource_group = '{name}'")
    long = s.script("long.sql", LONG)
    # Serial plans: the shares are the scheduler's, not those of parallel workers
    # waiting on each other.
    s.sql("ALTER ROLE r_gold SET max_parallel_workers_per_gather = 0; "
          "ALTER ROLE r_bronze SET max_parallel_workers_per_gather = 0")

    def cpu_ms():
        # pg_stride.groups counts the CPU of finished and of running queries.
        row = s.sql("SELECT string_agg(name || '=' || round(cpu_time_ms), ' ' ORDER BY name) "
                    "FROM pg_stride.groups WHERE name IN ('gold', 'bronze')")
        return {k: float(v) for k, v in (kv.split("=") for kv in row.split())}

    # The window is read while both groups are busy: pgbench runs longer than it, and
    # the queries still running when pgbench stops (which then have the CPUs to
    # themselves) fall outside it.
    warmup = 5
    runs = [s.pgbench("-c", "2", "-T", str(seconds + warmup + 5), "-f", long, user=f"r_{g}")
            for g in ("gold", "bronze")]
    time.sleep(warmup)
    before = cpu_ms()
    time.sleep(seconds)
    after = cpu_ms()
    for r in runs:
        r.communicate()
    return after["gold"] - before["gold"], after["bronze"] - before["bronze"]


OVERHEAD_WORKLOADS = (("select1", "pgbench -S, 1 client", ["-S", "-c", "1", "-j", "1"]),
                      ("select4", "pgbench -S, 4 clients", ["-S", "-c", "4", "-j", "2"]),
                      ("tpcb", "pgbench TPC-B, 8 clients", ["-c", "8", "-j", "2"]))


def overhead(s, variants, pairs, seconds):
    """Runs each workload in `pairs` pairs of rounds, one round per variant, the order
    alternating between pairs. Returns {workload: [(tps, cpu_us_per_tx) per variant]}
    per pair."""
    results = {w: [] for w, _, _ in OVERHEAD_WORKLOADS}
    for pair in range(pairs):
        order = variants if pair % 2 == 0 else variants[::-1]
        measured = {}
        for name, settings in order:
            s.restart(settings)
            for w, _, args in OVERHEAD_WORKLOADS:
                before = s.children_cpu_s()
                out = s.pgbench(*args, "-T", str(seconds[w]), "-M", "prepared", user="r_plain").communicate()[0]
                time.sleep(0.5)  # the backends exit and are reaped
                cpu_us = (s.children_cpu_s() - before) * 1e6 / transactions(out)
                measured[(w, name)] = (tps(out), cpu_us)
        for w in results:
            results[w].append([measured[(w, name)] for name, _ in variants])
    return results


def main():
    s = Server()
    stock = []
    stride = ["shared_preload_libraries = 'pg_stride'", "pg_stride.cpu_slots = 2",
              "pg_stride.exempt_superuser = off"]
    seconds = 10 if QUICK else 30
    lines = []
    try:
        s.restart(stock)
        if ONLY is None or ONLY & {"short", "shares"}:
            s.sql("CREATE TABLE big (id int PRIMARY KEY, v int); "
                  "INSERT INTO big SELECT g, g FROM generate_series(1, 5000000) g")
            s.sql("VACUUM ANALYZE big")
        s.run(f"{PGBIN}/pgbench", "-i", "-s", "10", "-q", "-h", s.dir, "-p", str(PORT), "-U", "postgres", "postgres",
              check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s.sql("CREATE ROLE r_plain LOGIN; GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO r_plain")

        if ONLY is None or "short" in ONLY:
            lines += ["## Short queries beside 4 long scans (2 cores)", "",
                      "| configuration | short alone median / p99 (ms) | beside long scans median / p99 (ms) | ratio median / p99 | long scans tps |",
                      "|---|---|---|---|---|"]
            for variant, settings in (("stock", stock), ("pg_stride, 2 CPU slots", stride)):
                r = short_beside_long(s, variant.split(",")[0], settings, seconds)
                lines.append(f"| {variant} | {r['alone_median']:.1f} / {r['alone_p99']:.1f} | {r['median']:.1f} / {r['p99']:.1f} "
                             f"(n={r['n']}) | {r['median'] / r['alone_median']:.2f} / {r['p99'] / r['alone_p99']:.2f} | {r['long_tps']:.2f} |")
                print(lines[-1], flush=True)

        if ONLY is None or "shares" in ONLY:
            share_seconds = 20 if QUICK else 60
            gold, bronze = group_shares(s, stride, share_seconds)
            lines += ["", f"## CPU shares, groups with weights 3:1, {share_seconds} s, 2 clients each, serial plans", "",
                      "CPU time from pg_stride.groups (finished and running queries), read at the start "
                      "and the end of the window while both groups are busy.", "",
                      f"gold (weight 300): {gold / 1000:.1f} s CPU; bronze (weight 100): {bronze / 1000:.1f} s CPU; "
                      f"ratio {gold / bronze:.2f}"]
            print(lines[-1], flush=True)

        if ONLY is None or "overhead" in ONLY:
            variants = [("not loaded", stock),
                        ("loaded", ["shared_preload_libraries = 'pg_stride'", "pg_stride.exempt_superuser = off"])]
            pairs = 1 if QUICK else 8
            oh_seconds = {"select1": 5, "select4": 5, "tpcb": 10} if QUICK else {"select1": 10, "select4": 10, "tpcb": 60}
            res = overhead(s, variants, pairs, oh_seconds)
            lines += ["", f"## Overhead: {pairs} pairs of rounds (order alternating), as an ordinary role", "",
                      "Medians over the pairs; the ratios are the medians of the per-pair ratios.", "",
                      "| workload | seconds per round | not loaded tps | loaded tps | loaded / not loaded tps "
                      "| server CPU µs per transaction, not loaded / loaded | ratio |",
                      "|---|---|---|---|---|---|---|"]
            for w, label, _ in OVERHEAD_WORKLOADS:
                rows = res[w]
                med = lambda f: statistics.median(f(r) for r in rows)
                lines.append(f"| {label} | {oh_seconds[w]} | {med(lambda r: r[0][0]):.0f} | {med(lambda r: r[1][0]):.0f} "
                             f"| {med(lambda r: r[1][0] / r[0][0]):.3f} | {med(lambda r: r[0][1]):.2f} / {med(lambda r: r[1][1]):.2f} "
                             f"| {med(lambda r: r[1][1] / r[0][1]):.3f} |")
                print(lines[-1], flush=True)
    finally:
        s.stop()
    machine = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    cpus = os.cpu_count()
    header = [f"# pg_stride scheduling measurements{' (quick)' if QUICK else ''}", "",
              f"Machine: {machine}, {cpus} CPUs. Written by bench/scheduling.py on "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    # The full run's report is kept with the project; a quick run's is not.
    if ONLY is not None:
        path = os.path.join(HERE, "out", "scheduling-partial.md")
    elif QUICK:
        path = os.path.join(HERE, "out", "scheduling-quick.md")
    else:
        path = os.path.join(HERE, "results", "SCHEDULING.md")
    write_report(path, header + lines)


def write_report(path, lines):
    """Writes a Markdown report, one list item per line, and prints it."""
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
