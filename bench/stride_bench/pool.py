"""bench/run --pool: pg_stride's pool (`pg_stride.parallel_mode = pool`) against
PostgreSQL's own parallel workers and against no workers, on one server in one run.

Two parts (docs/internals/pool.md; bench/README.md, "The pool"):

- results: the 22 TPC-H queries at both scales, each with one fixed draw of its
  parameters, run serially, with parallel_mode off, native and pool, parallel plans
  encouraged (parallel costs 0); the outputs must be equal byte for byte. The pool's
  counters say how many of each query's Gathers pool workers ran.
- latency: small parallel queries, one client, the three ways interleaved in rounds
  (each round runs every way once, in a rotating order): a 1-row table, count(*) over
  100k rows, TPC-H Q6 at the small scale; medians of >= 200 executions per way, and the
  pool's set-up time per fragment broken into phases (pg_stride.pool_counters()); once
  with min_dynamic_shared_memory = 0 (PostgreSQL's default) and once with 8MB (what a
  server started in pool mode gets by default).
- clients: what an application gets with the shipped settings (CPU slots = CPUs,
  max_worker_processes as configured, only parallel_mode = pool set) and an ordinary
  login role per way (ALTER ROLE … SET chooses the way): count(*) over 25k, 50k and 100k
  rows with parallelism encouraged, sent by 1 pgbench client (closed loop, >= 300
  executions per way, rounds interleaved) and by 4 clients; median latency and
  transactions per second.
"""

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

from . import analysis, data, hugepages, queries
from .common import PG_BIN, RESULTS_DIR, log, ncpus, run
from .pgserver import Server, stride_library_problem
from .workload import TPCH_DB, clear_logs, pgbench

SEED = 20210
POOL_SIZE = 4
# On every server of this run: pg_stride loaded and scheduling pgbench's superuser; CPU
# slots enough that the concurrency hint grants every planned worker, and no prediction
# (a small statement predicted short gets no workers beside another), so that the three
# ways differ only in who runs the parallel part.
SETTINGS = [
    "shared_preload_libraries = 'pg_stride'",
    "pg_stride.exempt_superuser = off",
    "pg_stride.cpu_slots = 8",
    "pg_stride.predict = off",
    f"pg_stride.pool_size = {POOL_SIZE}",
]
# Parallel plans wherever the planner can make one, with 2 workers.
PARALLEL = ("-c parallel_setup_cost=0 -c parallel_tuple_cost=0 "
            "-c min_parallel_table_scan_size=0 -c min_parallel_index_scan_size=0 "
            "-c max_parallel_workers_per_gather=2")
# The ways a query runs, as session options.
WAYS = {
    "no workers": "-c max_parallel_workers_per_gather=0",
    "off": "-c pg_stride.parallel_mode=off",
    "native": "-c pg_stride.parallel_mode=native",
    "pool": "-c pg_stride.parallel_mode=pool",
}
LATENCY_WAYS = ["no workers", "native", "pool"]
# The latency part runs twice, the server restarted in between: without and with a
# preallocated area for dynamic shared memory, where every Gather's parallel context is
# created without a new segment's system calls (as its leader sets one up for native
# workers and pool workers alike). A server started in pool mode gets 8MB by default
# (src/pool/mod.rs); this one starts in native mode, so both are set.
SERVER_VARIANTS = [("min_dynamic_shared_memory = 0", ["min_dynamic_shared_memory = 0"]),
                   ("min_dynamic_shared_memory = 8MB", ["min_dynamic_shared_memory = '8MB'"])]
ROUNDS = 10
PER_ROUND = 25          # executions per way and round: 250 per way
# The clients part: the settings users get once they ask for the pool, one role per way
# (prediction on, as shipped: beside other clients, a statement predicted short is
# granted no workers).
CLIENT_SETTINGS = ["shared_preload_libraries = 'pg_stride'", "pg_stride.parallel_mode = pool"]
CLIENT_ROLES = {"no workers": ("pool_bench_serial", "max_parallel_workers_per_gather = 0"),
                "native": ("pool_bench_native", "pg_stride.parallel_mode = native"),
                "pool": ("pool_bench_pool", "pg_stride.parallel_mode = pool")}
CLIENT_ROUNDS = 12
CLIENT_PER_ROUND = 30   # 360 executions per way with one client
# Several clients run for a time per round instead, as an application's connections
# send statements back to back: the statements that arrive in a round's first
# CLIENT_WARM_S are left out. Between two rounds the server is idle for a moment, and
# the concurrency hint, an average over the last 100-200 ms, still reads the slots free
# when the next round's first statements ask for workers; an application under steady
# load has no such gaps. (With rounds of 30 statements per client, about 60 ms, every
# round was that transient: 5 % of its Gathers got a worker, against none in steady
# state.)
CLIENT_ROUND_S = 3
CLIENT_WARM_S = 0.5
CLIENT_COUNTS = [1, 4]
# Table sizes of the clients part: a parallel query's work against the fixed cost of its
# workers (native: forked for each Gather; pool: a set-up per fragment).
CLIENT_TABLES = ["rows_25k", "rows_50k", "rows_100k"]

SCHEMA = "pool_bench"
SETUP_SQL = f"""
create schema if not exists {SCHEMA};
drop table if exists {SCHEMA}.one_row, {SCHEMA}.rows_25k, {SCHEMA}.rows_50k, {SCHEMA}.rows_100k;
create table {SCHEMA}.one_row (a int);
insert into {SCHEMA}.one_row values (1);
create table {SCHEMA}.rows_100k as select g as a, g % 97 as b from generate_series(1, 100000) g;
create table {SCHEMA}.rows_50k as select * from {SCHEMA}.rows_100k where a <= 50000;
create table {SCHEMA}.rows_25k as select * from {SCHEMA}.rows_100k where a <= 25000;
alter table {SCHEMA}.one_row set (parallel_workers = 2);
alter table {SCHEMA}.rows_25k set (parallel_workers = 2);
alter table {SCHEMA}.rows_50k set (parallel_workers = 2);
alter table {SCHEMA}.rows_100k set (parallel_workers = 2);
"""

# Phases of a fragment, as pg_stride.pool_counters() sums them (src/pool/shared.rs).
PHASES = [
    ("ns_wake", "posted -> taken by the pool worker"),
    ("ns_restore", "leader's state restored"),
    ("ns_run", "ParallelQueryMain"),
    ("ns_until_x", "until the end message is sent"),
    ("ns_until_released", "out of the leader's lock group"),
    ("ns_own_restore", "own identity (and, if unknown, settings) back, idle again"),
]


def options(way: str, extra: str = "") -> str:
    """Session options of `way`, with `extra` (a workload's own) except for "no workers":
    a forced Gather would launch its worker even with max_parallel_workers_per_gather 0."""
    return " ".join(filter(None, (PARALLEL, WAYS[way], "" if way == "no workers" else extra)))


def fixed_parameters(text: str, rng: random.Random) -> str:
    """The pgbench script `text` as a psql script: each `\\set NAME random(A, B)` drawn
    once with `rng`, expressions of earlier variables evaluated as pgbench would
    (integers), and written as psql's own `\\set NAME VALUE`, which psql interpolates
    as `:NAME` the same way."""
    values = {}
    out = []
    for line in text.splitlines():
        m = re.match(r"\\set (\w+) (.+)$", line)
        if not m:
            out.append(line)
            continue
        name, expr = m.group(1), m.group(2).strip()
        r = re.fullmatch(r"random\((-?\d+),\s*(-?\d+)\)", expr)
        if r:
            value = rng.randint(int(r.group(1)), int(r.group(2)))
        else:
            expr = re.sub(r":(\w+)", lambda v: str(values[v.group(1)]), expr)
            if not re.fullmatch(r"[0-9+\-*%() ]+", expr):
                raise ValueError(f"cannot evaluate pgbench expression {m.group(2)!r}")
            value = eval(expr.replace("/", "//"))  # digits and operators only
        values[name] = value
        out.append(f"\\set {name} {value}")
    return "\n".join(out) + "\n"


class PoolBench:
    def __init__(self, run_dir: Path, small_sf: float, large_sf: float):
        self.run_dir = run_dir
        self.server = Server()
        self.huge_pages = hugepages.Reservation()
        self.scales = [small_sf, large_sf]
        self.meta = {"pool_size": POOL_SIZE, "cpus": ncpus(), "settings": SETTINGS,
                     "parallel": PARALLEL, "ways": WAYS}

    def psql(self, source: list, way: str | None = None, extra: str = "", check=True):
        """psql on the TPC-H database with `source` (["-c", SQL] or ["-f", FILE]), tuples
        only, with `way`'s session options; returns the finished process."""
        env = dict(os.environ, PGOPTIONS=options(way, extra)) if way else None
        return run([PG_BIN / "psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                    *self.server.conn_args(TPCH_DB), *source],
                   capture=True, env=env, quiet=True, check=check)

    def sql(self, sql: str, way: str | None = None, extra: str = "") -> str:
        return self.psql(["-c", sql], way, extra).stdout

    def counters(self) -> dict:
        out = self.sql("select name, value from pg_stride.pool_counters() "
                        "union all select 'fallback: ' || reason, sum(gathers) "
                        "from pg_stride.pool_fallbacks group by reason")
        return {k: int(v) for k, v in (line.split("|") for line in out.splitlines())}

    @staticmethod
    def delta(after: dict, before: dict) -> dict:
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    def setup(self, base: list):
        self.server.ensure_initdb(base)
        self.meta["huge_pages"] = self.huge_pages.reserve_for_server(self.server.pgdata, base)
        self.server.start(SETTINGS, "pool")
        for sf in self.scales:
            data.load(self.server, TPCH_DB, sf)
        if not self.server.create_extension(TPCH_DB, "pg_stride"):
            raise RuntimeError("CREATE EXTENSION pg_stride failed in database tpch")
        self.sql("set client_min_messages = warning;" + SETUP_SQL)
        self.sql(f"vacuum (freeze, analyze) {SCHEMA}.one_row, {SCHEMA}.rows_25k, "
                 f"{SCHEMA}.rows_50k, {SCHEMA}.rows_100k")
        self.server.prewarm(TPCH_DB, [data.schema_name(sf) for sf in self.scales] + [SCHEMA])
        self.meta["server"] = self.sql("select version()").strip()

    # ---- results ----------------------------------------------------------------------
    def results(self) -> list:
        """Every query at both scales, the same fixed parameters for every way."""
        rows = []
        rng = random.Random(SEED)
        sdir = self.run_dir / "pool_results"
        sdir.mkdir(parents=True, exist_ok=True)
        for sf in self.scales:
            schema = data.schema_name(sf)
            for q in queries.ALL:
                script = sdir / f"{schema}_{q}.sql"
                script.write_text(fixed_parameters(queries.render(q, schema, sf), rng))
                row = {"query": q, "sf": sf, "digests": {}}
                for way in WAYS:
                    before = self.counters()
                    t0 = time.monotonic()
                    res = self.psql(["-f", script], way, check=False)
                    elapsed = time.monotonic() - t0
                    out = res.stdout if res.returncode == 0 else "ERROR " + res.stderr
                    (sdir / f"{schema}_{q}.{way.replace(' ', '_')}.out").write_text(out)
                    row["digests"][way] = hashlib.sha256(out.encode()).hexdigest()[:12]
                    row.setdefault("rows", out.count("\n"))
                    row.setdefault("ms", {})[way] = elapsed * 1000
                    if way == "pool":
                        row["pool"] = self.delta(self.counters(), before)
                row["equal"] = len(set(row["digests"].values())) == 1
                rows.append(row)
                p = row["pool"]
                log(f"  {schema} {q}: {row['rows']:4d} rows, "
                    f"{'equal' if row['equal'] else 'DIFFERENT: ' + json.dumps(row['digests'])}; "
                    f"pool: {p.get('gathers_pooled', 0)} gathers pooled, "
                    f"{p.get('fragments_ok', 0)} fragments, fallbacks "
                    f"{ {k[10:]: v for k, v in p.items() if k.startswith('fallback: ')} or '-'}")
        return rows

    # ---- latency ----------------------------------------------------------------------
    def latency(self) -> dict:
        ldir = self.run_dir / "pool_latency"
        ldir.mkdir(parents=True, exist_ok=True)
        q6 = ldir / "q6.sql"
        q6.write_text(queries.render("q06", data.schema_name(self.scales[0]), self.scales[0]))
        one = ldir / "one_row.sql"
        one.write_text(f"select a from {SCHEMA}.one_row;\n")
        cnt = ldir / "count_100k.sql"
        cnt.write_text(f"select count(*) from {SCHEMA}.rows_100k;\n")
        # A 1-row table gets no parallel plan even at parallel costs 0 (its one page is
        # not divided): its Gather is forced, a single-copy one (the worker runs the scan).
        force = ("-c debug_parallel_query=on" if int(self.sql("show server_version_num")) >= 160000
                 else "-c force_parallel_mode=on")
        workloads = [("1-row table, forced parallelism", one, force),
                     ("count(*) over 100k rows", cnt, ""),
                     (f"TPC-H Q6, SF {self.scales[0]:g}", q6, "")]
        out = {}
        for label, script, extra in workloads:
            plans = {w: self.sql("explain (analyze, costs off, timing off, summary off) "
                                  + self.statement(script), way=w, extra=extra)
                     for w in LATENCY_WAYS}
            lat = {w: [] for w in LATENCY_WAYS}
            phases = {}
            # warm-up: pool workers started, caches filled, for every way
            for way in LATENCY_WAYS:
                self.pgbench(script, way, extra, 20, ldir / f"warm_{script.stem}_{way[:2]}")
            for rnd in range(ROUNDS):
                k = rnd % len(LATENCY_WAYS)
                for way in LATENCY_WAYS[k:] + LATENCY_WAYS[:k]:
                    before = self.counters() if way == "pool" else None
                    lat[way] += self.pgbench(script, way, extra, PER_ROUND,
                                             ldir / f"{script.stem}_{way[:2]}_{rnd}")
                    if before is not None:
                        for k2, v in self.delta(self.counters(), before).items():
                            phases[k2] = phases.get(k2, 0) + v
            res = {w: stats([x * 1000 for x in lat[w]]) for w in LATENCY_WAYS}
            out[label] = {"ms": res, "pool": phases, "plans": plans, "options": extra}
            log(f"  {label}: median " + ", ".join(
                f"{w} {res[w]['p50']:.3f} ms" for w in LATENCY_WAYS)
                + f"; pool fragments {phases.get('fragments_ok', 0)}, gathers pooled "
                f"{phases.get('gathers_pooled', 0)}")
        return out

    # ---- clients ----------------------------------------------------------------------
    def clients(self) -> dict:
        """count(*) over each of CLIENT_TABLES from 1 and 4 clients, each way as its own
        login role; keyed by table, then client count."""
        cdir = self.run_dir / "pool_clients"
        cdir.mkdir(parents=True, exist_ok=True)
        for way, (role, setting) in CLIENT_ROLES.items():
            self.sql(f"do $$ begin create role {role} login; exception when duplicate_object "
                     f"then null; end $$; alter role {role} set {setting}; "
                     f"grant usage on schema {SCHEMA} to {role}; "
                     f"grant select on all tables in schema {SCHEMA} to {role}")
        out = {}
        for table in CLIENT_TABLES:
            script = cdir / f"count_{table}.sql"
            script.write_text(f"select count(*) from {SCHEMA}.{table};\n")
            out[table] = self.clients_of(script, cdir)
        return out

    def clients_of(self, script: Path, cdir: Path) -> dict:
        out = {}
        for clients in CLIENT_COUNTS:
            lat = {w: [] for w in CLIENT_ROLES}
            tps = {w: [] for w in CLIENT_ROLES}
            before = self.counters()
            for way in CLIENT_ROLES:
                self.client_run(script, way, 1, cdir / f"warm_{script.stem}_{clients}_{way[:2]}")
            for rnd in range(CLIENT_ROUNDS):
                k = rnd % len(CLIENT_ROLES)
                ways = list(CLIENT_ROLES)
                for way in ways[k:] + ways[:k]:
                    lats, rate = self.client_run(script, way, clients,
                                                 cdir / f"{script.stem}_c{clients}_{way[:2]}_{rnd}")
                    lat[way] += lats
                    tps[way].append(rate)
            res = {w: {**stats([x * 1000 for x in lat[w]]), "tps_rounds": tps[w],
                       "tps_median": analysis.percentile(tps[w], 50)} for w in CLIENT_ROLES}
            out[str(clients)] = {"ms": res, "pool": self.delta(self.counters(), before)}
            log(f"  {script.stem}, {clients} client(s): median " + ", ".join(
                f"{w} {res[w]['p50']:.3f} ms ({res[w]['tps_median']:.0f} tps)" for w in CLIENT_ROLES))
        return out

    def client_run(self, script: Path, way: str, clients: int, prefix: Path):
        """One round of `way` from `clients` clients: CLIENT_PER_ROUND statements from
        one client; CLIENT_ROUND_S seconds from several, of which the statements that
        arrived in the first CLIENT_WARM_S count. The latencies in seconds and the
        transactions per second of what counts."""
        clear_logs(prefix)
        role = CLIENT_ROLES[way][0]
        conn = self.server.conn_args(TPCH_DB)
        conn[conn.index("-U") + 1] = role
        length = ["-t", CLIENT_PER_ROUND] if clients == 1 else ["-T", CLIENT_ROUND_S]
        r = pgbench(["-n", "-M", "simple", "-c", clients, "-j", clients, *length,
                     "-l", f"--log-prefix={prefix}", "-f", script],
                    conn, Path(str(prefix) + ".out"), timeout=600, cwd=prefix.parent,
                    env=dict(os.environ, PGOPTIONS=options_of_role(way)))
        txns = analysis.parse_logs(str(prefix))
        if (r["rc"] != 0 or not txns or any(t.failed for t in txns)
                or (clients == 1 and len(txns) != CLIENT_PER_ROUND)):
            raise RuntimeError(f"pgbench {script.name} ({way}, {clients} clients) failed; "
                               f"see {prefix}.out")
        if clients == 1:
            return [t.latency_s for t in txns], r["tps"]
        return steady(txns, CLIENT_WARM_S)

    @staticmethod
    def statement(script: Path) -> str:
        """The one statement of a latency script, its pgbench variables fixed."""
        text = fixed_parameters(script.read_text(), random.Random(SEED))
        sets = dict(re.findall(r"\\set (\w+) (\S+)", text))
        body = "\n".join(line for line in text.splitlines()
                         if not line.startswith(("\\set", "--")))
        return re.sub(r"(?<!:):(\w+)", lambda m: sets.get(m.group(1), m.group(0)), body).rstrip(";\n")

    def pgbench(self, script: Path, way: str, extra: str, n: int, prefix: Path) -> list:
        clear_logs(prefix)
        r = pgbench(["-n", "-M", "simple", "-c", 1, "-j", 1, "-t", n,
                     f"--random-seed={SEED}", "-l", f"--log-prefix={prefix}", "-f", script],
                    self.server.conn_args(TPCH_DB), Path(str(prefix) + ".out"),
                    timeout=600, cwd=prefix.parent,
                    env=dict(os.environ, PGOPTIONS=options(way, extra)))
        txns = analysis.parse_logs(str(prefix))
        if r["rc"] != 0 or len(txns) != n or any(t.failed for t in txns):
            raise RuntimeError(f"pgbench {script.name} ({way}) failed; see {prefix}.out")
        return [t.latency_s for t in txns]


def steady(txns: list, warm_s: float):
    """The latencies of the transactions of a closed-loop round that arrived `warm_s`
    or later after its first, and their rate over the time from then to the last end."""
    since = min(t.arrival_s for t in txns) + warm_s
    counted = [t for t in txns if t.arrival_s >= since]
    span = max(t.end_s for t in counted) - since if counted else 0.0
    if span <= 0:
        raise RuntimeError(f"a round of {len(txns)} transactions ended within {warm_s} s")
    return [t.latency_s for t in counted], len(counted) / span


def options_of_role(way: str) -> str:
    """PARALLEL's session options, which take precedence over a role's settings: the
    no-workers role keeps its max_parallel_workers_per_gather = 0."""
    return PARALLEL + (" " + WAYS["no workers"] if way == "no workers" else "")


def stats(xs: list) -> dict:
    return {"n": len(xs), **{f"p{p}": analysis.percentile(xs, p) for p in (10, 50, 90, 99)}}


def paired_tps(way: dict, base: dict) -> str:
    """A way's throughput against the base way's, round by round (each round runs every
    way, in a rotating order): the ratios' geometric mean and 95 % confidence interval.
    Blank for the base itself and for a run that kept no rounds' rates."""
    if way is base or "tps_rounds" not in way:
        return ""
    assert len(way["tps_rounds"]) == len(base["tps_rounds"]), (way, base)
    mean, low, high = analysis.ratio_interval(
        [a / b for a, b in zip(way["tps_rounds"], base["tps_rounds"])])
    return f"{mean:.3f} [{low:.3f}–{high:.3f}]"


def report(meta: dict) -> list:
    lines = ["# The pool against PostgreSQL's parallel workers", "",
             f"Written by `bench/run --pool` on {meta['finished']} against {meta['server']}, "
             f"{meta['cpus']} CPUs, pg_stride.so {meta['library']}; one server, one run. "
             f"Server settings beyond bench/configs.toml's base: "
             + ", ".join(f"`{s}`" for s in SETTINGS) + ". Session options of every query: "
             f"`{PARALLEL}`.", ""]
    res = meta["results"]
    same = sum(1 for r in res if r["equal"])
    pooled = sum(r["pool"].get("gathers_pooled", 0) for r in res)
    frags = sum(r["pool"].get("fragments_ok", 0) for r in res)
    lines += ["## Results", "",
              f"{same} of {len(res)} query runs give the same output byte for byte with no "
              f"workers, parallel_mode off, native and pool (each query once per scale with "
              f"one fixed draw of its parameters). In pool mode, {pooled} Gathers ran in "
              f"pool workers ({frags} fragments).", "",
              "| scale | query | rows | equal | Gathers pooled | fragments | fallbacks | "
              "ms: no workers / off / native / pool |", "|---|---|---|---|---|---|---|---|"]
    for r in res:
        fb = ", ".join(f"{k[10:]} {v}" for k, v in r["pool"].items() if k.startswith("fallback: "))
        lines.append(f"| {r['sf']:g} | {r['query']} | {r['rows']} | "
                     f"{'yes' if r['equal'] else '**no**'} | {r['pool'].get('gathers_pooled', 0)} | "
                     f"{r['pool'].get('fragments_ok', 0)} | {fb or '-'} | "
                     + " / ".join(f"{r['ms'][w]:.0f}" for w in WAYS) + " |")
    lines += ["", "## Latency", "",
              f"One client, {ROUNDS} rounds of {PER_ROUND} executions per way (after 20 "
              "unmeasured ones per way); each round runs the ways in a rotating order. "
              "Latency as pgbench logs it (µs resolution). Twice, the server restarted in "
              "between: with `min_dynamic_shared_memory = 0` (PostgreSQL's default) and with "
              "8MB (what a server started in pool mode gets by default), so that each "
              "Gather's parallel context is carved from preallocated shared memory instead "
              "of a new segment (the same for PostgreSQL's workers and the pool's)."]
    for variant, latency in meta["latency"].items():
        lines += ["", f"### {variant}", "",
                  "| query | way | median ms | p10 | p90 | p99 | n | median vs no workers | "
                  "native ÷ pool (medians) |", "|---|---|---|---|---|---|---|---|---|"]
        for label, v in latency.items():
            ms = v["ms"]
            for w in LATENCY_WAYS:
                st = ms[w]
                lines.append(
                    f"| {label} | {w} | {st['p50']:.3f} | {st['p10']:.3f} | {st['p90']:.3f} | "
                    f"{st['p99']:.3f} | {st['n']} | {st['p50'] - ms['no workers']['p50']:+.3f} | "
                    + (f"{ms['native']['p50'] / ms['pool']['p50']:.2f}" if w == "pool" else "")
                    + " |")
        lines += ["", "The pool's set-up per fragment: means over the fragments pool workers "
                  "ran in the measured rounds (`pg_stride.pool_counters()`, differences across "
                  "each pool batch).", "",
                  "| query | fragments | " + " | ".join(d for _, d in PHASES) + " |",
                  "|---|---|" + "---|" * len(PHASES)]
        for label, v in latency.items():
            p = v["pool"]
            n = p.get("fragments_ok", 0) + p.get("fragments_error", 0)
            lines.append(f"| {label} | {n} | " + " | ".join(
                f"{p.get(k, 0) / n / 1000:.1f} µs" if n else "-" for k, _ in PHASES) + " |")
    if meta.get("clients"):
        lines += ["", "## Clients, shipped settings", "",
                  "The server restarted with only `" + "`, `".join(CLIENT_SETTINGS) + "` (CPU "
                  "slots = CPUs, the pool's caps from max_worker_processes, "
                  "`min_dynamic_shared_memory` at pool mode's default); each way is a login "
                  "role of its own, chosen with ALTER ROLE … SET (" + ", ".join(
                      f"{w}: `{s}`" for w, (_, s) in CLIENT_ROLES.items()) + "), session options "
                  f"`{PARALLEL}`. `count(*)` over tables of 25k, 50k and 100k rows, closed "
                  f"loop; {CLIENT_ROUNDS} rounds per table and client count, the ways in a "
                  f"rotating order; a round is {CLIENT_PER_ROUND} statements from one client, "
                  f"{CLIENT_ROUND_S} s from several, of which the statements that arrived in "
                  f"the first {CLIENT_WARM_S} s are left out (the hint still reads the idle "
                  "server between rounds then; an application under steady load has no such "
                  "gaps).", "",
                  "| table | clients | way | median ms | p90 | p99 | n | tps (median of rounds) | "
                  "no workers ÷ way (medians) | native ÷ way (medians) | tps ÷ no workers' in "
                  "the same round (geometric mean, 95 % CI) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        notes = []
        for table, by_clients in meta["clients"].items():
            for clients, v in by_clients.items():
                ms = v["ms"]
                for w in CLIENT_ROLES:
                    st = ms[w]
                    lines.append(f"| {table} | {clients} | {w} | {st['p50']:.3f} | "
                                 f"{st['p90']:.3f} | {st['p99']:.3f} | {st['n']} | "
                                 f"{st['tps_median']:.0f} | "
                                 f"{ms['no workers']['p50'] / st['p50']:.2f} | "
                                 f"{ms['native']['p50'] / st['p50']:.2f} | "
                                 f"{paired_tps(st, ms['no workers'])} |")
                pool = v["pool"]
                notes.append(f"{table}, {clients} client(s): {pool.get('gathers_pooled', 0)} "
                             "Gathers pooled, " + (", ".join(
                                 f"{k[10:]} {n}" for k, n in pool.items()
                                 if k.startswith("fallback: ")) or "no fallbacks") + ".")
        lines += [""] + [f"- {n}" for n in notes] + [""]
    lines += ["", "## Plans", "", "EXPLAIN ANALYZE of each latency query, per way (first "
              "server variant)", ""]
    for label, v in next(iter(meta["latency"].values())).items():
        for w in LATENCY_WAYS:
            lines += [f"{label}, {w}:", "", "```", v["plans"][w].rstrip(), "```", ""]
    return lines


def main(run_dir: Path, base: list, small_sf: float, large_sf: float, publish: bool) -> int:
    problem = stride_library_problem()
    if problem:
        log(problem)
        return 1
    bench = PoolBench(run_dir, small_sf, large_sf)
    try:
        bench.setup(base)
        log("results: 22 queries x 2 scales x " + ", ".join(WAYS))
        bench.meta["results"] = bench.results()
        bench.meta["latency"] = {}
        for variant, extra in SERVER_VARIANTS:
            bench.server.start(SETTINGS + extra, "pool")
            log(f"latency ({variant}): " + ", ".join(LATENCY_WAYS))
            bench.meta["latency"][variant] = bench.latency()
        bench.server.start(CLIENT_SETTINGS, "pool-shipped")
        log("clients (shipped settings): " + ", ".join(CLIENT_ROLES))
        bench.meta["clients"] = bench.clients()
    finally:
        bench.server.shutdown()
        bench.huge_pages.release()
    meta = bench.meta
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    so = Path(run([PG_BIN / "pg_config", "--pkglibdir"], capture=True, quiet=True)
              .stdout.strip()) / "pg_stride.so"
    st = so.stat()
    meta["library"] = (f"{st.st_size / 1e6:.1f} MB of "
                       f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(st.st_mtime))} UTC")
    (run_dir / "pool.json").write_text(json.dumps(meta, indent=1))
    text = "\n".join(report(meta)) + "\n"
    (run_dir / "POOL.md").write_text(text)
    if publish:
        (RESULTS_DIR / "POOL.md").write_text(text)
    log(f"report: {run_dir / 'POOL.md'}" + (f" and {RESULTS_DIR / 'POOL.md'}" if publish else ""))
    bad = [f"{r['query']} SF {r['sf']:g}" for r in meta["results"] if not r["equal"]]
    if bad:
        log("results differ: " + ", ".join(bad))
    return 1 if bad else 0
