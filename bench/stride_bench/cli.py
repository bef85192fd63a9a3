"""bench/run's Python half: plans a run, drives the server and the experiments, and hands
the results to the report."""

import argparse
import datetime as dt
import json
import math
import platform
import re
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import analysis, data, hugepages, queries, simgap, synthetic, tuner_report, workload
from .common import (BENCH, IS_ROOT, OUT, PG_BIN, PGBOUNCER, RESULTS_DIR, MachineBusy,
                     claim_machine, expand, load_configs, log, ncpus, run)
from .pgserver import Server, has_debug_info, pkglibdir, stride_library_problem
from .report import every_point

SEED = 20210


@dataclass
class Plan:
    mode: str
    # "tpch", the TPC-H queries at two scales, or "synthetic", the event log of
    # synthetic.py
    workload: str = "tpch"
    small_sf: float = 0.05
    large_sf: float = 0.5
    iso_runs: int = 5
    alphas: list = field(default_factory=lambda: [0.95])
    # what α is a share of: "cpu" (the machine's CPU capacity, the rate calibrated to the
    # arrivals pgbench sends), "cpu-mean" (the same from the mix's mean CPU per arrival,
    # not calibrated) or "latency" (wagner2021's isolated-latency definition); see
    # workload.arrival_rate and Runner.calibrate
    load_from: str = "cpu"
    ol_duration: int = 30
    warmup_frac: float = 0.1
    clients: int = 64
    mixed_duration: int = 15
    mixed_tpch_clients: int = 2
    mixed_oltp_clients: int = 4
    # Rounds alternate the order of the two servers; one round's ratio moves by tens of
    # per cent on a shared machine (the demo's 6-s runs), the median of three less.
    overhead_rounds: int = 3
    overhead_duration: int = 6
    overhead_clients: int = 4
    oltp_scale: int = 10
    parts: list = field(default_factory=lambda: ["open", "mixed", "overhead"])
    # the application-pool form ("app-pool"): the open loop's arrivals through this many
    # client connections, so that arrivals wait at the client whenever all of them are
    # busy, as behind an application server's connection pool; at this load, this many
    # times per configuration
    app_pool_clients: int = 16
    app_pool_alpha: float = 0.8
    app_pool_reps: int = 2
    # the tuner phases run (--tuner-phases)
    phase_duration: int = 120
    reps: int = 2
    # the transactions-beside-analytics run (--oltp): seconds per form
    oltp_duration: int = 30
    prime_s: int | None = None        # None: the largest prime_s of the configurations


PHASES_CONFIGS = [tuner_report.BASELINE, "stride-tuner"]


def make_plan(mode: str) -> Plan:
    if mode == "quick":
        return Plan(mode="quick", reps=1)
    if mode == "phases":
        return Plan(mode="phases", parts=["phases"])
    if mode == "oltp":
        return Plan(mode="oltp", parts=["oltp"], reps=3)
    return Plan(mode="full", iso_runs=7, alphas=[0.5, 0.7, 0.8, 0.9, 0.95], ol_duration=90,
                mixed_duration=60, overhead_rounds=5, overhead_duration=15,
                parts=["open", "app-pool", "mixed", "overhead"], reps=1)


def machine_info() -> dict:
    info = {"hostname": platform.node(), "kernel": platform.release(), "ncpus": ncpus(),
            "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["mem_gib"] = round(int(mem) / 1024 / 1024, 1)
        info["loadavg_start"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    try:
        info["os"] = [l.split("=", 1)[1].strip('"') for l in
                      Path("/etc/os-release").read_text().splitlines()
                      if l.startswith("PRETTY_NAME=")][0]
    except (OSError, IndexError):
        pass
    info["postgres"] = run([PG_BIN / "postgres", "--version"], capture=True, quiet=True).stdout.strip()
    res = run([PGBOUNCER, "--version"], capture=True, quiet=True, check=False)
    info["pgbouncer"] = (res.stdout or "").splitlines()[0] if res.stdout else "absent"
    so = pkglibdir() / "pg_stride.so"
    info["pg_stride_so"] = str(so) if so.exists() else "absent"
    if so.exists():
        info["pg_stride_so_mtime"] = dt.datetime.fromtimestamp(so.stat().st_mtime).isoformat(
            timespec="seconds")
        info["pg_stride_so_build"] = "debug" if has_debug_info(so) else "release"
    return info


def measured_window(plan: dict) -> tuple:
    """[start, end) of the measured arrivals, in seconds after the first arrival."""
    d = plan["ol_duration"]
    return d * plan["warmup_frac"], d - max(3.0, 0.05 * d)


def script_cpu(meta: dict, alpha=None) -> dict | None:
    """pgbench script number -> server CPU seconds of one execution, measured in the
    isolated runs (None for a run from before they were measured); for load point
    `alpha`, scaled by the machine's speed its rate was calibrated on
    (Runner.recalibrate)."""
    iso = meta.get("isolated", {})
    points = (meta.get("calibration") or {}).get("points", {})
    scale = points.get(str(alpha), {}).get("speed_scale", 1.0) if alpha is not None else 1.0
    try:
        return {int(k): iso[f"{q}|{cls}"]["cpu_s"] * scale
                for k, (q, cls) in meta["script_info"].items()}
    except KeyError:
        return None


def sent_rate(rate: float) -> float:
    """The rate as pgbench got it (-R with four decimals)."""
    return float(f"{rate:.4f}")


def dry_sequence(meta: dict, run_dir: Path) -> list | None:
    """The dry run's arrival sequence (Runner.calibrate), or None when the run had none."""
    cal = meta.get("calibration")
    if not cal:
        return None
    txns = analysis.parse_logs(str(run_dir / "calibration" / "dry"))
    return analysis.arrival_sequence(txns, cal["dry_rate"]) if txns else None


def offered(meta: dict, seq: list, cost: dict, rate: float) -> dict:
    """Share of the machine's CPU the arrivals of `seq` need at `rate`: over the measured
    window (what α is calibrated on) and over the whole run (all its arrivals / (T ·
    CPUs), the span that "server CPU" and "machine busy" cover)."""
    cpus = meta["machine"]["ncpus"]
    return {"window": analysis.offered_share(seq, cost, rate, measured_window(meta["plan"]), cpus),
            "run": analysis.offered_share(seq, cost, rate, (0.0, meta["plan"]["ol_duration"]), cpus)}


def pool_denominators(meta: dict, again: dict, probe_again: float, at_points: float) -> dict:
    """The slowdowns' denominators: per query, the median of every isolated execution of
    the run, those measured before the open loop (meta["isolated"], speed probe
    meta["probe_ms"]), in the rounds after each point (meta["isolated_between"]) and
    after the open loop (`again`, `probe_again`).  The machine's speed halves in spells
    of about a second, and a small query's executions in one round all fall in one
    (Q22 at SF 0.05: 8.6 ms in one set, 4.5 ms in another, the probes after each 1 %
    apart); rounds spread over the whole run, between the points, sample the spells the
    points ran in.  meta["isolated"] becomes the denominators, keeping the first set's
    CPU (the rates' basis); meta["denominators"] records the sets and `at_points`, the
    median probe around the points; returns the sets before and after the open loop,
    by name, for the report's figures with each of them alone."""
    before = dict(meta["isolated"])
    between = meta.get("isolated_between", [])
    iso = {k: analysis.latency_summary(
               v["runs_s"] + [x for rnd in between for x in rnd["runs_s"][k]] + again[k]["runs_s"])
           for k, v in before.items()}
    sets = {"before the open loop": (meta["probe_ms"], before),
            "after the open loop": (probe_again, again)}
    meta["denominators"] = {
        "rounds": 2 * (workload.SPREAD_ROUNDS + 1) + len(between),
        "between": len(between), "points_probe_ms": at_points,
        "sets": [{"when": name, "probe_ms": probe,
                  "median_s": {k: v["median_s"] for k, v in lat.items()}}
                 for name, (probe, lat) in sets.items()]}
    meta["isolated"] = {k: {**v, "cpu_s": before[k]["cpu_s"]} for k, v in iso.items()}
    return {name: lat for name, (_, lat) in sets.items()}


def point_name(config: str, alpha: float, rep: int = 0) -> str:
    """The file name stem of an open-loop point's logs: repetition `rep` (from 0) of
    `config` at load `alpha`; the first repetition has no suffix, as in runs from before
    the open loop was repeated."""
    return f"ol_{config}_a{alpha}" + (f"_r{rep + 1}" if rep else "")


def rep_order(configs: list, point: int, rep: int) -> list:
    """The order in which the configurations run repetition `rep` of load point number
    `point`: reversed at every other load point, as before repetitions, and rotated by
    one place per repetition, so that over as many repetitions as configurations each
    runs once in every position; the machine's speed drifts, and the configuration run
    second did better in three runs of four (bench/results/scheduling-policy)."""
    order = list(configs) if point % 2 == 0 else list(reversed(configs))
    k = rep % len(order) if order else 0
    return order[k:] + order[:k]


def analyse_open_loop(meta: dict, run_dir: Path, config: str, alpha: float,
                      dry: list | None = None, iso: dict | None = None,
                      rep: int = 0) -> dict:
    """Statistics of one open-loop point (repetition `rep`), from its pgbench logs; with
    the dry run's sequence `dry`, whether the point sent the arrivals the calibration
    counted on. The slowdowns' denominators are the run's isolated latencies, or `iso`."""
    script_info = {int(k): tuple(v) for k, v in meta["script_info"].items()}
    iso = iso or analysis.isolated_medians(meta["isolated"])
    prefix = run_dir / "open_loop" / point_name(config, alpha, rep)
    txns = analysis.parse_logs(str(prefix))
    start, end = measured_window(meta["plan"])
    st = analysis.open_loop_stats(txns, script_info, iso, warmup_s=start, end_s=end)
    st["arrivals"] = len(txns)
    busy = prefix.with_name(prefix.name + ".cpu.csv")
    if busy.exists() and txns:
        # over the window the slowdowns and the offered load count, not the run's start
        # (pgbench connecting its clients) and end (the last queries draining)
        st["machine_busy_window"] = analysis.busy_between(
            analysis.read_busy_samples(busy), st["first_arrival"] + start,
            st["first_arrival"] + end)
    st["ran_out_of_clients"] = st.get("max_in_system", 0) >= meta["plan"]["clients"]
    rate = sent_rate(meta["rates"][str(alpha)])
    seq = analysis.arrival_sequence(txns, rate)
    cost = script_cpu(meta, alpha)
    if cost and seq:
        # what the arrivals this run really sent needed, against what α promised
        st["offered"] = offered(meta, seq, cost, rate)
    if dry and seq:
        st["sequence_check"] = analysis.compare_sequences(dry, seq, rate)
    return st


def crashes_in_server_log(config: str, t0: float, t1: float) -> list:
    """Crash reports in the configuration's server log between epoch times t0 and t1."""
    path = Server.log_dir() / f"server-{config}.log"
    found = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        if not any(k in line for k in ("terminated by signal", "PANIC")):
            continue
        try:
            ts = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(
                tzinfo=dt.timezone.utc).timestamp()
        except ValueError:
            continue
        if t0 <= ts <= t1:
            found.append(line.strip())
    return found[:5]


def reanalyse(meta: dict, run_dir: Path):
    """Recompute the open-loop statistics of a run from its logs (after a change to the
    analysis, or to check a run)."""
    dry = dry_sequence(meta, run_dir)
    for config, alpha, rep, st in every_point(meta):
        st.update(analyse_open_loop(meta, run_dir, config, float(alpha), dry, rep=rep))
        if st.get("rc", 0) != 0 and not st.get("server_crash"):
            st["server_crash"] = crashes_in_server_log(
                config, st["first_arrival"] - 5, st["last_completion"] + 5)


def other_denominators(meta: dict, run_dir: Path, others: dict):
    """Each open-loop point's mean and p99 slowdowns per class with each set of isolated
    latencies in `others` (name -> meta["isolated"]'s form) as the denominators."""
    for config, points in meta["open_loop"].items():
        for alpha, st in points.items():
            st["other_denominators"] = {}
            for name, iso in others.items():
                c = analyse_open_loop(meta, run_dir, config, float(alpha),
                                      iso=analysis.isolated_medians(iso))["classes"]
                st["other_denominators"][name] = {
                    cls: {k: c[cls]["slowdown"][k] for k in ("mean", "p99")} for cls in c}


def select_configs(configs: list, only: list | None) -> list:
    """The configurations to run, in the order `only` names them (--configs), so that
    repeated runs can alternate which one goes first; all of configs.toml's, in its
    order, without `only`. A name configs.toml does not define raises ValueError."""
    if not only:
        return list(configs)
    by_name = {c["name"]: c for c in configs}
    unknown = [n for n in only if n not in by_name]
    if unknown:
        raise ValueError(f"no configuration named {', '.join(map(repr, unknown))} in bench/configs.toml")
    return [by_name[n] for n in dict.fromkeys(only)]


def configs_named(arg: str | None) -> list | None:
    """The names --configs gives, blanks around them dropped; None without it."""
    names = [n.strip() for n in (arg or "").split(",") if n.strip()]
    return names or None


class Runner:
    def __init__(self, plan: Plan, only: list | None, run_dir: Path):
        self.plan = plan
        self.cfgfile = load_configs()
        self.base = self.cfgfile["base"]["settings"]
        self.configs = select_configs(self.cfgfile["config"], only)
        self.run_dir = run_dir
        self.server = Server()
        self.huge_pages = hugepages.Reservation()
        self.seed = SEED
        self.current = None          # name of the configuration the server runs now
        self.meta = {"plan": asdict(plan), "started": dt.datetime.now().isoformat(
            timespec="seconds"), "machine": machine_info(), "configs": {}, "open_loop": {},
            "mixed": {}, "overhead": {}, "seed": SEED,
            # the order the configurations run in at the first load point (--configs)
            "order": [c["name"] for c in self.configs]}

    # ---- bookkeeping ------------------------------------------------------------
    def save(self):
        (self.run_dir / "results.json").write_text(json.dumps(self.meta, indent=1))

    # ---- configurations ---------------------------------------------------------
    def stock(self) -> dict:
        """The stock configuration, on which the isolated runs and the calibration run."""
        return next(c for c in self.cfgfile["config"] if c["name"] == "stock")

    def use(self, cfg: dict) -> bool:
        """Start the server (and pgbouncer) for `cfg`; False when it cannot run here."""
        name = cfg["name"]
        state = self.meta["configs"].setdefault(name, {"label": cfg.get("label", ""),
                                                       "status": "pending"})
        if state["status"] == "skipped":
            return False
        problem = cfg.get("library") and stride_library_problem()
        if problem:
            state.update(status="skipped", reason=problem)
            log(f"SKIP {name}: {state['reason']}")
            return False
        if self.current != name or not self.server.running():
            self.server.stop_bouncer()
            sys_nice = bool(cfg.get("prioritize") or cfg.get("sys_nice"))
            if sys_nice and not IS_ROOT:
                state.update(status="skipped", reason="giving the server CAP_SYS_NICE "
                             "needs root")
                log(f"SKIP {name}: {state['reason']}")
                return False
            try:
                self.server.start(expand(cfg.get("settings", [])), name,
                                  renice=sys_nice)
            except RuntimeError as e:
                if not cfg.get("library"):
                    raise
                # a pg_stride build that does not start must not end the whole sweep
                self.current = None
                state.update(status="skipped", reason="the server did not start with it: "
                             + str(e).strip().splitlines()[-1][:300])
                log(f"SKIP {name}: {state['reason']}")
                return False
            self.current = name
            state["huge_pages"] = hugepages.server_uses_huge_pages(self.server.postmaster_pid())
            if cfg.get("prioritize") and not self.server.create_extension(workload.TPCH_DB,
                                                                           "prioritize"):
                state.update(status="skipped", reason="the prioritize extension is not installed "
                             "(Debian: postgresql-NN-prioritize)")
                log(f"SKIP {name}: {state['reason']}")
                return False
            missing = [g for g in cfg.get("requires", []) if not self.server.guc_exists(g)]
            if missing:
                state.update(status="skipped", reason="the installed pg_stride does not define "
                             + ", ".join(missing) + " yet")
                log(f"SKIP {name}: {state['reason']}")
                return False
            if cfg.get("library"):
                # the installation's second step; groups and the views need it
                self.server.psql("create extension if not exists pg_stride",
                                 db=self.server.psql("show pg_stride.database"))
            if cfg.get("class_groups"):
                groups = {queries.GROUP[cls]: args for cls, args in cfg["class_groups"].items()}
                self.server.define_groups(groups)
                state["groups"] = groups
            if cfg.get("pgbouncer"):
                ps = cfg.get("pool_size", "cpus")
                pool = ncpus() if ps == "cpus" else int(ps)
                state["pool_size"] = pool
                self.server.start_bouncer(pool, [workload.TPCH_DB, workload.OLTP_DB])
            self.server.prewarm(workload.TPCH_DB, self.schemas)
            self.server.prewarm(workload.OLTP_DB, ["public"])
        state["status"] = "ran"
        return True

    def workload_for(self, cfg: dict) -> workload.Workload:
        if cfg.get("prioritize"):
            return self.wl_niced
        if cfg.get("class_groups"):
            return self.wl_grouped[cfg.get("group_by", "tag")]
        return self.wl

    def conn(self, cfg: dict, db: str) -> list:
        return self.server.app_conn_args(db, through_bouncer=bool(cfg.get("pgbouncer")))

    # ---- the run ------------------------------------------------------------------
    def setup(self):
        p = self.plan
        self.server.ensure_initdb(self.base)
        self.meta["huge_pages"] = self.huge_pages.reserve_for_server(self.server.pgdata,
                                                                    self.base)
        self.server.start([], "setup")
        self.current = "setup"
        if p.workload == "synthetic":
            synthetic.load(self.server, workload.TPCH_DB)
            self.schemas = [synthetic.SCHEMA]
            self.probe = synthetic.PROBE
        else:
            data.load(self.server, workload.TPCH_DB, p.small_sf)
            data.load(self.server, workload.TPCH_DB, p.large_sf)
            self.schemas = [data.schema_name(p.small_sf), data.schema_name(p.large_sf)]
            self.probe = workload.PROBE.format(schema=self.schemas[0])
        data.load_pgbench(self.server, workload.OLTP_DB, p.oltp_scale)
        self.server.ensure_app_role({
            workload.TPCH_DB: [("select", s) for s in self.schemas],
            workload.OLTP_DB: [("select, insert, update", "public")]})
        if p.workload == "synthetic":
            self.synthetic_scripts()
        else:
            self.tpch_scripts()
        self.meta["script_info"] = {str(k): list(v) for k, v in self.wl.script_info.items()}

    def synthetic_scripts(self):
        """The synthetic log's scripts, in the variants of the TPC-H mix's (tpch_scripts)."""
        sdir = self.run_dir / "scripts"
        self.wl = workload.Workload(synthetic.write_scripts(sdir))
        self.wl_niced = workload.Workload(synthetic.write_scripts(
            sdir / "prioritize", lead_of=queries.nice_lead))
        self.wl_grouped = {
            "tag": workload.Workload(synthetic.write_scripts(sdir / "groups",
                                                             comment_of=queries.group_tag)),
            "set": workload.Workload(synthetic.write_scripts(sdir / "groups-set",
                                                             lead_of=queries.group_lead))}
        self.meta["workload"] = "synthetic"
        self.meta["queries"] = {"included": list(synthetic.STATEMENTS), "excluded": {}}
        self.meta["synthetic"] = {
            "classes": {n: c for n, (c, _) in synthetic.STATEMENTS.items()},
            "data": f"{synthetic.EVENTS} events of {synthetic.ACCOUNTS} accounts"}

    def tpch_scripts(self):
        """The TPC-H mix's scripts: plain, with the statement that sets the backend's nice
        value (prioritize), and naming the class's resource group (class_groups)."""
        p = self.plan
        scripts, niced, tagged, grouped_by_set = {}, {}, {}, {}
        sdir = self.run_dir / "scripts"
        for cls, sf in (("short", p.small_sf), ("long", p.large_sf)):
            schema = data.schema_name(sf)
            for q, path in queries.write_scripts(sdir, queries.INCLUDED, schema, sf).items():
                scripts[(q, cls)] = path
            for q, path in queries.write_scripts(sdir / "prioritize", queries.INCLUDED,
                                                 schema, sf, queries.nice_lead(cls)).items():
                niced[(q, cls)] = path
            for q, path in queries.write_scripts(sdir / "groups", queries.INCLUDED, schema,
                                                 sf, comment=queries.group_tag(cls)).items():
                tagged[(q, cls)] = path
            for q, path in queries.write_scripts(sdir / "groups-set", queries.INCLUDED,
                                                 schema, sf, queries.group_lead(cls)).items():
                grouped_by_set[(q, cls)] = path
        self.wl = workload.Workload(scripts)
        # the `prioritize` configuration's scripts: the same queries, each sent with the
        # statement that sets its backend's nice value by class
        self.wl_niced = workload.Workload(niced)
        # the `class_groups` configurations' scripts: each query names its class's
        # resource group in a comment, or (`group_by = "set"`) is sent after a SET of it
        self.wl_grouped = {"tag": workload.Workload(tagged),
                           "set": workload.Workload(grouped_by_set)}
        self.meta["workload"] = "tpch"
        self.meta["queries"] = {"included": queries.INCLUDED, "excluded": queries.EXCLUDED}
        self.meta["scales"] = {"short": p.small_sf, "long": p.large_sf}

    def isolated(self):
        self.use(self.stock())
        log(f"isolated latencies: {len(self.wl.order)} query/scale pairs x "
            f"{self.plan.iso_runs} runs, then {workload.SPREAD_ROUNDS} more rounds of "
            f"{workload.SPREAD_RUNS}")
        iso = workload.measure_isolated(self.server, self.wl, self.plan.iso_runs,
                                        self.run_dir / "isolated", SEED)
        self.meta["isolated"] = {f"{q}|{cls}": v for (q, cls), v in iso.items()}
        self.iso = analysis.isolated_medians(self.meta["isolated"])
        d = self.wl.mean_isolated(self.iso)
        c = self.wl.mean_isolated({k: v["cpu_s"] for k, v in iso.items()})
        self.meta["mean_isolated_s"] = d
        self.meta["mean_cpu_s"] = c
        # how fast the machine ran while the isolated CPU (the rates' basis) was measured
        self.meta["probe_ms"] = workload.speed_probe(self.server, self.probe)
        log(f"speed probe ({self.probe}): "
            f"{self.meta['probe_ms']:.1f} ms")
        # the rates from the mix's means; with load_from "cpu", calibrate() replaces them
        self.meta["nominal_rates"] = {
            str(a): workload.arrival_rate(a, self.plan.load_from, d, c, ncpus())
            for a in self.plan.alphas}
        self.meta["rates"] = dict(self.meta["nominal_rates"])
        log(f"mean isolated latency of an arrival d = {d * 1000:.1f} ms, mean CPU c = "
            f"{c * 1000:.1f} ms on {ncpus()} CPUs; load from {self.plan.load_from}; nominal "
            "rates: " + ", ".join(f"alpha {a}: {r:.2f}/s" for a, r in self.meta["rates"].items()))
        self.save()

    def calibrate(self):
        """The arrivals pgbench will send, and the rate at which they offer α of the CPU.

        pgbench (-j 1) draws each arrival's script from one per-thread random stream
        (chooseScript) and its Poisson gap from another (getPoissonRand), in arrival
        order, so with the same seed, client count and -f weights the script sequence is
        the same at every rate and arrival k comes at S_k / rate.  The mix's mean CPU per
        arrival c is a poor guide to the few hundred arrivals of one 30-90 s run (the
        long queries' CPU varies 50-fold): a run at λ = α · CPUs / c offered 0.76 of
        the machine at α = 0.95.  So a dry run with trivial scripts (workload.dry_run)
        gives the sequence, and per α the rate is chosen so that the arrivals in the
        measured window need α of the CPUs over it (analysis.calibrate_rate).  With
        load_from "cpu-mean" or "latency" the nominal rates stay; the dry run still
        serves the check that every point sent the arrivals it predicts."""
        p = self.plan
        cost = script_cpu(self.meta)
        window = measured_window(asdict(p))
        nominal = dict(self.meta["nominal_rates"])
        want = math.ceil(p.ol_duration * max(nominal.values()) * 1.5)
        self.use(self.stock())
        outdir = self.run_dir / "calibration"
        for _ in range(3):
            log(f"calibration: dry run of about {want} arrivals at {workload.DRY_RATE:.0f}/s "
                f"(same seed, {p.clients} clients, the -f list with `SELECT 1;` scripts)")
            r = workload.dry_run(self.server.conn_args(workload.TPCH_DB), self.wl, p.clients,
                                 SEED, want, outdir)
            if r["rc"] != 0 or r["timed_out"]:
                raise RuntimeError(f"the calibration's dry run failed; see {outdir / 'dry.out'}")
            seq = analysis.arrival_sequence(analysis.parse_logs(r["log_prefix"]), r["rate"])
            calibrated = {a: analysis.calibrate_rate(seq, cost, float(a), window, ncpus(), nr)
                          for a, nr in nominal.items()}
            if p.load_from != "cpu" or all(v is not None for v in calibrated.values()):
                break
            want *= 2                       # the sequence ended before a window did
        if p.load_from == "cpu" and None in calibrated.values():
            log("calibration: the dry run's sequence ended before the window at the rate "
                "needed; those load points keep their nominal rates")
        points = {}
        for a, nr in nominal.items():
            used = nr
            if p.load_from == "cpu" and calibrated[a] is not None:
                used = calibrated[a]
            self.meta["rates"][a] = used
            points[a] = {"nominal": nr, "calibrated": calibrated[a], "rate": used,
                         "predicted": offered(self.meta, seq, cost, sent_rate(used))}
        self.meta["calibration"] = {"dry_rate": r["rate"], "dry_arrivals": len(seq),
                                    "dry_duration": r["duration"], "window": list(window),
                                    "points": points}
        log("calibrated rates: " + "; ".join(
            f"alpha {a}: {v['rate']:.2f}/s (nominal {v['nominal']:.2f}), offers "
            f"{v['predicted']['window'] * 100:.1f} % of the CPUs in the window" for a, v in
            points.items()) + ("" if p.load_from == "cpu" else f" (load from {p.load_from}: "
                               "nominal rates used)"))
        self.save()

    def open_loop(self):
        """Every load point: each configuration's open-loop run, `reps` times, in
        rep_order. The first repetition of each is meta["open_loop"]'s (which the
        tables and plots read), the others go to meta["open_loop_reps"]."""
        p = self.plan
        dry = dry_sequence(self.meta, self.run_dir)
        for i, alpha in enumerate(p.alphas):
            if i > 0:
                self.recalibrate(alpha, p.alphas[i - 1], dry)
            rate = self.meta["rates"][str(alpha)]
            for rep in range(p.reps):
                for cfg in rep_order(self.configs, i, rep):
                    if not self.use(cfg):
                        continue
                    st = self.open_loop_point(cfg, alpha, rate, rep, dry)
                    if st is None:
                        continue
                    if rep == 0:
                        self.meta["open_loop"].setdefault(cfg["name"], {})[str(alpha)] = st
                    else:
                        self.meta.setdefault("open_loop_reps", {}).setdefault(
                            cfg["name"], {}).setdefault(str(alpha), []).append(st)
                    self.save()
                    self.isolated_between(point_name(cfg["name"], alpha, rep))

    def open_loop_point(self, cfg: dict, alpha: float, rate: float, rep: int,
                        dry: list | None) -> dict | None:
        """One open-loop point of `cfg` at `alpha` (repetition `rep`) on its running
        server, analysed; None when its server could not be started again after a
        failed run."""
        p = self.plan
        name = point_name(cfg["name"], alpha, rep)
        what = f"{cfg['name']}, alpha {alpha}" + (f", repetition {rep + 1}" if p.reps > 1 else "")
        if cfg.get("prime_s"):
            # a configuration that learns from the workload (the tuner) first sees
            # `prime_s` seconds of the same arrivals, not measured
            log(f"open loop: {what}: {cfg['prime_s']} s to prime")
            workload.open_loop(self.server, self.workload_for(cfg),
                               self.conn(cfg, workload.TPCH_DB), rate, int(cfg["prime_s"]), p.clients, SEED + 1,
                               self.run_dir / "open_loop", name + "_prime")
        log(f"open loop: {what}, {rate:.2f} arrivals/s, {p.ol_duration} s")
        r = self.probed_point(cfg, rate, name)
        retried = None
        if r["rc"] != 0 or r["server_crash"]:
            # e.g. pg_stride.so replaced under a running server: run the point once
            # more on a freshly started server, and say so in the report
            retried = "; ".join(r["server_crash"]) or f"pgbench exited with {r['rc']}"
            log(f"  the run failed ({retried}); running the point again")
            self.current = None
            if not self.use(cfg):
                return None
            r = self.probed_point(cfg, rate, name)
        probe = r.get("probe_ms")
        st = {"rate": rate, "nominal_rate": self.meta["nominal_rates"][str(alpha)],
              "alpha": alpha, "rep": rep, "rc": r["rc"], "timed_out": r["timed_out"],
              "cpu": r["cpu"], "clients": p.clients, "server_crash": r["server_crash"],
              "retried_after": retried, "probe_ms": probe,
              "pgbench_fifo": r["pgbench_fifo"], "prediction": r.get("prediction")}
        st.update(analyse_open_loop(self.meta, self.run_dir, cfg["name"], alpha, dry, rep=rep))
        if cfg.get("library") and self.server.guc_exists("pg_stride.trace"):
            # what bench/sim_gap.py replays in the simulator
            simgap.dump_trace(self.server, self.run_dir / "open_loop" / f"{name}.trace.csv")
            st["scheduler"] = simgap.scheduler_counts(self.server)
        c = st["classes"]
        log("  " + "  ".join(
            f"{cls}: mean {c[cls]['slowdown']['mean']:.2f} p99 {c[cls]['slowdown']['p99']:.2f}"
            for cls in ("short", "long") if cls in c) +
            f"  max in system {st.get('max_in_system')}  max schedule lag "
            f"{st.get('max_lag_s', 0) * 1000:.1f} ms  server CPU "
            f"{r['cpu']['server_cpu_util'] * 100:.0f}%" +
            (f"  speed probe {probe[0]:.1f} / {probe[1]:.1f} ms" if probe else "") +
            "".join(f"  {k} {st['scheduler'][k]}" for k in ("yield_requests", "cpu_swaps",
                                                            "cpu_share_swaps")
                    if k in st.get("scheduler", {})) +
            analysis.prediction_summary(st.get("prediction")))
        return st

    def isolated_again(self):
        """The isolated latencies measured once more, after the open loop, and the
        slowdowns' denominators pooled from every round (pool_denominators); the
        open-loop points are analysed again with them.

        The machine is shared, and its speed drifts: in one run the speed probe took
        72.5 ms with the isolated runs and 60-65 ms around the points, which understated
        every slowdown by some 15 %.  The rates keep the first set's CPU, on which the
        calibration rests; each point's `other_denominators` holds its short and long
        slowdowns with the set before and the set after the open loop, each alone, to
        show how much the pooling matters."""
        at_points = [x for *_, st in every_point(self.meta) for x in (st.get("probe_ms") or [])]
        if not at_points:
            return
        self.use(self.stock())
        log("isolated latencies again, after the open loop")
        again = workload.measure_isolated(self.server, self.wl, self.plan.iso_runs,
                                          self.run_dir / "isolated_after", SEED)
        others = pool_denominators(
            self.meta, {f"{q}|{cls}": v for (q, cls), v in again.items()},
            workload.speed_probe(self.server, self.probe), statistics.median(at_points))
        self.iso = analysis.isolated_medians(self.meta["isolated"])
        den = self.meta["denominators"]
        log(f"denominators: {den['rounds']} rounds of isolated runs, pooled (speed probes " + "; ".join(
            f"{s['when']}: {s['probe_ms']:.1f} ms" for s in den["sets"]) +
            f"; median around the points {den['points_probe_ms']:.1f} ms)")
        reanalyse(self.meta, self.run_dir)
        other_denominators(self.meta, self.run_dir, others)
        self.save()

    def recalibrate(self, alpha: float, before: float, dry: list | None):
        """Calibrates load point `alpha`'s rate again, just before its points, on the
        machine's speed during the points at α `before`: the machine sped up by 10 %
        between the isolated runs the first calibration rests on and the points an hour
        later, and stock's machine was 89 % busy at α = 0.95
        (bench/results/archive/full_0951). The isolated rounds after those points
        (isolated_between) against the isolated runs' give the speed
        (analysis.speed_scale), which scales each query's CPU; every configuration of one
        α still gets the same arrivals."""
        p = self.plan
        point = (self.meta.get("calibration") or {}).get("points", {}).get(str(alpha))
        if p.load_from != "cpu" or not dry or not point or point.get("calibrated") is None:
            return
        later = [r["runs_s"] for r in self.meta.get("isolated_between", [])
                 if re.search(rf"_a{re.escape(str(before))}(_r\d+)?$", r["after"])]
        scale = analysis.speed_scale(self.meta["isolated"], later)
        if scale is None:
            return
        cost = {k: c * scale for k, c in script_cpu(self.meta).items()}
        rate = analysis.calibrate_rate(dry, cost, float(alpha), measured_window(asdict(p)),
                                       ncpus(), point["rate"])
        if rate is None:
            return
        point.update(speed_scale=scale, first_rate=point["rate"], calibrated=rate, rate=rate,
                     predicted=offered(self.meta, dry, cost, sent_rate(rate)))
        self.meta["rates"][str(alpha)] = rate
        log(f"calibrated again for alpha {alpha}: the isolated rounds after the points at "
            f"alpha {before} took x{scale:.3f} the isolated runs' time; {rate:.2f} arrivals/s "
            f"(first {point['first_rate']:.2f}/s)")
        self.save()

    def isolated_between(self, point: str):
        """One more round of isolated executions (workload.SPREAD_RUNS per query) on the
        stock server, right after the open-loop point `point`, for the denominators
        (pool_denominators).  Its executions are kept apart from meta["isolated"] until
        the open loop ends, which the points' analysis divides by meanwhile."""
        self.use(self.stock())
        done = self.meta.setdefault("isolated_between", [])
        log(f"isolated latencies: round {len(done) + 1} between the points")
        got = workload.isolated_round(self.server, self.wl, workload.SPREAD_RUNS,
                                      self.run_dir / "isolated_between",
                                      SEED + workload.SPREAD_ROUNDS + 1 + len(done), f"_{point}")
        done.append({"after": point, "runs_s": {
            f"{q}|{cls}": analysis.isolated_latency([txns])["runs_s"]
            for (q, cls), (txns, _) in got.items()}})

    def probed_point(self, cfg: dict, rate: float, name: str) -> dict:
        """One open-loop point (workload.open_loop) between two speed probes; a run that
        failed (its server may be down) gets no probe after it, and none in its result."""
        p = self.plan
        before = workload.speed_probe(self.server, self.probe)
        quality = self.server.prediction_quality() if cfg.get("library") else None
        r = workload.open_loop(self.server, self.workload_for(cfg),
                               self.conn(cfg, workload.TPCH_DB),
                               rate, p.ol_duration, p.clients, SEED,
                               self.run_dir / "open_loop", name)
        if r["rc"] == 0 and not r["server_crash"]:
            r["probe_ms"] = [before, workload.speed_probe(self.server, self.probe)]
            if quality is not None:
                r["prediction"] = analysis.prediction_counts(
                    quality, self.server.prediction_quality())
        return r

    def rate_at(self, alpha: float) -> float:
        """The arrival rate offering α of the CPUs: the calibrated one if α was a point of
        the open loop, else the highest point's scaled by α (the same arrival sequence
        at another speed)."""
        rates = self.meta["rates"]
        if str(alpha) in rates:
            return rates[str(alpha)]
        top = max(rates, key=float)
        return rates[top] * alpha / float(top)

    def app_pool(self):
        """The open loop's arrivals at α `app_pool_alpha` through `app_pool_clients`
        connections, `app_pool_reps` times per configuration (order alternating): an
        arrival whose connections are all busy waits at the client, first come first
        served, where no scheduler sees it; its latency counts from its arrival (pgbench
        measures from the scheduled start)."""
        p = self.plan
        rate = self.rate_at(p.app_pool_alpha)
        outdir = self.run_dir / "app_pool"
        for rep in range(p.app_pool_reps):
            order = list(self.configs) if rep % 2 == 0 else list(reversed(self.configs))
            for cfg in order:
                if not self.use(cfg):
                    continue
                name = f"ap_{cfg['name']}_r{rep + 1}"
                if cfg.get("prime_s"):
                    log(f"application pool: {cfg['name']}: {cfg['prime_s']} s to prime")
                    workload.open_loop(self.server, self.workload_for(cfg),
                                       self.conn(cfg, workload.TPCH_DB), rate,
                                       int(cfg["prime_s"]), p.app_pool_clients, SEED + 1,
                                       outdir, name + "_prime")
                log(f"application pool: {cfg['name']}, round {rep + 1}, {p.app_pool_clients} "
                    f"connections, alpha {p.app_pool_alpha}, {rate:.2f} arrivals/s, "
                    f"{p.ol_duration} s")
                r = workload.open_loop(self.server, self.workload_for(cfg),
                                       self.conn(cfg, workload.TPCH_DB), rate, p.ol_duration,
                                       p.app_pool_clients, SEED, outdir, name)
                txns = analysis.parse_logs(str(outdir / name))
                start, end = measured_window(self.meta["plan"])
                st = analysis.open_loop_stats(
                    txns, {int(k): tuple(v) for k, v in self.meta["script_info"].items()},
                    analysis.isolated_medians(self.meta["isolated"]), warmup_s=start, end_s=end)
                st.update(rc=r["rc"], cpu=r["cpu"], server_crash=r["server_crash"])
                self.meta.setdefault("app_pool", {}).setdefault(cfg["name"], []).append(st)
                c = st["classes"]
                log("  " + "  ".join(
                    f"{cls}: mean {c[cls]['slowdown']['mean']:.2f} p99 "
                    f"{c[cls]['slowdown']['p99']:.2f} ({c[cls]['throughput_qps']:.3f} q/s)"
                    for cls in ("short", "long") if cls in c) +
                    f"  max in system {st.get('max_in_system')}")
                self.save()

    def mixed(self):
        p = self.plan
        for cfg in self.configs:
            if not self.use(cfg):
                continue
            log(f"mixed OLTP + analytics: {cfg['name']}, {p.mixed_duration} s")
            r = workload.mixed(self.server, self.workload_for(cfg), self.conn(cfg, workload.TPCH_DB),
                               self.conn(cfg, workload.OLTP_DB), p.mixed_duration,
                               p.mixed_tpch_clients, p.mixed_oltp_clients, SEED,
                               self.run_dir / "mixed", f"mx_{cfg['name']}")
            tpch = analysis.closed_loop_stats(analysis.parse_logs(r["tpch_prefix"]),
                                              p.mixed_duration, self.wl.script_info, self.iso)
            tpcb = analysis.closed_loop_stats(analysis.parse_logs(r["tpcb_prefix"]),
                                              p.mixed_duration)
            self.meta["mixed"][cfg["name"]] = {"tpch": tpch, "tpcb": tpcb, "cpu": r["cpu"],
                                               "rc": r["rc"]}
            log(f"  TPC-B {tpcb['tps']:.0f} tps, p99 {tpcb['latency']['p99'] * 1000:.1f} ms; "
                f"TPC-H {tpch['tps']:.2f} q/s ({tpch.get('work_per_s', 0):.2f} isolated-s/s)")
            self.save()

    def overhead(self):
        p = self.plan
        oh = self.cfgfile.get("overhead", {})
        variants = [("not loaded", [])]
        note = stride_library_problem()
        if note is None:
            self.current = "overhead-loaded"
            try:
                self.server.start(expand(oh.get("loaded", [])), "overhead-loaded")
                missing = [g for g in oh.get("requires", []) if not self.server.guc_exists(g)]
            except RuntimeError as e:
                missing = ["(server did not start: " + str(e).strip().splitlines()[-1][:200] + ")"]
            if missing:
                note = "the installed pg_stride does not define " + ", ".join(missing)
            else:
                variants.append(("loaded, enabled", expand(oh.get("loaded", []))))
        if len(variants) == 1:
            # Without the library, an A/A comparison: the noise floor of the measurement.
            variants.append(("not loaded (A/A)", []))
            log(f"overhead: {note}; measuring stock against stock (noise floor)")
        self.meta["overhead"] = {"variants": [v[0] for v in variants], "note": note, "rounds": []}
        for rnd in range(p.overhead_rounds):
            order = variants if rnd % 2 == 0 else list(reversed(variants))
            row = {}
            for label, settings in order:
                self.server.stop_bouncer()
                self.current = "overhead"
                try:
                    self.server.start(settings, "overhead")
                except RuntimeError as e:
                    if not settings:
                        raise
                    log(f"overhead round {rnd + 1}: {label} did not start, left out: {e}")
                    continue
                self.server.prewarm(workload.OLTP_DB, ["public"])
                log(f"overhead round {rnd + 1}/{p.overhead_rounds}: {label}")
                vno = [v[0] for v in variants].index(label)
                row[label] = workload.overhead_pair(
                    self.server, p.overhead_duration, p.overhead_clients, SEED + rnd,
                    self.run_dir / "overhead", f"oh_r{rnd}_v{vno}")
                log("  " + ", ".join(f"{k}: {v['tps']:.0f} tps p99 {v['p99_ms']:.2f} ms"
                                     for k, v in row[label].items()))
            self.meta["overhead"]["rounds"].append(row)
            self.save()

    def execute(self):
        t0 = time.monotonic()
        self.setup()
        self.isolated()
        if "phases" in self.plan.parts:
            from . import phases
            phases.run(self)
        if "open" in self.plan.parts:
            self.calibrate()
            self.open_loop()
            self.isolated_again()
        if "app-pool" in self.plan.parts:
            if "open" not in self.plan.parts:
                self.calibrate()
            self.app_pool()
        if "mixed" in self.plan.parts:
            self.mixed()
        if "oltp" in self.plan.parts:
            from . import oltp
            oltp.run(self)
        if "overhead" in self.plan.parts:
            self.overhead()
        self.meta["elapsed_s"] = time.monotonic() - t0
        self.meta["finished"] = dt.datetime.now().isoformat(timespec="seconds")
        self.meta["machine"]["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        so = pkglibdir() / "pg_stride.so"
        if so.exists():
            end = dt.datetime.fromtimestamp(so.stat().st_mtime).isoformat(timespec="seconds")
            if end != self.meta["machine"].get("pg_stride_so_mtime"):
                self.meta["machine"]["pg_stride_so_changed"] = end
        self.save()


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="bench/run", description="pg_stride benchmark (wagner2021 §5 on PostgreSQL). "
        "bench/run --selftest runs the analysis self-test. See bench/README.md.")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", action="store_true", help="one load point, short runs (minutes)")
    g.add_argument("--full", action="store_true", help="the full sweep (about 80 minutes)")
    g.add_argument("--tuner-phases", action="store_true",
                   help="three-phase arrival sequence (mix, longer mix, mix) per configuration "
                   "(default stride-defaults,stride-tuner); writes bench/results/TUNER.md")
    g.add_argument("--oltp", action="store_true",
                   help="transactions beside analytics: TPC-B at a fixed rate (p99 latency) "
                   "and back to back (throughput), each beside two TPC-H clients, --reps "
                   "rounds (default 3) of --duration s per form (default 30), configurations "
                   "rotating (default stock,pgbouncer,stock-serial,stride-defaults); writes "
                   "bench/results/OLTP.md")
    g.add_argument("--pool", action="store_true",
                   help="the pool (parallel_mode = pool) against PostgreSQL's workers and no "
                   "workers: TPC-H results at both scales, latency of small parallel "
                   "queries; writes bench/results/POOL.md")
    g.add_argument("--report", metavar="RUN_DIR", help="rebuild the report of a finished run")
    ap.add_argument("--configs", help="comma-separated configuration names, run in that order "
                    "(default: all, in bench/configs.toml's order)")
    ap.add_argument("--parts", help="comma-separated subset of open,app-pool,mixed,overhead "
                    "(app-pool: the full run's default, not the quick run's)")
    ap.add_argument("--app-pool-clients", type=int, metavar="N",
                    help="the application-pool form's client connections (default 16)")
    ap.add_argument("--app-pool-rounds", type=int, metavar="N",
                    help="the application-pool form's rounds per configuration, all with the "
                    "same arrivals, the order alternating (default 2)")
    ap.add_argument("--workload", choices=["tpch", "synthetic"],
                    help="--quick / --full: the TPC-H queries at two scales (tpch, the "
                    "default) or a synthetic event log whose two classes are different "
                    "statements, sizes spread over three orders of magnitude (synthetic; "
                    "bench/stride_bench/synthetic.py)")
    ap.add_argument("--small-sf", type=float)
    ap.add_argument("--large-sf", type=float)
    ap.add_argument("--duration", type=int, help="seconds per open-loop point")
    ap.add_argument("--alphas", help="comma-separated load factors")
    ap.add_argument("--load-from", choices=["cpu", "cpu-mean", "latency"],
                    help="α as the share of the machine's CPU capacity that the arrivals "
                    "pgbench sends need (cpu, the default: rate calibrated by a dry run), "
                    "the same from the mix's mean CPU per arrival (cpu-mean, not calibrated) "
                    "or as rate x mean isolated latency (latency, wagner2021 §5.1)")
    ap.add_argument("--out", help="write RESULTS.md and plots here instead of the default")
    ap.add_argument("--phase-duration", type=int,
                    help="--tuner-phases: seconds per phase (default 120)")
    ap.add_argument("--reps", type=int,
                    help="repetitions: of each open-loop point of --quick and --full (default "
                    "1) and of --oltp's rounds (default 3), the order rotating; of "
                    "--tuner-phases (default 2), the order alternating")
    ap.add_argument("--prime", type=int,
                    help="--tuner-phases: seconds of unmeasured phase-A arrivals before phase A "
                    "(default: the largest prime_s of the configurations)")
    args = ap.parse_args(argv)
    if args.workload and not (args.quick or args.full):
        ap.error("--workload applies to --quick and --full")
    if args.workload == "synthetic" and (args.small_sf or args.large_sf):
        ap.error("--small-sf and --large-sf are TPC-H's scales; the synthetic workload has none")

    from . import report
    if args.report:
        rd = Path(args.report)
        meta = json.loads((rd / "results.json").read_text())
        if meta["plan"]["mode"] == "phases":
            from . import phases
            phases.reanalyse(meta, rd)
            (rd / "results.json").write_text(json.dumps(meta, indent=1))
            tuner_report.write(meta, rd, publish=not args.out and tuner_report.publishable(meta),
                               outdir=Path(args.out) if args.out else None)
            return 0
        if meta["plan"]["mode"] == "oltp":
            from . import oltp
            out = Path(args.out) if args.out else rd
            oltp.write_report(meta, out / "OLTP.md")
            return 0
        reanalyse(meta, rd)
        (rd / "results.json").write_text(json.dumps(meta, indent=1))
        report.write(meta, rd, publish=(meta["plan"]["mode"] == "full" and not args.out
                                        and meta.get("workload", "tpch") == "tpch"),
                     outdir=Path(args.out) if args.out else None)
        return 0

    only = configs_named(args.configs)
    try:
        # An unknown name fails here, before the lock, a run directory or a server.
        select_configs(load_configs()["config"], only)
    except ValueError as e:
        ap.error(str(e))
    try:
        # Held until this process exits.
        lock = claim_machine(OUT / "bench.lock")  # noqa: F841
    except MachineBusy as busy:
        print(f"bench/run: another run (pid {busy}) is using the benchmark's server and "
              "the machine; wait for it to end, or stop it (its servers stop with it)",
              file=sys.stderr)
        return 1

    if args.pool:
        from . import pool
        run_dir = OUT / "runs" / (dt.datetime.now().strftime("%Y%m%d-%H%M%S") + "-pool")
        run_dir.mkdir(parents=True, exist_ok=True)
        log(f"pool run into {run_dir}")
        signal.signal(signal.SIGTERM, _sigterm)
        return pool.main(run_dir, expand(load_configs()["base"]["settings"]),
                         args.small_sf or Plan.small_sf, args.large_sf or Plan.large_sf,
                         publish=not args.out)

    plan = make_plan("quick" if args.quick else "phases" if args.tuner_phases
                     else "oltp" if args.oltp else "full")
    if args.workload:
        plan.workload = args.workload
        # the mixed part runs TPC-H clients beside TPC-B ones
        plan.parts = [p for p in plan.parts if p != "mixed"]
    if args.small_sf:
        plan.small_sf = args.small_sf
    if args.large_sf:
        plan.large_sf = args.large_sf
    if args.duration:
        plan.ol_duration = args.duration
        plan.oltp_duration = args.duration
    if args.alphas:
        plan.alphas = [float(a) for a in args.alphas.split(",")]
    if args.load_from:
        plan.load_from = args.load_from
    if args.parts:
        plan.parts = args.parts.split(",")
        if plan.workload == "synthetic" and "mixed" in plan.parts:
            ap.error("the mixed part runs TPC-H clients: not with --workload synthetic")
    if args.app_pool_clients:
        plan.app_pool_clients = args.app_pool_clients
    if args.app_pool_rounds is not None:
        if args.app_pool_rounds < 1:
            ap.error("--app-pool-rounds needs at least 1")
        plan.app_pool_reps = args.app_pool_rounds
    if args.phase_duration:
        plan.phase_duration = args.phase_duration
    if args.reps is not None:
        if args.reps < 1:
            ap.error("--reps needs at least 1")
        plan.reps = args.reps
    if args.prime is not None:
        plan.prime_s = args.prime
    if plan.mode == "full":
        only = only or load_configs()["full"]["configs"]
    if plan.mode == "phases":
        if args.parts:
            ap.error("--parts does not apply to --tuner-phases")
        if len(plan.alphas) != 1:
            ap.error("--tuner-phases runs at one load: give one --alphas value")
        only = only or PHASES_CONFIGS
    if plan.mode == "oltp":
        from . import oltp
        only = only or oltp.DEFAULT_CONFIGS

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = OUT / "runs" / f"{stamp}-{plan.mode}"
    run_dir.mkdir(parents=True, exist_ok=True)
    latest = OUT / "runs" / f"latest-{plan.mode}"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run_dir.name)
    log(f"{plan.mode} run into {run_dir}")

    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGHUP, _sigterm)
    runner = Runner(plan, only, run_dir)
    ok = False
    try:
        runner.execute()
        ok = True
    except KeyboardInterrupt:
        log("interrupted; stopping the servers")
        return 130
    finally:
        runner.server.shutdown()
        runner.huge_pages.release()
        runner.save()
    if ok and plan.mode == "oltp":
        from . import oltp
        out = Path(args.out) if args.out else RESULTS_DIR
        out.mkdir(parents=True, exist_ok=True)
        oltp.write_report(runner.meta, out / "OLTP.md")
        log(f"wrote {out / 'OLTP.md'}")
    elif ok and plan.mode == "phases":
        tuner_report.write(runner.meta, run_dir,
                           publish=not args.out and tuner_report.publishable(runner.meta),
                           outdir=Path(args.out) if args.out else None)
    elif ok:
        # RESULTS.md is the TPC-H run's, of every configuration and part
        publish = (plan.mode == "full" and plan.workload == "tpch" and not args.out
                   and not args.configs and not args.parts)
        report.write(runner.meta, run_dir, publish=publish,
                     outdir=Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
