#!/usr/bin/env python3
"""Who keeps the server's processes off their CPU: the kernel's context switches over a
stretch of time, and for each time a PostgreSQL process waited runnable, what ran on its
CPU meanwhile; and how long each run of the processes outside the server lasted.

A process that the kernel cannot preempt (a kernel thread in a long loop, on a kernel
built with CONFIG_PREEMPT_NONE) keeps a runnable process off its CPU for as long as it
runs, whatever their weights: its longest runs show it. Start the recording while an
open-loop point runs, for example a minute after `bench/run` logged "open loop: ...":

    bench/cpu_waits.py record --seconds 60 --out bench/out/switches.txt
    bench/cpu_waits.py report bench/out/switches.txt

`record` needs perf and root (perf record -e sched:sched_switch -e sched:sched_wakeup
-a); it writes perf script's text. `report` prints Markdown.
"""

import argparse
import bisect
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stride_bench import analysis  # noqa: E402

SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:\s+prev_comm=(.+?) prev_pid=(\d+) "
                    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+) ")
WAKEUP = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_wakeup:\s+comm=(.+?) pid=(\d+) ")
SERVER = "postgres"
# the waits shown, s: a hand-off's, a slice's, and one well past a short query's length
THRESHOLDS = (0.0005, 0.005, 0.02)


def record(seconds: int, out: Path):
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "perf.data"
        subprocess.run(["perf", "record", "-q", "-e", "sched:sched_switch", "-e",
                        "sched:sched_wakeup", "-a", "-o", str(data), "--", "sleep",
                        str(seconds)], check=True)
        with open(out, "w") as fh:
            subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,cpu,time,event,trace"],
                           stdout=fh, stderr=subprocess.DEVNULL, check=True)


def read(path: Path):
    """(runs per CPU: sorted [(start, end, command)], with "idle" for the idle task;
    waits: [(command, cpu, runnable since, running from)]; the span recorded)."""
    running = {}
    runs = defaultdict(list)
    since = {}
    waits = []
    first = last = None
    with open(path, errors="replace") as fh:
        for line in fh:
            m = SWITCH.search(line)
            if m:
                cpu, t = int(m.group(1)), float(m.group(2))
                first = t if first is None else first
                last = t
                prev_pid, prev_state = int(m.group(4)), m.group(5)
                next_comm, next_pid = m.group(6), int(m.group(7))
                if cpu in running:
                    start, comm = running[cpu]
                    runs[cpu].append((start, t, comm))
                running[cpu] = (t, next_comm if next_pid else "idle")
                if prev_pid and prev_state.startswith("R"):
                    since[prev_pid] = t        # preempted: runnable from now
                if next_pid in since:
                    waits.append((next_comm, cpu, since.pop(next_pid), t))
                continue
            m = WAKEUP.search(line)
            if m:
                since.setdefault(int(m.group(4)), float(m.group(2)))
    return runs, waits, (first or 0.0, last or 0.0)


def on_cpu(runs: list, starts: list, lo: float, hi: float) -> Counter:
    """Seconds each command ran in [lo, hi) among `runs` (one CPU's, sorted)."""
    out = Counter()
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(runs) and runs[i][0] < hi:
        start, end, comm = runs[i]
        overlap = min(end, hi) - max(start, lo)
        if overlap > 0:
            out[analysis.command_kind(comm)] += overlap
        i += 1
    return out


def report(path: Path):
    runs, waits, (t0, t1) = read(path)
    starts = {cpu: [r[0] for r in rs] for cpu, rs in runs.items()}
    print(f"# Waits for a CPU: `{path.name}`\n\n{t1 - t0:.1f} s of context switches on "
          f"{len(runs)} CPUs. A wait runs from a process's wake-up (or preemption) to its "
          "next run.\n")
    print(f"Waits of the `{SERVER}` processes, and what ran on their CPU meanwhile (s). The "
          "server's processes are slot holders and processes without a slot alike: one "
          "waiting behind a holder is the scheduler's doing. A wait that ended on another "
          "CPU than it began counts what ran on the CPU it ended on (idle, when it moved "
          "there from a busy one).\n")
    rows = []
    for thr in THRESHOLDS:
        long_ones = [w for w in waits if w[0] == SERVER and w[3] - w[2] >= thr]
        ran = Counter()
        for _, cpu, lo, hi in long_ones:
            ran.update(on_cpu(runs[cpu], starts[cpu], lo, hi))
        rows.append((thr, long_ones, ran))
    names = sorted({n for _, _, ran in rows for n in ran}, key=lambda n: -rows[0][2][n])[:6]
    print("| waits of at least | count | in all, s | " + " | ".join(names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    for thr, long_ones, ran in rows:
        print(f"| {thr * 1000:g} ms | {len(long_ones)} | "
              f"{sum(hi - lo for _, _, lo, hi in long_ones):.2f} | "
              + " | ".join(f"{ran[n]:.2f}" for n in names) + " |")
    print("\nRuns of the processes outside the server (from being switched in to being "
          "switched out), the six that ran longest in all:\n")
    by_comm = defaultdict(list)
    for rs in runs.values():
        for start, end, comm in rs:
            if comm not in (SERVER, "idle"):
                by_comm[analysis.command_kind(comm)].append((end - start) * 1000)
    top = sorted(by_comm.items(), key=lambda kv: -sum(kv[1]))[:6]
    print("| command | runs | in all, s | median, ms | p99, ms | longest, ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for comm, lens in top:
        print(f"| {comm} | {len(lens)} | {sum(lens) / 1000:.2f} | "
              f"{analysis.percentile(lens, 50):.2f} | {analysis.percentile(lens, 99):.2f} | "
              f"{max(lens):.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--seconds", type=int, default=60)
    r.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("report")
    p.add_argument("file", type=Path)
    a = ap.parse_args()
    if a.cmd == "record":
        record(a.seconds, a.out)
    else:
        report(a.file)


if __name__ == "__main__":
    main()
