#!/usr/bin/env python3
"""What `pg_stride.numa = stats` costs against `pg_stride.numa = off`, pg_stride loaded
in both: instructions per transaction under cachegrind (bench/instructions.py's method:
one pgbench client as an ordinary role, the busiest backend's count, the difference of
two run lengths), for pgbench -S, TPC-B and the serial count(*) over 500 partitions,
whose scans reach slice ends, where `stats` does its work (a `sched_getcpu` and an
atomic add per slice). The partitions workload is also timed without valgrind
(pgbench -T 5, interleaved rounds).

Writes bench/results/NUMA_OVERHEAD.md. Usage: bench/numa_overhead.py [--out FILE];
PGBIN (scripts/pg-env) picks the server. Needs valgrind; takes a few minutes.
"""

import argparse
import os
import time

from instructions import (HERE, WORKLOADS, Server, instructions_per_transaction, prepare,
                          server_version, stop_server, timing, timing_table, write_report)

LOADED = "shared_preload_libraries = 'pg_stride'\npg_stride.exempt_superuser = off\n"
VARIANTS = (("numa = off", LOADED + "pg_stride.numa = off\n"),
            ("numa = stats", LOADED + "pg_stride.numa = stats\n"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(HERE, "results", "NUMA_OVERHEAD.md"))
    parser.add_argument("--aa", action="store_true",
                        help="numa = off against itself: the method's run-to-run spread; "
                        "prints the table only")
    options = parser.parse_args()
    variants = ((VARIANTS[0], (VARIANTS[0][0] + " again", VARIANTS[0][1])) if options.aa
                else VARIANTS)
    s = Server()
    results = {}
    try:
        prepare(s)
        for label, args, n1, n2 in WORKLOADS:
            for variant, settings in variants:
                results[(label, variant)] = instructions_per_transaction(s, settings, args, n1, n2)
                print(f"{label}, {variant}: {results[(label, variant)]:.0f} instructions per transaction",
                      flush=True)
            if args[:1] == ["-f"]:
                results[(label, "timing")] = timing(s, args, variants)
                print(f"{label}, tps off / stats / ratio: {results[(label, 'timing')]}", flush=True)
    finally:
        stop_server(s)
    lines = ["# pg_stride.numa = stats against numa = off", "",
             f"Written by bench/numa_overhead.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} "
             f"against {server_version()}: pg_stride loaded in both; valgrind cachegrind, one pgbench "
             "client as an ordinary role, instructions of its backend per transaction, release build.", "",
             "| workload | numa = off | numa = stats | added | stats / off |",
             "|---|---|---|---|---|"]
    for label, _, _, _ in WORKLOADS:
        a, b = (results[(label, v)] for v, _ in variants)
        lines.append(f"| {label} | {a:.0f} | {b:.0f} | {b - a:+.0f} | {b / a:.4f} |")
    lines += timing_table(WORKLOADS, results, "numa = off", "numa = stats", "stats / off")
    if options.aa:
        lines = [line.replace("numa = stats", "numa = off again").replace("stats / off", "ratio")
                 for line in lines]
        print("\n".join(lines[4:]))
        return
    write_report(options.out, lines)


if __name__ == "__main__":
    main()
