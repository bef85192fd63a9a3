#!/usr/bin/env python3
"""Compares an open-loop point of a finished benchmark run with its replay in
pg_stride-sim, query by query, and accounts for the difference (stride_bench/simgap.py).

Usage: bench/sim_gap.py [RUN_DIR] [--config stride-decay] [--alpha 0.95] [--out FILE]

RUN_DIR defaults to bench/out/runs/latest-quick (or latest-full if newer); the point must
come from a configuration with `pg_stride.trace = on` (stride-decay has it), whose trace
the run dumped next to the pgbench logs.  Writes SIM_GAP_<config>.md into the run
directory, or FILE.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stride_bench import simgap  # noqa: E402
from stride_bench.common import OUT  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--config", default="stride-decay")
    ap.add_argument("--alpha", default=None, help="load point (default: the highest)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.run_dir:
        run_dir = Path(a.run_dir)
    else:
        links = [OUT / "runs" / n for n in ("latest-quick", "latest-full")]
        run_dir = max((p for p in links if p.exists()), key=lambda p: p.stat().st_mtime)
    run_dir = run_dir.resolve()
    meta = json.loads((run_dir / "results.json").read_text())
    alpha = a.alpha or max(meta["open_loop"][a.config], key=float)
    res = simgap.analyse(run_dir, a.config, alpha, run_dir / "sim_gap" / a.config)
    text = simgap.report(res, run_dir)
    out = Path(a.out) if a.out else run_dir / f"SIM_GAP_{a.config}.md"
    out.write_text(text)
    (run_dir / "sim_gap" / a.config / "result.json").write_text(json.dumps(res, indent=1))
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
