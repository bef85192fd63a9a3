#!/usr/bin/env python3
"""Per-node accounting of `pg_stride.numa = stats` on a real server (docs/internals/numa.md).

A server with one CPU slot runs several `SELECT count(*) FROM big` at once. The checks:
the CPU time the view pg_stride.numa shows per node adds up to the CPU time charged to
the groups (both are charged together: at a slice end, at the end of a run, and when an
error cuts a run short); the main shared-memory segment, per node plus not resident, is
the size PostgreSQL computed (shared_memory_size); and a second server with pg_stride.numa_topology = '0|1'
(each of two CPUs a fake node) shows two nodes whose CPU times add up the same way.
On that server, `pg_stride.numa = bind`: two parallel queries get different home
nodes, each leader and its worker run bound to their home node's CPU (read from
/proc/<pid>/status while they run), and each leader's own CPUs are back after its
statement; a process takes the other node's slot only when it may steal.

Starts its own temporary servers and prints one line per check, then
"numa: N passed, N failed". Run as root, the servers run as postgres.
"""

import os
import subprocess
import sys
import time

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
def a_statement_cut_short_charges_its_last_slice_to_its_node(s):
    # One slice as long as allowed, a timeout well inside it: the statement's CPU is
    # charged only when its error ends it, to its group and to its node alike.
    s.sql("SELECT pg_stride.reset_stats()")
    rc, out, err = concurrency.finish(subprocess.Popen(
        s.psql_args("SET pg_stride.slice = 1000; SET statement_timeout = 400; "
                    "SELECT count(*) FROM big, generate_series(1, 4)"),
        env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE), timeout=60)
    assert rc != 0 and "statement timeout" in err, (rc, out, err)
    nodes, groups = cpu_totals(s)
    print(f"    cancelled after 400 ms: nodes {nodes:.1f} ms, groups {groups:.1f} ms")
    assert groups > 100, f"the statement was charged {groups} ms of CPU"
    assert abs(nodes - groups) <= 0.05 * groups, f"nodes {nodes} ms, groups {groups} ms"


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


@fake_check
def a_pinned_holder_still_sees_every_node(s):
    # A session whose first slice end comes while pinned to the CPU of its slot
    # (pin_slots) reads the topology then: it must still see both nodes, and charge its
    # CPU on other CPUs to their node, not to "no node".
    s.sql("ALTER SYSTEM SET pg_stride.pin_slots = on")
    s.sql("SELECT pg_reload_conf()")
    try:
        time.sleep(0.5)
        s.sql("SELECT pg_stride.reset_stats()")
        rows = s.sql("SELECT count(*) FROM big; SELECT count(*) FROM big; "
                     "SELECT string_agg(node || ':' || cpus || ':' "
                     "|| cpu_count, ' ' ORDER BY node) FROM pg_stride.numa "
                     "WHERE node IS NOT NULL")
        assert rows.splitlines()[-1] == "0:0:1 1:1:1", rows
        run_scans(s)
        none = float(s.sql("SELECT coalesce(sum(cpu_time_ms), 0) FROM pg_stride.numa "
                           "WHERE node IS NULL"))
        assert none == 0.0, none
    finally:
        s.sql("ALTER SYSTEM RESET pg_stride.pin_slots")
        s.sql("SELECT pg_reload_conf()")


PARALLEL = ("SET max_parallel_workers_per_gather = 1; SET parallel_setup_cost = 0; "
            "SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0;")
# Long enough (seconds, in a debug build) to be sampled while it runs; parallel, with
# one worker.
BIND_QUERY = "SELECT count(*) FROM big, generate_series(1, 4)"


def allowed_cpus(pid):
    """The Cpus_allowed_list of process `pid`, or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except FileNotFoundError:
        return None
    return None


def set_bind(s, slots, steal_after):
    """numa = bind with `slots` CPU slots split over the two fake nodes."""
    for setting, value in [("pg_stride.numa", "bind"), ("pg_stride.cpu_slots", slots),
                           ("pg_stride.numa_steal_after", steal_after)]:
        s.sql(f"ALTER SYSTEM SET {setting} = {value}")
    s.sql("SELECT pg_reload_conf()")
    half = slots // 2
    s.wait_until("SELECT string_agg(node || ':' || cpu_slots, ' ' ORDER BY node) "
                 "FROM pg_stride.numa WHERE node IS NOT NULL", f"0:{half} 1:{slots - half}")
    # The concurrency hint (free slots, averaged) grants the parallel workers: wait until
    # it has seen the new slots.
    s.wait_until(f"SELECT hint > {slots} - 1 FROM pg_stride.scheduler", "t")


def reset_bind(s):
    for setting in ["pg_stride.numa", "pg_stride.cpu_slots", "pg_stride.numa_steal_after"]:
        s.sql(f"ALTER SYSTEM RESET {setting}")
    s.sql("SELECT pg_reload_conf()")
    s.wait_until("SHOW pg_stride.numa", "stats")


def start_bound_queries(s, n):
    """n sessions, each running BIND_QUERY with one parallel worker; returns (sessions,
    their backend pids, each backend's CPUs before)."""
    sessions = [concurrency.Session(s) for _ in range(n)]
    pids = [int(x.run("SELECT pg_backend_pid()")[0]) for x in sessions]
    before = [allowed_cpus(pid) for pid in pids]
    for x in sessions:
        x.run(PARALLEL, lines=0)
        x.proc.stdin.write(BIND_QUERY.encode() + b";\n")
        x.proc.stdin.flush()
    return sessions, pids, before


def wait_for_bound_queries(sessions):
    """Waits for each session's BIND_QUERY result; the sessions stay connected."""
    for x in sessions:
        # The query's result, then this statement's.
        out = x.run("SELECT 'done'", lines=2, timeout=180)
        assert out == ["12000000", "done"], out


def finish_bound_queries(sessions):
    wait_for_bound_queries(sessions)
    for x in sessions:
        x.close()


def unscheduled(s, sql):
    """Runs `sql` in a session pg_stride does not schedule, so that sampling the views
    takes no slot and homes no query of its own."""
    return s.sql(f"SET pg_stride.enabled = off; {sql}")


def workers_of(s, leaders):
    """{leader pid: [parallel worker pids]} from pg_stat_activity."""
    rows = s.sql("SELECT leader_pid || ' ' || pid FROM pg_stat_activity "
                 f"WHERE leader_pid IN ({','.join(map(str, leaders))}) AND pid <> leader_pid")
    workers = {leader: [] for leader in leaders}
    for row in rows.splitlines():
        leader, pid = map(int, row.split())
        workers[leader].append(pid)
    return workers


@fake_check
def bind_keeps_each_query_and_its_worker_on_its_home_node(s):
    set_bind(s, 4, -1)
    try:
        sessions, leaders, before = start_bound_queries(s, 2)
        seen, view = None, None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = workers_of(s, leaders)
            if all(workers.values()):
                seen = {leader: [allowed_cpus(leader)] + [allowed_cpus(w) for w in workers[leader]]
                        for leader in leaders}
                view = unscheduled(s, "SELECT string_agg(node || ':' || slots_in_use || ':' || queries_homed, ' ' "
                                   "ORDER BY node) FROM pg_stride.numa WHERE node IS NOT NULL")
                # Each process binds itself when it is first given a slot.
                if all(len(set(cpus)) == 1 and cpus[0] in ("0", "1") for cpus in seen.values()):
                    break
            time.sleep(0.05)
        print(f"    CPUs allowed (leader, worker) by query: {list(seen.values()) if seen else None}; "
              f"view node:in_use:homed {view}; before {before}")
        assert seen, "the queries never had their parallel workers running"
        for leader, cpus in seen.items():
            assert len(set(cpus)) == 1 and cpus[0] in ("0", "1"), \
                f"leader {leader} and its worker are not bound to one node: {cpus}"
        homes = sorted(cpus[0] for cpus in seen.values())
        assert homes == ["0", "1"], f"both queries homed on one node: {homes}"
        assert view == "0:2:1 1:2:1", view
        wait_for_bound_queries(sessions)
        after = [allowed_cpus(pid) for pid in leaders]
        for x in sessions:
            x.close()
        assert after == before, f"leaders' CPUs after their statements {after}, before {before}"
    finally:
        reset_bind(s)


def in_use_by_node(s, seconds):
    """Samples slots in use of nodes 0 and 1 for `seconds`."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = unscheduled(s, "SELECT string_agg(slots_in_use::text, ' ' ORDER BY node) "
                          "FROM pg_stride.numa WHERE node IS NOT NULL")
        samples.append(tuple(int(v) for v in row.split()))
        time.sleep(0.05)
    return samples


@fake_check
def a_process_takes_the_other_nodes_slot_only_when_it_may_steal(s):
    # One slot per node; one query with a worker. Never stealing, its second process
    # waits for its home node's slot while the other node's stays free; allowed to steal
    # after 0 slices (the 1 ms floor) it takes the other node's. (The two processes take
    # turns a slice at a time, and the stealing delay counts one wait: with 2 or more
    # slices they would never wait that long at once.)
    result = {}
    for steal_after in (-1, 0):
        set_bind(s, 2, steal_after)
        try:
            sessions, leaders, _ = start_bound_queries(s, 1)
            # Sample once the worker runs: a query without one has nothing to steal with.
            deadline = time.monotonic() + 30
            while not workers_of(s, leaders)[leaders[0]]:
                assert time.monotonic() < deadline, "the query never had its parallel worker"
                time.sleep(0.02)
            samples = in_use_by_node(s, 3)
            finish_bound_queries(sessions)
        finally:
            reset_bind(s)
        result[steal_after] = tuple(sorted((max(a for a, _ in samples), max(b for _, b in samples))))
    print(f"    most slots in use on the two nodes, sampled for 3 s: never steal {result[-1]}, "
          f"steal after 0 slices {result[0]}")
    # (A node may have more in use than its one slot: a holder waiting on an event, such
    # as the leader on its worker's tuples, lends its node an extra one.)
    assert result[-1][0] == 0 and result[-1][1] >= 1, result
    assert result[0][0] >= 1, result


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
