"""Where the real system loses against its simulator (bench/sim_gap.py).

A pg_stride configuration with `pg_stride.trace = on` records, per CPU-scheduled
statement, its arrival, admission and finish times, the CPU it was charged in CPU slots
and the CPU it used in all, its waits for slots and their hand-offs, the wall time its
processes held slots and the CPU of slices the yield points did not cut
(`pg_stride.trace`).  This module dumps that trace after an open-loop point, matches its
records with pgbench's transactions, replays the statements (arrival, charged CPU,
processes) in `pg_stride-sim` with the configuration's scheduler settings, and accounts
for the difference between the real and the simulated response time of each query."""

import bisect
import csv
import json
import subprocess
from pathlib import Path

from . import analysis
from .common import BENCH, expand, load_configs, ncpus, parse_settings

REPO = BENCH.parent


def dump_trace(server, path):
    """Writes the server's trace (every finished statement the ring still holds) as CSV,
    arrival as Unix epoch seconds."""
    # The view comes from the extension's SQL, which a data directory keeps from the
    # CREATE EXTENSION of an earlier build: create it afresh for the installed one.
    server.psql("DROP EXTENSION IF EXISTS pg_stride")
    server.create_extension("postgres", "pg_stride")
    path.write_text(server.psql(
        "COPY (SELECT extract(epoch FROM arrival) AS arrival_epoch, * "
        "FROM pg_stride.trace) TO STDOUT WITH (FORMAT csv, HEADER)") + "\n")


SCHEDULER_COUNTS = ("decisions", "switches", "lent_blocked", "yield_requests",
                    "cpu_swaps", "cpu_share_swaps")


def scheduler_counts(server) -> dict:
    """The counters of `pg_stride.scheduler` since the server started (one
    configuration's point), those the installed build has."""
    row = json.loads(server.psql("SELECT row_to_json(s) FROM pg_stride.scheduler s"))
    return {k: row[k] for k in SCHEDULER_COUNTS if k in row}


def read_trace(path: Path) -> list:
    """The rows dump_trace wrote, numbers as floats (the 64-bit query identifier as its
    text, which a float would round)."""
    rows = []
    with open(path) as fh:
        for r in csv.DictReader(fh):
            row = dict(r)
            for k, v in r.items():
                if k not in ("arrival", "group_name", "failed", "query_id"):
                    row[k] = float(v) if v != "" else None
            row["failed"] = r["failed"] == "t"
            row["finish_epoch"] = row["arrival_epoch"] + row["finished_ms"] / 1000
            rows.append(row)
    rows.sort(key=lambda r: r["arrival_epoch"])
    return rows


def match(txns: list, rows: list, tolerance_s: float = 0.02) -> dict:
    """pgbench transaction index -> trace row index.  A statement ends (its ExecutorEnd,
    where the trace takes its finish time) a fraction of a millisecond before pgbench
    sees its result, and after pgbench sent it; completions rarely fall within a
    millisecond of each other at these rates, so each transaction takes the unused
    record whose finish is nearest its completion, closest pairs first."""
    cands = []
    order = sorted(range(len(rows)), key=lambda j: rows[j]["finish_epoch"])
    finishes = [rows[j]["finish_epoch"] for j in order]
    for i, t in enumerate(txns):
        if t.failed:
            continue
        lo = bisect.bisect_left(finishes, t.end_s - tolerance_s)
        hi = bisect.bisect_right(finishes, t.end_s + tolerance_s)
        for k in range(lo, hi):
            j = order[k]
            r = rows[j]
            # the statement arrived after pgbench scheduled it (small clock slack)
            if r["arrival_epoch"] >= t.arrival_s - 0.002:
                cands.append((abs(t.end_s - r["finish_epoch"]), i, j))
    cands.sort()
    used_t, used_r, pairs = set(), set(), {}
    for _, i, j in cands:
        if i in used_t or j in used_r:
            continue
        used_t.add(i)
        used_r.add(j)
        pairs[i] = j
    return pairs


def sim_settings(cfg: dict) -> dict:
    """pg_stride-sim options for a configuration's scheduler settings."""
    s = parse_settings(expand(cfg.get("settings", [])))
    slots = int(s.get("pg_stride.cpu_slots", "0")) or ncpus()
    lam = float(s.get("pg_stride.decay_lambda", "0.9"))
    return {"slots": slots, "policy": "decay" if lam < 1.0 else "fair", "lambda": lam,
            "d-start": int(s.get("pg_stride.decay_start", "8")),
            "p0": int(s.get("pg_stride.priority_initial", "10000")),
            "p-min": int(s.get("pg_stride.priority_min", "1")),
            "slice-ms": float(s.get("pg_stride.slice", "2").rstrip("ms")),
            "max-active": int(s.get("pg_stride.max_active_queries", "128")),
            # The extension always asks a lower-priority holder to end its slice.
            "preempt": "true",
            # Where a statement's priority starts: predicted from its query identifier's
            # earlier executions in the trace, as the extension does (the simulator has
            # no plan costs: a fingerprint not seen yet starts as with prediction off).
            "start": ("predicted" if s.get("pg_stride.predict", "on").lower()
                      in ("on", "true", "yes", "1", "t", "y") else "decay"),
            "group-weight": [f"{g}={w}" for g, w, _ in sim_groups(cfg).values()]}


def sim_groups(cfg: dict) -> dict:
    """The simulator's groups of a configuration with `class_groups`: class -> (group
    number: 1, 2, … in the order of the classes, 0 being the default group; weight;
    whether its queries keep the initial priority)."""
    return {cls: (i, g.get("weight", 100), bool(g.get("pinned")))
            for i, (cls, g) in enumerate(cfg.get("class_groups", {}).items(), 1)}


def replay(rows: list, classes: list, t0: float, settings: dict, workdir: Path,
           work: str = "cpu_ms", cfg: dict | None = None) -> list:
    """Replays the traced statements (arrival, charged CPU, processes) in pg_stride-sim;
    returns each one's simulated times (dicts in the rows' order). `work` is the trace
    column each statement needs of the slots: its CPU in them, or `held_ms`, the time its
    processes held them (CPU, plus runnable but not running, plus asleep). A statement
    runs in its class's group of `cfg`'s `class_groups`, if it has them."""
    groups = sim_groups(cfg or {})
    wl = workdir / "replay_workload.csv"
    res = workdir / "replay_results.csv"
    with open(wl, "w") as fh:
        fh.write("arrival_ms,cpu_ms,group,class,procs,priority,fingerprint\n")
        for r, cls in zip(rows, classes):
            g, _, keeps_p0 = groups.get(cls, (0, 100, False))
            pinned = settings["p0"] if keeps_p0 else 0
            fh.write(f"{max(0.0, r['arrival_epoch'] - t0) * 1000:.6f},{max(r[work], 0.001):.6f},"
                     f"{g},{cls},{int(r['processes'])},{pinned},{int(r.get('query_id') or 0)}\n")
    opts = []
    for k, v in settings.items():
        for x in v if isinstance(v, list) else [v]:
            opts += [f"--{k}", str(x)]
    subprocess.run(["cargo", "run", "-q", "--release", "--manifest-path",
                    str(REPO / "sched" / "Cargo.toml"), "--bin", "pg_stride-sim", "--",
                    "run", str(wl), *opts, "--results", str(res)],
                   check=True, stdout=subprocess.DEVNULL)
    with open(res) as fh:
        out = [{k: (float(v) if v not in ("",) and k != "class" else v)
                for k, v in r.items()} for r in csv.DictReader(fh)]
    # pg_stride-sim sorts by arrival; the rows are sorted by arrival too
    return out


# The parts of a query's real response time that the simulator's replay does not have,
# in the order the report lists them; each is a latency in ms on the query's critical
# path, per process for the parts its processes add up.
PARTS = [
    ("pre_base", "before the executor, as unloaded: pgbench's send, parse, plan (the least client response − server time of the same query in the run)"),
    ("pre", "before the executor, added by the load (the rest of client response − server time)"),
    ("admission", "waiting for admission"),
    ("outside", "CPU outside CPU slots (ExecutorStart, worker start-up, output), per process"),
    ("runqueue", "holding a slot, runnable but not running (another process had the CPU), per process"),
    ("asleep", "holding a slot but asleep (a lock, the client, a Gather waiting for its workers), per process"),
    ("handoff", "hand-off latency: slot given → process running, per process"),
    ("paused_runnable", "paused but runnable (a process that gave its slot up, on its way to sleep while the receiver ran on their CPU), per process"),
    ("extra_wait", "more waiting for slots than the simulator's (paused − hand-off − paused but runnable − simulated wait), per process"),
    ("unslotted_before", "runnable without a slot before the first, not paused (ExecutorStart, the first chunk of tuples): another process had the CPU, per process"),
    ("unslotted_after", "runnable without a slot after the last (ExecutorRun's end to ExecutorEnd): another process had the CPU, per process"),
    ("residual", "the rest (leader alone before and after its workers, rounding of per-process means)"),
]


def account(txns: list, rows: list, pairs: dict, sim: list, classes_by_row: list,
            script_info: dict, iso: dict, window: tuple) -> dict:
    """Per class, the mean real and simulated response and slowdown, and each part of
    the difference (PARTS), as ms and as its share of the slowdown (ms / isolated)."""
    measured = [(i, j) for i, j in pairs.items()
                if window[0] <= txns[i].arrival_s < window[1]]
    # The isolated latency has a query's parse and plan too, while the replay starts at
    # the executor: the least time before the executor each query had stands for its
    # unloaded share, the rest is what the load added.
    pre_base = {}
    for i, j in measured:
        key = script_info[txns[i].script]
        pre = txns[i].latency_s * 1000 - rows[j]["finished_ms"]
        pre_base[key] = min(pre_base.get(key, pre), pre)
    per = {}
    for i, j in measured:
        t = txns[i]
        q, cls = script_info[t.script]
        r, s = rows[j], sim[j]
        procs = max(1.0, r["processes"])
        client = t.latency_s * 1000
        server = r["finished_ms"]
        sim_lat = s["latency_ms"]
        sim_wait = max(0.0, sim_lat - s["isolated_ms"])
        paused = r["paused_ms"] / procs
        handoff = r["handoff_ms"] / procs
        # Traces of builds before these two columns have neither.
        paused_rq_ms = r.get("paused_runqueue_ms") or 0.0
        paused_rq = paused_rq_ms / procs
        runqueue = r.get("runqueue_ms")
        unslotted_rq = (0.0 if runqueue is None else max(
            0.0, runqueue - r["held_runqueue_ms"] - paused_rq_ms) / procs)
        before_rq = min(unslotted_rq, (r.get("runqueue_before_slot_ms") or 0.0) / procs)
        parts = {
            "pre_base": pre_base[(q, cls)],
            "pre": client - server - pre_base[(q, cls)],
            "admission": r["admitted_ms"],
            "outside": max(0.0, r["cpu_total_ms"] - r["cpu_ms"]) / procs,
            "runqueue": r["held_runqueue_ms"] / procs,
            "asleep": max(0.0, r["held_ms"] - r["cpu_ms"] - r["held_runqueue_ms"]) / procs,
            "handoff": handoff,
            "paused_runnable": paused_rq,
            "extra_wait": paused - handoff - paused_rq - sim_wait,
            "unslotted_before": before_rq,
            "unslotted_after": unslotted_rq - before_rq,
        }
        parts["residual"] = client - sim_lat - sum(parts.values())
        iso_ms = iso[(q, cls)] * 1000
        d = per.setdefault(cls, {"n": 0, "client": [], "sim": [], "sd_real": [], "sd_sim": [],
                                 "parts": {k: [] for k, _ in PARTS},
                                 "sd_parts": {k: [] for k, _ in PARTS},
                                 "serial": 0})
        d["n"] += 1
        d["client"].append(client)
        d["sim"].append(sim_lat)
        d["sd_real"].append(client / iso_ms)
        d["sd_sim"].append(sim_lat / iso_ms)
        d["serial"] += r["processes"] < 1 + r["workers_planned"]
        for k, v in parts.items():
            d["parts"][k].append(v)
            d["sd_parts"][k].append(v / iso_ms)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    out = {}
    for cls, d in per.items():
        out[cls] = {
            "n": d["n"], "client_ms": mean(d["client"]), "sim_ms": mean(d["sim"]),
            "sd_real": mean(d["sd_real"]), "sd_sim": mean(d["sd_sim"]),
            "sd_real_p99": analysis.percentile(d["sd_real"], 99),
            "sd_sim_p99": analysis.percentile(d["sd_sim"], 99),
            "fewer_workers": d["serial"],
            "parts_ms": {k: mean(v) for k, v in d["parts"].items()},
            "parts_sd": {k: mean(v) for k, v in d["sd_parts"].items()},
        }
    return out


def machine(rows: list, t_lo: float, t_hi: float, server_cpu_s: float) -> dict:
    """CPU of the run: the server's, the traced statements' in all and in slots, and the
    CPU of slices longer than twice the target."""
    inrun = [r for r in rows if t_lo <= r["arrival_epoch"] < t_hi]
    total = sum(r["cpu_total_ms"] for r in inrun) / 1000
    slots = sum(r["cpu_ms"] for r in inrun) / 1000
    long_ = sum(r["long_slice_ms"] for r in inrun) / 1000
    held = sum(r["held_ms"] for r in inrun) / 1000
    return {"statements": len(inrun), "server_cpu_s": server_cpu_s,
            "statement_cpu_s": total, "slot_cpu_s": slots, "long_slice_cpu_s": long_,
            "held_s": held,
            "handoffs": sum(r["handoffs"] for r in inrun),
            "handoff_s": sum(r["handoff_ms"] for r in inrun) / 1000}


class Point:
    """One open-loop point of a finished run: its pgbench transactions, its traced
    statements (the run's only) and which transaction each one was, the measurement
    window, and the queries' classes and isolated latencies."""

    def __init__(self, run_dir: Path, config: str, alpha: str):
        self.meta = meta = json.loads((run_dir / "results.json").read_text())
        self.script_info = {int(k): tuple(v) for k, v in meta["script_info"].items()}
        self.iso = analysis.isolated_medians(meta["isolated"])
        name = f"ol_{config}_a{alpha}"
        self.txns = txns = analysis.parse_logs(str(run_dir / "open_loop" / name))
        rows = read_trace(run_dir / "open_loop" / f"{name}.trace.csv")
        self.t0 = min(t.arrival_s for t in txns)
        self.t_end = max(t.end_s for t in txns)
        # the run's statements only (the ring may hold earlier ones, a prime phase's)
        self.rows = [r for r in rows if self.t0 - 0.01 <= r["arrival_epoch"] <= self.t_end]
        self.pairs = match(txns, self.rows)
        plan = meta["plan"]
        d = plan["ol_duration"]
        self.window = (self.t0 + d * plan["warmup_frac"], self.t0 + d - max(3.0, 0.05 * d))


def analyse(run_dir: Path, config: str, alpha: str, workdir: Path) -> dict:
    """The whole comparison for one open-loop point of a finished run."""
    cfg = next(c for c in load_configs()["config"] if c["name"] == config)
    pt = Point(run_dir, config, alpha)
    meta, script_info, iso, txns, rows, pairs = (pt.meta, pt.script_info, pt.iso, pt.txns,
                                                 pt.rows, pt.pairs)
    t0, t_end, window = pt.t0, pt.t_end, pt.window
    classes = ["other"] * len(rows)
    for i, j in pairs.items():
        classes[j] = script_info[txns[i].script][1]
    settings = sim_settings(cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    sim = replay(rows, classes, t0, settings, workdir, cfg=cfg)
    point = meta["open_loop"][config][alpha]
    # The same statements needing the slots for as long as they held them: what the
    # replay lacks for the time a holder's CPU went to work outside the slots.
    held = replay(rows, classes, t0, settings, workdir, work="held_ms", cfg=cfg)
    held_classes = account(txns, rows, pairs, held, classes, script_info, iso, window)
    return {
        "config": config, "alpha": alpha, "settings": settings,
        "class_groups": cfg.get("class_groups", {}),
        "transactions": sum(1 for t in txns if not t.failed), "traced": len(rows),
        "matched": len(pairs),
        "classes": account(txns, rows, pairs, sim, classes, script_info, iso, window),
        "held": {cls: {k: c[k] for k in ("sd_sim", "sd_sim_p99")}
                 for cls, c in held_classes.items()},
        "machine": machine(rows, t0, t_end, point["cpu"]["server_cpu_s"]),
        # Runs before 2026-11-26 did not measure the processes outside the server.
        "others": point["cpu"].get("others"),
        "wall_s": point["cpu"]["wall_s"],
    }


def report(res: dict, run_dir: Path) -> str:
    """The comparison as Markdown."""
    st = res["settings"]
    out = [f"# Real run against its replay in the simulator: {res['config']}, α = {res['alpha']}",
           "",
           f"Run `{run_dir}`. Written by `bench/sim_gap.py` (method in bench/README.md, "
           "\"Real against simulated\"). The simulator replayed every traced statement of "
           "the run (arrival, the CPU it was charged in CPU slots, its processes) with "
           f"{st['slots']} slots, policy {st['policy']}, λ = {st['lambda']}, "
           f"d_start = {st['d-start']}, priorities {st['p0']} down to {st['p-min']}, "
           + ("starting where each statement's query identifier's earlier executions in "
              "the window predict (a replay learns from the window only, so an identifier's "
              "first execution there starts as with prediction off), "
              if st.get("start") == "predicted" else "starting at the initial priority, ")
           + f"slice {st['slice-ms']} ms, "
           f"{st['max-active']} active statements at most."
           + "".join(f" The {cls} statements ran in a group of their own, weight "
                     f"{g.get('weight', 100)}"
                     + (f", at priority {st['p0']} throughout." if g.get("pinned") else ".")
                     for cls, g in res.get("class_groups", {}).items()),
           "",
           f"- pgbench transactions {res['transactions']}, traced statements "
           f"{res['traced']}, matched {res['matched']}.",
           "- Slowdowns are relative to the suite's isolated latencies (parallel, pg_stride "
           "not loaded), for the real and the simulated response alike.",
           "",
           "| class | n | real mean | sim mean | real p99 | sim p99 | real mean ms | sim mean ms | ran with fewer workers than planned |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cls in ("short", "long"):
        c = res["classes"].get(cls)
        if not c:
            continue
        out.append(f"| {cls} | {c['n']} | {c['sd_real']:.2f} | {c['sd_sim']:.2f} | "
                   f"{c['sd_real_p99']:.2f} | {c['sd_sim_p99']:.2f} | {c['client_ms']:.1f} | "
                   f"{c['sim_ms']:.1f} | {c['fewer_workers']} |")
    out += ["", "Where the difference goes (means over the class; ms of response time, and "
            "the same divided by each query's isolated latency, which adds up to the "
            "difference of the mean slowdowns):", "",
            "| part | short ms | short slowdown | long ms | long slowdown |",
            "|---|---:|---:|---:|---:|"]
    for key, label in PARTS:
        cells = []
        for cls in ("short", "long"):
            c = res["classes"].get(cls)
            cells += ([f"{c['parts_ms'][key]:.2f}", f"{c['parts_sd'][key]:+.3f}"] if c
                      else ["–", "–"])
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    tot = []
    for cls in ("short", "long"):
        c = res["classes"].get(cls)
        tot += ([f"{c['client_ms'] - c['sim_ms']:.2f}", f"{c['sd_real'] - c['sd_sim']:+.3f}"]
                if c else ["–", "–"])
    out.append("| **real − simulated** | " + " | ".join(tot) + " |")
    out += ["", "Replayed again with each statement needing the slots for as long as its "
            "processes held them (CPU, runnable but not running, asleep) instead of its CPU "
            "in them: how much of the difference is slots held while their CPU did other "
            "work (parse, plan, pgbench, statements' ends, the kernel's threads).", "",
            "| class | real mean / p99 | replay of CPU | replay of held time |",
            "|---|---:|---:|---:|"]
    for cls in ("short", "long"):
        c, h = res["classes"].get(cls), res["held"].get(cls)
        if c and h:
            out.append(f"| {cls} | {c['sd_real']:.2f} / {c['sd_real_p99']:.2f} | "
                       f"{c['sd_sim']:.2f} / {c['sd_sim_p99']:.2f} | "
                       f"{h['sd_sim']:.2f} / {h['sd_sim_p99']:.2f} |")
    m = res["machine"]
    share = lambda x: f"{100 * x / m['server_cpu_s']:.1f} %" if m["server_cpu_s"] else "–"
    out += ["", "CPU of the run (server processes, from /proc; statements, from the trace):",
            "", "| | CPU s | share of the server's |", "|---|---:|---:|",
            f"| server processes, whole run ({res['wall_s']:.0f} s wall) | {m['server_cpu_s']:.1f} | 100 % |",
            f"| traced statements, in all | {m['statement_cpu_s']:.1f} | {share(m['statement_cpu_s'])} |",
            f"| of which in CPU slots (what the simulator replays) | {m['slot_cpu_s']:.1f} | {share(m['slot_cpu_s'])} |",
            f"| of which outside CPU slots | {m['statement_cpu_s'] - m['slot_cpu_s']:.1f} | {share(m['statement_cpu_s'] - m['slot_cpu_s'])} |",
            f"| outside traced statements (parse, plan, connections, background, untraced statements) | {m['server_cpu_s'] - m['statement_cpu_s']:.1f} | {share(m['server_cpu_s'] - m['statement_cpu_s'])} |",
            f"| slices beyond twice the target (CPU past 2× slice, in slots) | {m['long_slice_cpu_s']:.1f} | {share(m['long_slice_cpu_s'])} |",
            ""]
    others = res.get("others")
    out += [f"Slots held {m['held_s']:.1f} s for {m['slot_cpu_s']:.1f} s of CPU in them: "
            f"{m['held_s'] - m['slot_cpu_s']:.1f} s in which a holder's CPU did other work "
            "or the holder slept. With as many slots as CPUs, that work is the server's "
            f"outside the slots ({m['server_cpu_s'] - m['slot_cpu_s']:.1f} s above)"
            + (f" and that of the processes outside the server, {others['total_s']:.1f} s "
               "(largest: " + ", ".join(f"{n} {s:.2f} s" for n, s in others["top"]) + ")."
               if others else "; the processes outside the server were not measured in "
               "this run."), ""]
    out += [f"Hand-offs: {int(m['handoffs'])}, "
            f"{m['handoff_s'] * 1000 / max(1, m['handoffs']):.3f} ms each on average.", ""]
    return "\n".join(out)


# The short tail (bench/short_tail.py): parts of a short statement's response time, each
# taken out of every statement in turn to see what the mean and p99 would be without it.
# "pre" is the time before the executor beyond the least the same query had in the run;
# "outside" the statement's CPU outside the CPU slots; the others are trace columns.
TAIL_PARTS = [
    ("pre", "time before the executor beyond the query's least in the run"),
    ("outside", "CPU outside the slots"),
    ("held_runqueue_ms", "runnable but not running while holding a slot"),
    ("paused_runqueue_ms", "paused, runnable but not running (on the way to sleep, or "
                           "handed a slot)"),
    ("runqueue_ms", "runnable but not running, all of it (holding, paused, before and "
                    "after the slots)"),
    ("paused_ms", "paused (waiting for a slot)"),
]


def short_statements(pt: Point) -> list:
    """The short statements of the point's window: query, isolated and real response
    (ms), processes, time from arrival to the first slot, and the TAIL_PARTS."""
    out = []
    for i, j in pt.pairs.items():
        q, cls = pt.script_info[pt.txns[i].script]
        t, r = pt.txns[i], pt.rows[j]
        if cls != "short" or not pt.window[0] <= t.arrival_s < pt.window[1]:
            continue
        lat = (t.end_s - t.arrival_s) * 1000
        s = {"query": q, "iso": pt.iso[(q, cls)] * 1000, "lat": lat,
             "processes": r["processes"], "first_slot_ms": r["first_slot_ms"],
             "pre": lat - r["finished_ms"],
             "outside": max(0.0, r["cpu_total_ms"] - r["cpu_ms"])}
        for col, _ in TAIL_PARTS:
            s.setdefault(col, r.get(col) or 0.0)
        out.append(s)
    least = {}
    for s in out:
        least[s["query"]] = min(least.get(s["query"], s["pre"]), s["pre"])
    for s in out:
        s["pre"] -= least[s["query"]]
    return out


def untraced_short(pt: Point) -> list:
    """(query, slowdown) of each short statement of the point's window that no trace
    record matched: one that ran without CPU scheduling, which the trace does not
    record."""
    out = []
    for i, t in enumerate(pt.txns):
        q, cls = pt.script_info[t.script]
        if (cls != "short" or t.failed or i in pt.pairs
                or not pt.window[0] <= t.arrival_s < pt.window[1]):
            continue
        out.append((q, (t.end_s - t.arrival_s) / pt.iso[(q, cls)]))
    return out


def without_part(stmts: list, part) -> tuple:
    """(mean, p99) of the short slowdowns with `part` (a key, or None) taken out of
    each statement's response (never below 1 % of its isolated latency)."""
    sds = [max(s["lat"] - (s[part] if part else 0.0), 0.01 * s["iso"]) / s["iso"]
           for s in stmts]
    return sum(sds) / len(sds), analysis.percentile(sds, 99)


def first_slot_times(stmts: list) -> dict:
    """The times from arrival to the first slot (ms) of the single-process short
    statements that took a slot: parse, plan and executor start as well as any wait for
    the slot (`pg_stride.trace`'s first_slot_ms counts from the arrival); the waits
    alone are the statements' `paused_ms`."""
    w = [s["first_slot_ms"] for s in stmts
         if s["processes"] == 1 and s["first_slot_ms"] is not None]
    return {"n": len(w), "p50": analysis.percentile(w, 50), "p90": analysis.percentile(w, 90),
            "p99": analysis.percentile(w, 99), "over_10ms": sum(1 for x in w if x > 10)}
