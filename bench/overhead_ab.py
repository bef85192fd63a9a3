#!/usr/bin/env python3
"""pg_stride's TPC-B overhead measured side by side: two servers at the same time, each
with its pgbench on a core of its own, one with the library loaded and one without.

On a shared virtual machine the throughput of one configuration moves by ±10 % between
rounds a minute apart, more than the overhead to be measured, so rounds taken one after
the other compare different moments of the machine. Here both configurations run in the
same seconds and see the same moment; confining each server and its clients to one core
keeps them from taking CPU time from each other. What is left is the difference between
the two cores and the two data directories: the rounds cycle through the four
placements (which server is loaded, on which core), and an A/A series in the same run
(both servers without the library) shows how far the ratio strays when nothing differs.

Each round: both servers restarted with their settings, pgbench TPC-B with 8 clients on
each for SECONDS, as an ordinary role so that every statement goes through admission;
the round's ratio is loaded tps / not loaded tps. Needs 2 CPUs.

Writes bench/results/OVERHEAD_AB.md. Usage: bench/overhead_ab.py [--rounds N] [--seconds S]
(defaults 8 and 60; A/A rounds: half as many).
"""

import os
import statistics
import sys
import time

from scheduling import PGBIN, Server, tps

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 8
SECONDS = int(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 60
STOCK = []
LOADED = ["shared_preload_libraries = 'pg_stride'", "pg_stride.exempt_superuser = off"]
PGBENCH = ["-c", "8", "-j", "1", "-M", "prepared"]


def prepare(server):
    server.restart(STOCK, cpus=())
    server.run(f"{PGBIN}/pgbench", "-i", "-s", "10", "-q", "-h", server.dir, "-p", str(server.port),
               "-U", "postgres", "postgres")
    server.sql("CREATE ROLE r_plain LOGIN; GRANT SELECT, UPDATE, INSERT ON ALL TABLES IN SCHEMA public TO r_plain")
    server.sql("VACUUM ANALYZE")


def round_ratio(servers, settings, index):
    """One round: servers[0] gets settings[0] and so on; which server is measured on
    which core follows the round's index. Returns the two tps."""
    cores = (0, 1) if (index // 2) % 2 == 0 else (1, 0)
    for server, conf, core in zip(servers, settings, cores):
        server.restart(conf, cpus=("taskset", "-c", str(core)))
    runs = [server.pgbench(*PGBENCH, "-T", str(SECONDS), user="r_plain", cpus=("taskset", "-c", str(core)))
            for server, core in zip(servers, cores)]
    result = [tps(run.communicate()[0]) for run in runs]
    # Keep the tables from growing apart: both servers get the same clean-up.
    for server in servers:
        server.sql("VACUUM pgbench_branches, pgbench_tellers")
    return result, cores


def series(servers, rounds, name, variant):
    """`rounds` rounds, the variant on servers[0] in even rounds and on servers[1] in odd
    ones. Returns the per-round ratios variant / stock, printing each round."""
    ratios = []
    for i in range(rounds):
        settings = (variant, STOCK) if i % 2 == 0 else (STOCK, variant)
        (a, b), cores = round_ratio(servers, settings, i)
        measured, stock = (a, b) if i % 2 == 0 else (b, a)
        core = cores[0] if i % 2 == 0 else cores[1]
        ratios.append(measured / stock)
        print(f"{name} round {i + 1}: {measured:.0f} tps ({name} side, core {core}) / {stock:.0f} tps "
              f"= {ratios[-1]:.3f}", flush=True)
    return ratios


def summary(ratios):
    return (f"median {statistics.median(ratios):.3f}, geometric mean "
            f"{statistics.geometric_mean(ratios):.3f}, range {min(ratios):.3f}–{max(ratios):.3f}")


def main():
    servers = [Server(port=5496), Server(port=5497)]
    try:
        for server in servers:
            prepare(server)
        aa = series(servers, max(ROUNDS // 2, 2), "stock", STOCK)
        ab = series(servers, ROUNDS, "loaded", LOADED)
    finally:
        for server in servers:
            server.stop()
    lines = ["# TPC-B overhead, side by side", "",
             f"Written by bench/overhead_ab.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
             f"two servers at once, each with its pgbench (TPC-B, 8 clients, {SECONDS} s, an ordinary role) "
             "on one core of its own; the rounds alternate which server has pg_stride loaded and on which "
             "core it runs. Ratio: tps of the one side / tps of the other, same seconds.", "",
             "| series | rounds | per-round ratios | summary |", "|---|---|---|---|",
             f"| A/A: neither loaded (calibration) | {len(aa)} | {', '.join(f'{r:.3f}' for r in aa)} | {summary(aa)} |",
             f"| loaded / not loaded | {len(ab)} | {', '.join(f'{r:.3f}' for r in ab)} | {summary(ab)} |"]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "OVERHEAD_AB.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
