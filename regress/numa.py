#!/usr/bin/env python3
"""Per-node accounting of `pg_stride.numa = stats` on a real server (README "NUMA").

A server with one CPU slot runs several `SELECT count(*) FROM big` at once. The checks:
the CPU time the view pg_stride.numa shows per node adds up to the CPU time charged to
the groups (both are charged at the same two places, slice end and end of run); the
main shared-memory segment, per node plus not resident, is the size PostgreSQL
computed (shared_memory_size); and a second server with pg_stride.numa_topology = '0|1'
(each of two CPUs a fake node) shows two nodes whose CPU times add up the same way.

Starts its own temporary servers and prints one line per check, then
"numa: N passed, N failed". Run as root, the servers run as postgres.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import ENV  # noqa: E402

CONF = """
pg_stride.cpu_slots = 1
max_parallel_workers_per_gather = 0
"""
SCANS = 4

CHECKS = []
check = concurrency.collector(CHECKS)


def cpu_totals(s):
    """(sum of the nodes' CPU time, sum of the groups' CPU time), ms."""
    nodes = float(s.sql("SELECT coalesce(sum(cpu_time_ms), 0) FROM pg_stride.numa"))
    groups = float(s.sql("SELECT coalesce(sum(cpu_time_ms), 0) FROM pg_stride.groups"))
    return nodes, groups


def run_scans(s):
    """Runs SCANS concurrent scans of `big` to their end."""
    procs = [subprocess.Popen(s.psql_args("SELECT count(*) FROM big"), env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(SCANS)]
    for p in procs:
        rc, out, err = concurrency.finish(p, timeout=120)
        assert (rc, out) == (0, "3000000"), (rc, out, err)


def nodes_add_up_to_groups(s):
    s.sql("SELECT pg_stride.reset_stats()")
    assert cpu_totals(s) == (0.0, 0.0), cpu_totals(s)
    run_scans(s)
    nodes, groups = cpu_totals(s)
    rows = s.sql("SELECT coalesce(node::text, 'none') || ': ' || cpus || ' ' || round(cpu_time_ms::numeric, 1) "
                 "|| ' ms' FROM pg_stride.numa WHERE node IS NOT NULL OR cpu_time_ms > 0")
    print(f"    {SCANS} scans: nodes {nodes:.1f} ms, groups {groups:.1f} ms; " + "; ".join(rows.splitlines()))
    assert groups > 100, f"the scans were charged {groups} ms of CPU"
    assert abs(nodes - groups) <= 0.05 * groups, f"nodes {nodes} ms, groups {groups} ms"
    return rows


@check
def cpu_per_node_adds_up_to_the_groups_cpu(s):
    nodes_online = s.sql("SELECT count(*) FROM pg_stride.numa WHERE node IS NOT NULL")
    with open("/sys/devices/system/node/online") as f:
        expected = sum(int(b) - int(a) + 1 if "-" in r else 1
                       for r in f.read().strip().split(",") for a, _, b in [r.partition("-")])
    assert nodes_online == str(expected), f"{nodes_online} node rows, {expected} nodes online"
    nodes_add_up_to_groups(s)


@check
def with_numa_off_nothing_is_counted_per_node(s):
    s.sql("ALTER SYSTEM SET pg_stride.numa = off")
    s.sql("SELECT pg_reload_conf()")
    try:
        s.wait_until("SHOW pg_stride.numa", "off")
        s.sql("SELECT pg_stride.reset_stats()")
        run_scans(s)
        nodes, groups = cpu_totals(s)
        assert groups > 100 and nodes == 0, f"nodes {nodes} ms, groups {groups} ms"
    finally:
        s.sql("ALTER SYSTEM RESET pg_stride.numa")
        s.sql("SELECT pg_reload_conf()")
        s.wait_until("SHOW pg_stride.numa", "stats")


@check
def the_segment_per_node_adds_up_to_shared_memory_size(s):
    total, resident, not_resident = map(int, s.sql(
        "SELECT sum(shared_memory_bytes), sum(shared_memory_bytes) FILTER (WHERE node IS NOT NULL), "
        "sum(shared_memory_bytes) FILTER (WHERE node IS NULL) FROM pg_stride.numa").split("|"))
    size_mb = int(s.sql("SELECT setting FROM pg_settings WHERE name = 'shared_memory_size'"))
    print(f"    segment {total} bytes ({resident} on nodes, {not_resident} not resident); "
          f"shared_memory_size {size_mb} MB")
    assert resident > 0 and not_resident >= 0, (resident, not_resident)
    # shared_memory_size is the computed size rounded up to MB; huge pages round the
    # mapping up to 2 MB.
    assert (size_mb - 1) * 2**20 < total <= (size_mb + 2) * 2**20, (total, size_mb)


FAKE_CHECKS = []
fake_check = concurrency.collector(FAKE_CHECKS)


@fake_check
def two_fake_nodes_add_up_the_same_way(s):
    assert s.sql("SHOW pg_stride.numa_topology") == "0|1"
    rows = s.sql("SELECT node || ':' || cpus || ':' || cpu_count || ':' "
                 "|| (memory_total_kb IS NULL) FROM pg_stride.numa WHERE node IS NOT NULL")
    assert rows.splitlines() == ["0:0:1:true", "1:1:1:true"], rows
    nodes_add_up_to_groups(s)


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql("CREATE TABLE big AS SELECT g AS a FROM generate_series(1, 3000000) g")
    s.sql("VACUUM ANALYZE big")


def main():
    passed, failed = concurrency.run_checks(
        concurrency.Server(port=concurrency.PORT + 8, extra_conf=CONF), CHECKS, setup)
    if os.cpu_count() >= 2:
        fake = concurrency.Server(port=concurrency.PORT + 9,
                                  extra_conf=CONF + "pg_stride.numa_topology = '0|1'\n")
        p, f = concurrency.run_checks(fake, FAKE_CHECKS, setup)
        passed, failed = passed + p, failed + f
    print(f"numa: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
