"""The tuner phases run (`bench/run --tuner-phases`): a three-phase arrival sequence
A -> B -> C at one load, the same for every configuration, run once per configuration
and repetition on a freshly started server, with the tuner's view and CPU recorded.

  A  the usual mix: 3:1 TPC-H at the small ("short") and large ("long") scale
  B  the short slot draws from the large scale too (its queries about 10x longer); the
     long slot is unchanged.  Same alpha, so fewer arrivals per second
  C  A again (the same seed: exactly A's arrivals)

Before A every configuration gets `prime` seconds of A-mix arrivals (another seed), not
measured, so the tuner has traced the workload and phase A does not start from an
empty system for anyone."""

import json
import time
from pathlib import Path

from . import analysis, workload
from .common import log
from .pgserver import _proc_stat

# name, the class the short slot draws its queries from, seed offset
PHASES = [("A", "short", 0), ("B", "long", 2), ("C", "short", 0)]
PRIME_SEED_OFFSET = 1
from .tuner_report import BUCKET_S  # noqa: E402  (one definition)
POLL_S = 5.0

REFRESH_SQL = ("select coalesce(json_agg(t), '[]') from (select "
               "extract(epoch from refreshed_at)::float8 as at, * from pg_stride.tuner) t")
SCHED_SQL = ("select row_to_json(s) from (select tuner_pid, decay_lambda, decay_start, "
             "decay_tuned from pg_stride.scheduler) s")


def phase_window(duration: float) -> tuple:
    """[start, end) of a phase's measured arrivals after its first arrival: from the
    start (the adaptation is what is measured; the system is not empty, the phase before
    or the priming ran), ending 5 % (at least 3 s) early so that every configuration is
    measured on the same arrivals."""
    return 0.0, duration - max(3.0, 0.05 * duration)


def phase_workloads(wl: workload.Workload, iso: dict) -> dict:
    """Per phase name: (Workload, isolated latencies keyed by (query, slot class))."""
    scripts_b = {(q, cls): wl.scripts[(q, "long")] for q, cls in wl.order}
    wl_b = workload.Workload(scripts_b)
    out = {}
    for name, short_from, _ in PHASES:
        out[name] = (wl if short_from == "short" else wl_b,
                     analysis.phase_isolated(iso, short_from))
    return out


def analyse_phase(meta: dict, run_dir: Path, step: dict) -> dict:
    script_info = {int(k): tuple(v) for k, v in meta["script_info"].items()}
    iso = analysis.isolated_medians(meta["isolated"])
    short_from = next(s for n, s, _ in PHASES if n == step["phase"])
    iso_p = analysis.phase_isolated(iso, short_from)
    txns = analysis.parse_logs(str(run_dir / "phases" / Path(step["log_prefix"]).name))
    start, end = phase_window(step["duration"])
    st = analysis.open_loop_stats(txns, script_info, iso_p, warmup_s=start, end_s=end)
    st["arrivals"] = len(txns)
    st["ran_out_of_clients"] = st.get("max_in_system", 0) >= meta["plan"]["clients"]
    if txns:
        for cls in ("short", "long"):
            st[f"rolling_{cls}"] = analysis.rolling_mean(
                txns, script_info, iso_p, cls, BUCKET_S, st["first_arrival"], end)
    return st


def reanalyse(meta: dict, run_dir: Path):
    for r in meta.get("phases", {}).get("runs", []):
        for step in r["steps"]:
            if step.get("phase"):
                r["phases"][step["phase"]] = analyse_phase(meta, run_dir, step)


class Poller:
    """Reads the tuner view and the decay in force every POLL_S seconds during a
    sequence (the view keeps only the last 64 refreshes)."""

    def __init__(self, server, enabled: bool):
        self.server = server
        self.enabled = enabled
        self.refreshes = []
        self.timeline = []
        self.last = 0.0
        self.errors = 0

    def read(self):
        if not self.enabled:
            return
        self.last = time.monotonic()
        try:
            rows = json.loads(self.server.psql(REFRESH_SQL, db="postgres") or "[]")
            self.refreshes = analysis.merge_refreshes(
                self.refreshes, [dict(r, refreshed_at=r["at"]) for r in rows])
            s = json.loads(self.server.psql(SCHED_SQL, db="postgres") or "{}")
            s["at"] = time.time()
            if not self.timeline or any(self.timeline[-1].get(k) != s.get(k) for k in
                                        ("decay_lambda", "decay_start", "decay_tuned")):
                self.timeline.append(s)
        except (RuntimeError, ValueError) as e:
            self.errors += 1
            if self.errors <= 3:
                log(f"  reading the tuner view failed: {str(e).strip()[:200]}")

    def tick(self):
        if time.monotonic() - self.last >= POLL_S:
            self.read()

    def scheduler(self) -> dict:
        try:
            return json.loads(self.server.psql(SCHED_SQL, db="postgres") or "{}")
        except (RuntimeError, ValueError):
            return {}


def proc_cpu(pid) -> float | None:
    if not pid:
        return None
    st = _proc_stat(int(pid))
    return st[1] if st else None


def run(runner) -> None:
    """The phases run for every selected configuration and repetition (runner: the
    cli.Runner after setup() and isolated())."""
    p = runner.plan
    meta = runner.meta
    alpha = p.alphas[0]
    iso = runner.iso
    wls = phase_workloads(runner.wl, iso)
    rates = {name: alpha / wl.mean_isolated(iso_p) for name, (wl, iso_p) in wls.items()}
    prime_s = max([int(c.get("prime_s", 0)) for c in runner.configs] + [0])
    if p.prime_s is not None:
        prime_s = p.prime_s
    meta["phases"] = {
        "alpha": alpha, "duration": p.phase_duration, "prime_s": prime_s, "reps": p.reps,
        "rates": rates,
        "mean_isolated_s": {n: wl.mean_isolated(iso_p) for n, (wl, iso_p) in wls.items()},
        "phases": [{"name": n, "short_from": s, "seed": runner.seed + o} for n, s, o in PHASES],
        "runs": []}
    log("phases: " + ", ".join(f"{n}: d = {meta['phases']['mean_isolated_s'][n] * 1000:.0f} ms, "
                               f"{rates[n]:.2f} arrivals/s" for n, _, _ in PHASES) +
        f"; {p.phase_duration} s each after {prime_s} s priming")
    order = list(runner.configs)
    for rep in range(p.reps):
        for cfg in (order if rep % 2 == 0 else list(reversed(order))):
            runner.current = None            # a fresh server (and tuner) for every sequence
            if not runner.use(cfg):
                continue
            name = cfg["name"]
            server = runner.server
            has_view = True
            try:
                server.psql("create extension if not exists pg_stride", db="postgres")
            except RuntimeError as e:
                has_view = False
                log(f"  no pg_stride views: {str(e).strip()[:200]}")
            poller = Poller(server, has_view)
            sched0 = poller.scheduler() if has_view else {}
            pid = sched0.get("tuner_pid")
            cpu0 = proc_cpu(pid)
            t0 = time.time()
            steps = []
            if prime_s > 0:
                steps.append({"name": f"ph_{name}_r{rep}_prime", "wl": wls["A"][0],
                              "rate": rates["A"], "duration": prime_s,
                              "seed": runner.seed + PRIME_SEED_OFFSET, "phase": None})
            for ph, _, off in PHASES:
                steps.append({"name": f"ph_{name}_r{rep}_{ph}", "wl": wls[ph][0],
                              "rate": rates[ph], "duration": p.phase_duration,
                              "seed": runner.seed + off, "phase": ph})
            log(f"phases: {name}, repetition {rep + 1}/{p.reps}: " +
                " -> ".join(f"{s['phase'] or 'prime'} {s['duration']} s" for s in steps))
            poller.read()
            r = workload.phase_sequence(server, runner.conn(cfg, workload.TPCH_DB), steps,
                                        p.clients, runner.run_dir / "phases", poller.tick)
            poller.read()
            cpu1 = proc_cpu(pid)
            t1 = time.time()
            sched1 = poller.scheduler() if has_view else {}
            for s, st in zip(r["steps"], steps):
                s["phase"] = st["phase"]
            run_rec = {"config": name, "rep": rep, "steps": r["steps"], "cpu": r["cpu"],
                       "wall_s": t1 - t0, "server_crash": r["server_crash"],
                       "scheduler_start": sched0, "scheduler_end": sched1,
                       "tuner": {"pid": pid, "pid_end": sched1.get("tuner_pid"),
                                 "cpu_start_s": cpu0, "cpu_end_s": cpu1,
                                 "cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None
                                 else None,
                                 "share_of_one_cpu": analysis.cpu_share(cpu0, cpu1, t1 - t0)
                                 if cpu0 is not None and cpu1 is not None else None},
                       "refreshes": poller.refreshes, "decay_timeline": poller.timeline,
                       "phases": {}}
            for s in r["steps"]:
                if s["phase"]:
                    run_rec["phases"][s["phase"]] = analyse_phase(meta, runner.run_dir, s)
            meta["phases"]["runs"].append(run_rec)
            msg = []
            for ph, _, _ in PHASES:
                c = run_rec["phases"][ph].get("classes", {})
                msg.append(f"{ph}: short {c.get('short', {}).get('slowdown', {}).get('mean', float('nan')):.2f}"
                           f"/{c.get('short', {}).get('slowdown', {}).get('p99', float('nan')):.2f}"
                           f" long {c.get('long', {}).get('slowdown', {}).get('mean', float('nan')):.2f}")
            tn = run_rec["tuner"]
            log("  " + "  ".join(msg) + f"  (mean/p99); server CPU "
                f"{r['cpu']['server_cpu_util'] * 100:.0f}%" +
                (f"; tuner {tn['cpu_s']:.2f} s CPU ({tn['share_of_one_cpu'] * 100:.2f}% of a CPU)"
                 if tn["cpu_s"] is not None else "") +
                f"; {len(poller.refreshes)} refreshes")
            runner.save()
