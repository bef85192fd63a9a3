#!/usr/bin/env python3
"""What the short tail of an open-loop point is made of: the times from arrival to the
first slot of the short single-process statements, their waits for a slot, and the
short mean and p99 slowdown with one part of every short statement's response time
taken out (stride_bench/simgap.py, TAIL_PARTS).

Usage: bench/short_tail.py RUN_DIR --config stride-pinned-lowmin [--alpha 0.95] [--query q01]

Short statements that the trace did not record (they ran without CPU scheduling) are
counted apart, with their own slowdowns.

The point must come from a configuration with `pg_stride.trace = on`. Prints Markdown.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stride_bench import analysis, simgap  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--config", required=True)
    ap.add_argument("--alpha", default=None, help="load point (default: the highest)")
    ap.add_argument("--query", help="only this query's statements (q01, s03, ...)")
    a = ap.parse_args()
    run_dir = Path(a.run_dir).resolve()
    meta = json.loads((run_dir / "results.json").read_text())
    alpha = a.alpha or max(meta["open_loop"][a.config], key=float)
    pt = simgap.Point(run_dir, a.config, alpha)
    stmts = [s for s in simgap.short_statements(pt) if a.query in (None, s["query"])]
    untraced = [sd for q, sd in simgap.untraced_short(pt) if a.query in (None, q)]
    what = f"{a.query}'s" if a.query else "short"
    print(f"# Short tail: {a.config}, α = {alpha}{', ' + a.query if a.query else ''}\n\n"
          f"Run `{run_dir}`; {len(stmts)} traced {what} statements in the measurement "
          "window.\n")
    if untraced:
        # The trace records scheduled statements only.
        print(f"{len(untraced)} more were not traced: they ran without CPU scheduling (a "
              "tiny plan, or one whose history says it ends within half a slice); their "
              f"slowdown mean {sum(untraced) / len(untraced):.2f}, p99 "
              f"{analysis.percentile(untraced, 99):.2f}. Nothing below counts them.\n")
    if not stmts:
        sys.exit(f"no traced short statements{' of ' + a.query if a.query else ''} in the window")
    w = simgap.first_slot_times(stmts)
    print(f"From arrival to the first slot (parse, plan, executor start and any wait for "
          f"the slot), of the {w['n']} single-process ones: median {w['p50']:.2f} ms, "
          f"p90 {w['p90']:.2f} ms, p99 {w['p99']:.2f} ms; {w['over_10ms']} took more "
          "than 10 ms.\n")
    paused = [s["paused_ms"] for s in stmts]
    print(f"Waiting for a slot (all of a statement's waits): mean {sum(paused) / len(paused):.2f} "
          f"ms, p90 {analysis.percentile(paused, 90):.2f} ms, p99 "
          f"{analysis.percentile(paused, 99):.2f} ms; {sum(1 for x in paused if x > 0)} of "
          f"the {len(paused)} waited at all.\n")
    print("Time runnable without the CPU, per short statement (all its processes), ms:\n")
    print("| part | mean | p90 | p99 | in all, s |\n|---|---:|---:|---:|---:|")
    for col in ("held_runqueue_ms", "paused_runqueue_ms", "runqueue_ms"):
        v = [s[col] for s in stmts]
        label = dict(simgap.TAIL_PARTS)[col]
        print(f"| {label} | {sum(v) / len(v):.2f} | {analysis.percentile(v, 90):.2f} | "
              f"{analysis.percentile(v, 99):.2f} | {sum(v) / 1000:.2f} |")
    print()
    print("| taken out of every short statement | short mean | short p99 |\n|---|---:|---:|")
    for part, label in [(None, "nothing")] + simgap.TAIL_PARTS:
        mean, p99 = simgap.without_part(stmts, part)
        print(f"| {label} | {mean:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
