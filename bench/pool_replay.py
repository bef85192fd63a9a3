#!/usr/bin/env python3
"""Replays one application-pool round of a finished run in the simulator: the round's
arrivals (times and queries, from its pgbench log) behind the same number of
connections, each query needing the CPU it used in a traced open-loop point, under
plain decay, prediction (the shipped settings) and the class groups
(`stride-pinned-groups`). Shows whether the order in which pg_stride runs statements
decides if the client pool fills, apart from what the simulator leaves out (see
bench/README.md, "Real against simulated").

Usage: bench/pool_replay.py RUN_DIR ROUND --cpu-from TRACED_RUN_DIR --config C
         [--alpha A] [--connections 16] [--scale 1,1.15,1.3]

ROUND is a round's log prefix under RUN_DIR/app_pool (ap_stride-defaults_r2); C and A
name the traced open-loop point whose statements give each query's CPU (the median
over its executions there). --scale multiplies every CPU: the real server holds its
slots longer than the CPU it charges, so the replay at 1 runs below the real load.
Prints Markdown.
"""

import argparse
import csv
import json
import statistics
import sys
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_predict import DEFAULTS, sim  # noqa: E402
from stride_bench import analysis, simgap  # noqa: E402

# stride-pinned-groups in the simulator: short queries in a group of weight 1000 pinned
# at the initial priority, long ones in a group of weight 100.
GROUPS = {"short": (1, 10000), "long": (2, 0)}
GROUP_WEIGHTS = ["--group-weight", "1=1000", "--group-weight", "2=100"]
POLICIES = [("plain decay", ["--start", "decay"], False),
            ("prediction (shipped)", ["--start", "predicted"], False),
            ("class groups", ["--start", "decay", *GROUP_WEIGHTS], True)]


def cpu_per_query(run_dir: Path, config: str, alpha: str) -> dict:
    """(query, class) -> median CPU (ms) of its statements in a traced open-loop point."""
    pt = simgap.Point(run_dir, config, alpha)
    cpu = defaultdict(list)
    for i, j in pt.pairs.items():
        cpu[pt.script_info[pt.txns[i].script]].append(pt.rows[j]["cpu_ms"])
    return {q: statistics.median(v) for q, v in cpu.items()}


def write_workload(txns, script_info, cpu, scale, grouped, path):
    """The simulator's workload: one row per arrival, fingerprinted by its query."""
    t0 = txns[0].arrival_s
    with open(path, "w") as fh:
        fh.write("arrival_ms,cpu_ms,group,class,procs,priority,fingerprint\n")
        for t in txns:
            q = script_info[t.script]
            group, priority = GROUPS[q[1]] if grouped else (0, 0)
            fh.write(f"{(t.arrival_s - t0) * 1000:.3f},{cpu[q] * scale:.3f},{group},{q[1]},"
                     f"1,{priority},{zlib.crc32(repr(q).encode()) + 1}\n")


def summary(results: Path) -> tuple:
    """Short mean / p99 slowdown (against each query's CPU: one process each) and the
    most arrivals in the system, waiting for a connection included."""
    rows = list(csv.DictReader(open(results)))
    short = [float(r["latency_ms"]) / float(r["isolated_ms"]) for r in rows
             if r["class"] == "short"]
    done = [analysis.Txn(0, 0, float(r["latency_ms"]) / 1000, float(r["finish_ms"]) / 1000, 0.0)
            for r in rows]
    return statistics.mean(short), analysis.percentile(short, 99), analysis.max_in_system(done)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("round")
    ap.add_argument("--cpu-from", type=Path, required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--alpha", default="0.95")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--scale", default="1,1.15,1.3")
    a = ap.parse_args()
    meta = json.loads((a.run_dir / "results.json").read_text())
    script_info = {int(k): tuple(v) for k, v in meta["script_info"].items()}
    txns = sorted((t for t in analysis.parse_logs(str(a.run_dir / "app_pool" / a.round))
                   if not t.failed), key=lambda t: t.arrival_s)
    cpu = cpu_per_query(a.cpu_from, a.config, a.alpha)
    print(f"# Replay of {a.round} ({len(txns)} arrivals, {a.connections} connections)\n\n"
          f"Run `{a.run_dir}`; each query's CPU: the median of its statements in "
          f"`{a.cpu_from}`, {a.config} at α {a.alpha}; 2 slots, the shipped decay "
          "(λ 0.9, d_start 8, floor 1, preemption). Short mean / p99 slowdown against the "
          "query's CPU, and in brackets the most arrivals in the system.\n")
    print("| CPU × | offered load | " + " | ".join(p[0] for p in POLICIES) + " |")
    print("|---:|---:|" + "---|" * len(POLICIES))
    span_s = txns[-1].arrival_s - txns[0].arrival_s
    with tempfile.TemporaryDirectory() as tmp:
        for scale in map(float, a.scale.split(",")):
            need_s = sum(cpu[script_info[t.script]] for t in txns) * scale / 1000
            load = need_s / span_s / 2
            workloads = {grouped: Path(tmp) / f"wl{int(grouped)}.csv" for grouped in (False, True)}
            for grouped, wl in workloads.items():
                write_workload(txns, script_info, cpu, scale, grouped, wl)
            cells = []
            res = Path(tmp) / "res.csv"
            for _, args, grouped in POLICIES:
                sim(["run", *DEFAULTS, "--slots", 2, "--max-active", a.connections, *args,
                     "--results", res, workloads[grouped]])
                mean, p99, most = summary(res)
                cells.append(f"{mean:.2f} / {p99:.2f} ({most})")
            print(f"| {scale:g} | {load:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
