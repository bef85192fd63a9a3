#!/usr/bin/env python3
"""The statement trace (`pg_stride.trace`, view `pg_stride.trace`; docs/views.md) on a
real server.

Each check runs real statements and reads their records back: with tracing off nothing
is recorded; two scans sharing one CPU slot are each recorded once, with CPU charged in
the slot, waits and hand-offs that add up, and times in order; a slot is held by one
process at a time, also where the receiver of a hand-off preempts the giver; a hand-off's
latency counts from the hand-over, not from the pause; the receiver of a slot that a
statement ending its run hands over wakes as SCHED_BATCH, so that the statement finishes
first, and no backend stays so; a scan sharing its CPU with a
CPU-bound process records its run delay; a parallel scan records
its workers (processes, planned workers, their start-up CPU outside the slots), and one
granted no worker joins at its first check-in, as a serial plan does; a sort,
whose sorting has no yield point, shows up as CPU in slices beyond twice the target, a
plain scan does not, nor does a Materialize's output, which has no scan below it; the
scans of an InitPlan are yield points; a statement that fails is recorded as failed; a
statement whose plan is estimated tiny is not scheduled (nor recorded) until it ran long
twice on the server; a backend computes query identifiers (compute_query_id = auto)
from the statement after its first scheduled one, not before.

Starts its own temporary server and prints one line per check, then
"trace: N passed, N failed". Run as root, the server runs as postgres.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import ENV, OWN_QUERY_ID_COMPUTED, finish, set_server  # noqa: E402

# shared_buffers holds `big` whole: a scan that waited for reads would have the
# watchdog lend it a slot (a_slot_is_held_by_one_process_at_a_time).
CONF = """
shared_buffers = '512MB'
pg_stride.exempt_superuser = off
max_parallel_workers_per_gather = 0
"""

COLUMNS = ["admitted_ms", "first_slot_ms", "finished_ms", "processes", "workers_planned",
           "cpu_ms", "cpu_total_ms", "paused_ms", "handoff_ms", "handoffs", "held_ms",
           "held_runqueue_ms", "runqueue_ms", "runqueue_before_slot_ms",
           "paused_runqueue_ms", "long_slice_ms", "failed"]

CHECKS = []
check = concurrency.collector(CHECKS)


def records(s, since):
    """The trace's rows that arrived after `since` (a timestamptz literal), as dicts."""
    out = s.sql(f"SELECT {', '.join(COLUMNS)} FROM pg_stride.trace "
                f"WHERE arrival > '{since}' ORDER BY arrival")
    rows = []
    for line in out.splitlines():
        values = dict(zip(COLUMNS, line.split("|")))
        for k, v in values.items():
            if k == "failed":
                values[k] = v == "t"
            else:
                values[k] = float(v) if v != "" else None
        rows.append(values)
    return rows


def traced(s, sql, settings="SET pg_stride.trace = on;", clients=1):
    """Runs `sql` from `clients` sessions at once (pg_stride.trace set in each) and
    returns the records of statements that arrived meanwhile."""
    since = s.sql("SELECT now()")
    procs = [subprocess.Popen(s.psql_args(settings + sql), env=ENV, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(clients)]
    results = [finish(p, timeout=120) for p in procs]
    return results, records(s, since)


def sleeping_backends_on_one_cpu(s, marker, n):
    """The pids of the `n` backends whose query contains `marker` (a pg_sleep that
    gives the caller time to find them), each restricted to the caller's first CPU;
    fewer if they did not show up within 5 s."""
    pids = []
    deadline = time.monotonic() + 5
    while len(pids) < n and time.monotonic() < deadline:
        pids = s.sql("SELECT pid FROM pg_stat_activity WHERE query LIKE "
                     f"'%{marker}%' AND pid <> pg_backend_pid()").split()
    cpu = min(os.sched_getaffinity(0))
    for pid in pids:
        os.sched_setaffinity(int(pid), {cpu})
    return pids


@check
def nothing_is_recorded_with_tracing_off(s):
    results, rows = traced(s, "SELECT count(*) FROM big", settings="")
    assert results[0][0] == 0, results
    assert rows == [], f"records with pg_stride.trace off: {rows}"


@check
def a_statement_that_arrived_untraced_is_not_recorded(s):
    # The scalar subquery switches tracing on once the scan has run: the statement's
    # CPU clock was not read at its arrival, so a record would have no CPU total.
    results, rows = traced(
        s, "SELECT count(*), (SELECT set_config('pg_stride.trace', 'on', false)) FROM big",
        settings="")
    assert results[0][0] == 0 and "|on" in results[0][1], results
    assert rows == [], f"a record of a statement that arrived untraced: {rows}"


@check
def two_scans_on_one_slot_are_recorded_with_their_waits(s):
    set_server(s, "pg_stride.cpu_slots", 1)
    try:
        results, rows = traced(s, "SELECT count(*) FROM big", clients=2)
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)
    assert all(r[0] == 0 for r in results), results
    assert len(rows) == 2, f"two statements, {len(rows)} records: {rows}"
    for r in rows:
        print(f"    cpu {r['cpu_ms']:.1f} ms of {r['cpu_total_ms']:.1f}, held {r['held_ms']:.1f} "
              f"(runqueue {r['held_runqueue_ms']:.1f}), paused {r['paused_ms']:.1f} "
              f"(hand-offs {r['handoffs']:.0f}, {r['handoff_ms']:.2f} ms), finished {r['finished_ms']:.1f}")
        assert r["processes"] == 1 and r["workers_planned"] == 0, r
        assert r["cpu_ms"] > 50, f"a 3,000,000-row count charged {r['cpu_ms']} ms: {r}"
        assert r["cpu_total_ms"] >= r["cpu_ms"], r
        # the slot was held while the charged CPU ran (1 ms of slack for clock reads)
        assert r["held_ms"] + 1 >= r["cpu_ms"], r
        assert r["held_runqueue_ms"] <= r["held_ms"] + 1, r
        assert r["handoff_ms"] <= r["paused_ms"] + 0.01, r
        assert r["paused_runqueue_ms"] <= r["paused_ms"] + 0.01, r
        # run delay in all covers the parts holding a slot and paused
        assert r["runqueue_ms"] + 0.01 >= r["held_runqueue_ms"] + r["paused_runqueue_ms"], r
        assert r["runqueue_before_slot_ms"] <= (r["runqueue_ms"] - r["held_runqueue_ms"]
                                                - r["paused_runqueue_ms"] + 0.01), r
        assert 0 <= r["admitted_ms"] <= r["first_slot_ms"] <= r["finished_ms"], r
        assert r["held_ms"] + r["paused_ms"] <= r["finished_ms"] + 1, r
        assert not r["failed"], r
    # with one slot, the two took turns: both waited, and were handed the slot
    assert all(r["handoffs"] >= 1 and r["paused_ms"] > 0 for r in rows), rows


@check
def a_slot_is_held_by_one_process_at_a_time(s):
    # Two scans take turns on one slot, their backends on one CPU. The slot is held by
    # one process at a time, so the records' held times add up to no more than the span
    # of the two statements. The process handing the slot over must stop counting it
    # before it wakes the receiver: the receiver's wake-up preempts it on their shared
    # CPU, and the time until it can go to sleep (up to a scheduler tick) would count as
    # held by both. The watchdog lends no slot meanwhile: `big` is in shared buffers,
    # so no holder waits for a read.
    set_server(s, "pg_stride.cpu_slots", 1)
    s.sql("SELECT count(*) FROM big")
    since = s.sql("SELECT now()")
    try:
        procs = [subprocess.Popen(
            s.psql_args("SET pg_stride.trace = on; SELECT pg_sleep(1); "
                        "SELECT count(*) FROM big WHERE a % 7 <> 3"),
            env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)]
        pids = sleeping_backends_on_one_cpu(s, "pg_sleep(1)", 2)
        results = [finish(p, timeout=120) for p in procs]
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)
    assert len(pids) == 2, f"the two sessions' backends: {pids}"
    assert all(r[0] == 0 for r in results), results
    rows = [r for r in records(s, since) if r["cpu_ms"] > 50]
    assert len(rows) == 2, f"two scans, {len(rows)} records: {rows}"
    span_ms = float(s.sql(
        "SELECT extract(epoch FROM max(arrival + finished_ms * interval '1 ms') "
        f"- min(arrival)) * 1000 FROM pg_stride.trace WHERE arrival > '{since}' "
        "AND cpu_ms > 50"))
    held = sum(r["held_ms"] for r in rows)
    handoffs = sum(r["handoffs"] for r in rows)
    print(f"    held {held:.1f} ms in all over a span of {span_ms:.1f} ms, "
          f"{handoffs:.0f} hand-offs")
    assert handoffs >= 20, f"the scans hardly took turns: {rows}"
    # slack: the clock reads around each hand-off
    assert held <= span_ms + 0.01 * handoffs + 1, (held, span_ms, rows)
    # From its first slot on, a statement holds a slot or waits for one: the time from
    # giving the slot up to sleeping counts as waiting, not as nothing.
    for r in rows:
        other = r["finished_ms"] - r["first_slot_ms"] - r["held_ms"] - r["paused_ms"]
        print(f"    held {r['held_ms']:.1f} + paused {r['paused_ms']:.1f} of "
              f"{r['finished_ms'] - r['first_slot_ms']:.1f} ms after the first slot")
        assert other < 0.02 * r["finished_ms"] + 1, r


@check
def a_hand_off_counts_from_the_hand_over(s):
    # Three scans on two pinned slots take turns. The giver notes the hand-off before
    # it moves the receiver onto its CPU: the move can let the receiver run at once and
    # preempt the giver there, so a note written after it came too late, and the
    # receiver counted its whole pause as hand-off latency: 0.58-0.66 ms a hand-off,
    # 46-57 % of the pauses, here before the fix, 0.02 ms after it.
    set_server(s, "pg_stride.cpu_slots", 2)
    set_server(s, "pg_stride.pin_slots", "on")
    try:
        s.wait_until("SELECT cpu_slots FROM pg_stride.scheduler", "2", timeout=15)
        results, rows = traced(s, "SELECT count(*) FROM big WHERE a % 7 <> 3", clients=3)
    finally:
        set_server(s, "pg_stride.pin_slots", None)
        set_server(s, "pg_stride.cpu_slots", 0)
    assert all(r[0] == 0 for r in results), results
    assert len(rows) == 3, f"three scans, {len(rows)} records: {rows}"
    handoffs = sum(r["handoffs"] for r in rows)
    handoff_ms = sum(r["handoff_ms"] for r in rows)
    paused_ms = sum(r["paused_ms"] for r in rows)
    print(f"    {handoffs:.0f} hand-offs, {handoff_ms:.1f} ms of hand-off latency in "
          f"{paused_ms:.1f} ms paused ({handoff_ms / max(handoffs, 1):.3f} ms each)")
    assert handoffs >= 30, f"the scans hardly took turns: {rows}"
    assert handoff_ms <= 0.2 * paused_ms, rows


def backend_policies(s):
    """The kernel scheduling policy of each client backend, by pid (os.SCHED_*)."""
    pids = s.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                 "AND pid <> pg_backend_pid()").split()
    policies = {}
    for pid in pids:
        try:
            policies[int(pid)] = os.sched_getscheduler(int(pid))
        except ProcessLookupError:
            pass
    return policies


@check
def a_slots_receiver_woken_as_batch_runs_as_other_again(s):
    # Short counts run one after the other beside three scans on two pinned slots, so
    # that each count hands its slot to a waiting scan when its ExecutorRun ends. The
    # scan wakes as SCHED_BATCH, so that it waits for the count to finish; every backend
    # must be SCHED_OTHER again once it ran. A count then stays runnable without a slot
    # after its ExecutorRun 0-0.27 ms; when the scan preempted it there (before this
    # was fixed behaviour), 2.0-2.4 ms (bench/results/handoff-and-slices/
    # alpha095_own_slices): it must stay under half of that.
    scan = "SELECT count(*) FROM big WHERE a % 7 <> 3;" * 40
    count = "SET pg_stride.trace = on;" + "SELECT count(*) FROM big WHERE a <= 200000;" * 30
    set_server(s, "pg_stride.cpu_slots", 2)
    set_server(s, "pg_stride.pin_slots", "on")
    try:
        s.wait_until("SELECT cpu_slots FROM pg_stride.scheduler", "2", timeout=15)
        scans = [subprocess.Popen(s.psql_args(scan), env=ENV, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(3)]
        try:
            time.sleep(0.5)
            results, rows = traced(s, count, settings="")
            # The scans go on handing their slots over; a receiver may be SCHED_BATCH at
            # one reading, but not at every one unless it stays so.
            samples = []
            for _ in range(5):
                samples.append(backend_policies(s))
                time.sleep(0.05)
            common = set.intersection(*(set(x) for x in samples))
            batch = [p for p in common if all(x[p] == os.SCHED_BATCH for x in samples)]
        finally:
            for p in scans:
                p.kill()
                p.wait()
            # A backend notices its client gone only when it next talks to it.
            s.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE query LIKE '%a % 7 <> 3%' AND pid <> pg_backend_pid()")
            s.wait_until("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                         "'%a % 7 <> 3%' AND pid <> pg_backend_pid()", "0", timeout=15)
        assert all(r[0] == 0 for r in results), results
        rows = [r for r in rows if r["first_slot_ms"] is not None]
        assert len(rows) >= 20, f"{len(rows)} counts took a slot: {rows}"
        # Judged by the median count: one count that another process preempts for a
        # kernel slice would move a mean of some thirty by most of the bound.
        after = sorted(
            r["runqueue_ms"] - r["held_runqueue_ms"] - r["paused_runqueue_ms"]
            - r["runqueue_before_slot_ms"] for r in rows)
        after_last, after_mean = after[len(after) // 2], sum(after) / len(after)
    finally:
        set_server(s, "pg_stride.pin_slots", None)
        set_server(s, "pg_stride.cpu_slots", 0)
    print(f"    runnable without a slot after the last, a count: median {after_last:.3f} ms, "
          f"mean {after_mean:.3f} ms")
    print(f"    backends SCHED_BATCH at all of five readings 50 ms apart: {batch}")
    assert batch == [], batch
    assert after_last < 1.0, after_last


@check
def a_scan_sharing_its_cpu_records_its_run_delay(s):
    # A scan's backend shares one CPU with a process that only burns CPU: it is runnable
    # but not running about half of its time, and the record says so (runqueue_ms), most
    # of it while holding its slot. Without the run delay measured, runqueue_ms is 0.
    since = s.sql("SELECT now()")
    scan = subprocess.Popen(
        s.psql_args("SET pg_stride.trace = on; SELECT pg_sleep(0.5); "
                    "SELECT count(*) FROM big WHERE a % 7 <> 3"),
        env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {min(os.sched_getaffinity(0))})
        pids = sleeping_backends_on_one_cpu(s, "pg_sleep(0.5)", 1)
        result = finish(scan, timeout=120)
    finally:
        hog.kill()
        hog.wait()
    assert pids, "the scan's backend"
    assert result[0] == 0, result
    rows = [r for r in records(s, since) if r["cpu_ms"] > 50]
    assert len(rows) == 1, rows
    r = rows[0]
    print(f"    finished {r['finished_ms']:.1f} ms: cpu {r['cpu_ms']:.1f}, runnable not running "
          f"{r['runqueue_ms']:.1f} (holding a slot {r['held_runqueue_ms']:.1f}, paused "
          f"{r['paused_runqueue_ms']:.1f})")
    assert r["runqueue_ms"] >= 0.3 * r["finished_ms"], r
    assert r["runqueue_ms"] + 0.01 >= r["held_runqueue_ms"] + r["paused_runqueue_ms"], r
    assert r["held_runqueue_ms"] >= 0.5 * r["runqueue_ms"], r


@check
def a_parallel_scan_records_its_workers(s):
    settings = ("SET pg_stride.trace = on; SET max_parallel_workers_per_gather = 2; "
                "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                "SET min_parallel_table_scan_size = 0;")
    # the concurrency hint grants workers from the recent average of free slots: let it
    # see the server idle after the previous checks' scans
    s.wait_until("SELECT hint >= cpu_slots - 0.1 FROM pg_stride.scheduler", "t")
    results, rows = traced(s, "SELECT count(*) FROM big", settings=settings)
    assert results[0][0] == 0, results
    assert len(rows) == 1, rows
    r = rows[0]
    print(f"    processes {r['processes']:.0f}, planned workers {r['workers_planned']:.0f}, "
          f"cpu {r['cpu_ms']:.1f} ms, in all {r['cpu_total_ms']:.1f} ms")
    assert r["workers_planned"] == 2, r
    # the concurrency hint grants the free slots but the leader's: on two CPUs, one
    assert 2 <= r["processes"] <= 3, f"no worker granted on an idle server: {r}"
    # each worker's CPU from its start counts: start-up happens outside the slots
    assert r["cpu_total_ms"] > r["cpu_ms"], r


@check
def a_parallel_plan_granted_no_worker_joins_at_its_first_check_in(s):
    # The same one-row parallel scan: given its worker on an idle server, it joins CPU
    # scheduling at ExecutorStart, so that the worker finds its entry, and is recorded;
    # in a group whose max_parallel_workers is 0 it runs as a serial plan does, joining
    # at its scans' first chunk, which it never reaches: no record.
    settings = ("SET pg_stride.trace = on; SET max_parallel_workers_per_gather = 2; "
                "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                "SET min_parallel_table_scan_size = 0;")
    sql = "SELECT count(*) FROM one_row"
    s.wait_until("SELECT hint >= cpu_slots - 0.1 FROM pg_stride.scheduler", "t")
    results, with_worker = traced(s, sql, settings=settings)
    assert results[0][0] == 0, results
    results, without = traced(
        s, sql, settings=settings + "SET pg_stride.resource_group = 'no_workers';")
    assert results[0][0] == 0, results
    print(f"    records: with a worker {[r['processes'] for r in with_worker]} (processes), "
          f"granted none {len(without)}")
    assert len(with_worker) == 1 and with_worker[0]["processes"] >= 2, with_worker
    assert without == [], without


@check
def work_without_yield_points_shows_as_long_slices(s):
    settings = "SET pg_stride.trace = on; SET work_mem = '512MB';"
    _, plain = traced(s, "SELECT count(*) FROM big", settings=settings)
    _, sorted_ = traced(s, "SELECT count(*) FROM (SELECT a FROM big ORDER BY a DESC OFFSET 0) t",
                        settings=settings)
    assert len(plain) == 1 and len(sorted_) == 1, (plain, sorted_)
    p, o = plain[0], sorted_[0]
    print(f"    plain scan: {p['long_slice_ms']:.1f} of {p['cpu_ms']:.1f} ms in long slices; "
          f"sort: {o['long_slice_ms']:.1f} of {o['cpu_ms']:.1f} ms")
    # a scan checks in every slice; sorting 3,000,000 tuples in memory happens between
    # the scan's last tuple and the sort's first, with no check-in
    assert p["long_slice_ms"] < 0.1 * p["cpu_ms"], p
    assert o["long_slice_ms"] > 20, o


@check
def nodes_returning_stored_tuples_are_yield_points(s):
    # A nested loop rescans its inner Materialize three times: 9,000,000 tuples
    # returned from the tuplestore with no scan below. Without a yield point of its own
    # that ran as 396 ms of long slices (a debug build); the Materialize checks in as
    # it returns them.
    sql = ("SELECT count(*) FROM (SELECT x FROM generate_series(1, 4) x) v, "
           "(SELECT a FROM big OFFSET 0) b WHERE b.a > v.x")
    _, rows = traced(s, sql, settings="SET pg_stride.trace = on; SET work_mem = '512MB';")
    assert len(rows) == 1, rows
    r = rows[0]
    print(f"    {r['long_slice_ms']:.1f} of {r['cpu_ms']:.1f} ms in long slices")
    assert r["cpu_ms"] > 200, r
    assert r["long_slice_ms"] < 0.1 * r["cpu_ms"], r


@check
def an_init_plans_scan_is_a_yield_point(s):
    # The statement's only scan is in its InitPlan: it checks in there, so it is
    # scheduled (and traced) and its slices keep to the target.
    _, rows = traced(s, "SELECT (SELECT count(*) FROM big WHERE a % 3 = 0) + 1")
    assert len(rows) == 1, f"the InitPlan's scan never checked in: {rows}"
    r = rows[0]
    print(f"    {r['long_slice_ms']:.1f} of {r['cpu_ms']:.1f} ms in long slices")
    assert r["cpu_ms"] > 50, r
    assert r["long_slice_ms"] < 0.1 * r["cpu_ms"], r


@check
def a_failed_statement_is_recorded_as_failed(s):
    results, rows = traced(s, "SELECT count(*) FROM big",
                           settings="SET pg_stride.trace = on; SET statement_timeout = '30ms';")
    assert results[0][0] != 0 and "statement timeout" in results[0][2], results
    assert len(rows) == 1 and rows[0]["failed"], rows


@check
def a_statement_planned_tiny_is_scheduled_once_it_ran_long_twice(s):
    # few() declares one row and returns 2,000,000: its plan costs under 1, so it starts
    # unscheduled, as a primary-key lookup does. It runs for far more than ten slices,
    # and after its second long run its fingerprint is scheduled: the third
    # and fourth runs join CPU scheduling at their first check-in, and only they are
    # recorded.
    cost = float(s.sql("SELECT (regexp_match(e, 'cost=[0-9.]+\\.\\.([0-9.]+)'))[1] "
                       "FROM plan_of('SELECT count(*) FROM few()') AS e LIMIT 1"))
    assert cost < 50, f"few()'s plan costs {cost}, not a tiny plan"
    results, rows = traced(s, "SELECT count(*) FROM few(); " * 4)
    assert results[0][0] == 0 and results[0][1].split() == ["2000000"] * 4, results
    assert len(rows) == 2, f"four runs, the last two scheduled; {len(rows)} records: {rows}"
    assert all(r["cpu_ms"] > 0 and not r["failed"] for r in rows), rows


@check
def a_session_that_zeroed_the_planners_costs_still_has_its_reads_scheduled(s):
    # With the CPU costs at 0 (any role may set them) a count over big costs under the
    # tiny bound; the bound is scaled alike, so the count is still scheduled (recorded).
    zero = ("SET cpu_tuple_cost = 0; SET cpu_operator_cost = 0; SET cpu_index_tuple_cost = 0; "
            "SET seq_page_cost = 0; SET random_page_cost = 0; ")
    cost = float(s.sql(zero + "SELECT (regexp_match(e, 'cost=[0-9.]+\\.\\.([0-9.]+)'))[1] "
                       "FROM plan_of('SELECT count(*) FROM big') AS e LIMIT 1"))
    assert cost < 50, f"with the costs zeroed the count costs {cost}"
    results, rows = traced(s, zero + "SELECT count(*) FROM big")
    assert results[0][0] == 0, results
    assert len(rows) == 1 and not rows[0]["failed"], rows


# The plan of a statement the query-id checks prepare before their first scheduled one.
EXPLAIN_EARLY = "EXPLAIN (VERBOSE, COSTS OFF) EXECUTE early(0);\n"


def identifiers_shown(explained):
    """For each plan's top node and each Query Identifier line in the output of EXPLAIN
    (VERBOSE) of a count, in order: whether the line is a Query Identifier (EXPLAIN
    prints it after its plan)."""
    return [ln.startswith("Query Identifier") for ln in explained.splitlines()
            if ln.startswith(("Query Identifier", "Aggregate", "Finalize Aggregate"))]


@check
def query_ids_are_computed_in_a_backend_once_it_ran_a_scheduled_statement(s):
    # Catches: query identifiers asked for in every backend (PostgreSQL's walk of each
    # parse tree costs a short statement sent as text more than everything else
    # pg_stride adds to it), or never asked for where statements are scheduled (their
    # trace records and prediction are keyed by them). compute_query_id is auto, the
    # default, and neither pg_stride.trace nor pg_stride.tuner is on at server start
    # (regress/prediction.py checks the same with pg_stride.predict on).
    # With the trace on, a statement prepared before then gets its identifier too, at its
    # next execution: without it, it would keep none for the rest of the session.
    own = OWN_QUERY_ID_COMPUTED
    script = ("PREPARE early AS SELECT count(*) FROM big WHERE a > $1;\n" + EXPLAIN_EARLY
              + own + "SELECT a > 0 FROM big LIMIT 1;\n" + own
              + "SELECT count(*) > 0 FROM big;\n" + own + EXPLAIN_EARLY)
    # pg_stride.trace may be set by superusers only: for this role's sessions, by role.
    s.sql("ALTER ROLE regress_other SET pg_stride.trace = on")
    try:
        out = subprocess.run(s.psql_args(None, user="regress_other"), input=script, env=ENV,
                             text=True, capture_output=True)
    finally:
        s.sql("ALTER ROLE regress_other RESET pg_stride.trace")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # The LIMIT 1 plan is tiny (never scheduled); the count is scheduled.
    assert [ln for ln in lines if ln in ("t", "f")] == ["f", "t", "f", "t", "t"], out.stdout
    identified = identifiers_shown(out.stdout)
    assert identified == [False, False, True], out.stdout
    assert s.sql("SHOW compute_query_id") == "auto"


def restart(s):
    # Not s.start(): the suite's server starts by running initdb.
    s.pg_ctl("-m", "fast", "-w", "stop", check=True, stdout=subprocess.DEVNULL)
    s.pg_ctl("-l", s.logfile, "-w", "start", check=True, stdout=subprocess.DEVNULL)


@check
def plans_cached_while_query_ids_were_off_get_them_once_they_are_on(s):
    # Catches: a backend that took its plans to carry identifiers because the trace was
    # on at server start, although compute_query_id was off then: a statement prepared
    # while it was off kept identifier 0 for the rest of the session once it was on.
    script = ("PREPARE early AS SELECT count(*) FROM big WHERE a > $1;\n"
              "SELECT count(*) > 0 FROM big;\n" + EXPLAIN_EARLY
              + "SET compute_query_id = auto;\nSELECT count(*) > 0 FROM big;\n" + EXPLAIN_EARLY)
    try:
        s.sql("ALTER SYSTEM SET pg_stride.trace = on")
        s.sql("ALTER SYSTEM SET compute_query_id = off")
        restart(s)
        out = subprocess.run(s.psql_args(None), input=script, env=ENV, text=True,
                             capture_output=True)
    finally:
        s.sql("ALTER SYSTEM RESET pg_stride.trace")
        s.sql("ALTER SYSTEM RESET compute_query_id")
        restart(s)
    assert out.returncode == 0, out.stderr
    identified = identifiers_shown(out.stdout)
    # EXPLAIN prints the identifier after the plan.
    assert identified == [False, False, True], out.stdout


@check
def a_statement_prepared_before_compute_query_id_was_set_on_gets_its_identifier(s):
    # Catches: a backend that took its cached plans to carry identifiers because they
    # were computed when its first statement joined CPU scheduling, although a statement
    # prepared before then (compute_query_id = auto, nothing had asked for them) had none.
    script = ("PREPARE early AS SELECT count(*) FROM big WHERE a > $1;\n" + EXPLAIN_EARLY
              + "SET pg_stride.trace = on; SET compute_query_id = on;\n"
              "SELECT count(*) > 0 FROM big;\n" + EXPLAIN_EARLY)
    out = subprocess.run(s.psql_args(None), input=script, env=ENV, text=True,
                         capture_output=True)
    assert out.returncode == 0, out.stderr
    identified = identifiers_shown(out.stdout)
    assert identified == [False, False, True], out.stdout


@check
def other_roles_statements_show_no_query_id_or_times(s):
    """As pg_stat_activity and pg_stat_statements do: a role sees the query id, times
    and place in the schedule of its own statements in pg_stride.activity and
    pg_stride.trace, a member of pg_read_all_stats sees everyone's, and another ordinary
    role sees those columns NULL (also when it calls the views' functions directly)."""
    writer = subprocess.Popen(
        s.psql_args("SELECT count(*) FROM big, generate_series(1, 10)", user="regress_writer"),
        env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hidden = ("SELECT bool_and(cpu_time_ms IS NULL AND priority IS NULL AND admitted_at IS NULL "
              "AND paused_time_ms IS NULL) FROM pg_stride.activity WHERE usename = 'regress_writer' AND pid <> pg_backend_pid()")
    shown = ("SELECT bool_and(cpu_time_ms IS NOT NULL AND priority IS NOT NULL "
             "AND admitted_at IS NOT NULL) FROM pg_stride.activity WHERE usename = 'regress_writer' AND pid <> pg_backend_pid()")
    s.wait_until("SELECT count(*) FROM pg_stride.activity WHERE usename = 'regress_writer' "
                 "AND cpu_time_ms > 0", "1", timeout=20)
    seen = {user: (s.sql(hidden, user=user), s.sql(shown, user=user))
            for user in ["regress_other", "regress_stats", "regress_writer"]}
    assert finish(writer, timeout=60)[0] == 0
    assert seen == {"regress_other": ("t", "f"), "regress_stats": ("f", "t"),
                    "regress_writer": ("f", "t")}, seen
    writer_oid = s.sql("SELECT oid FROM pg_roles WHERE rolname = 'regress_writer'")
    trace_hidden = ("SELECT count(*) > 0, bool_and(query_id IS NULL AND cpu_ms IS NULL AND arrival IS NULL "
                    "AND finished_ms IS NULL AND group_name IS NULL AND processes IS NULL "
                    "AND workers_planned IS NULL AND failed IS NULL) "
                    f"FROM pg_stride.trace WHERE userid = {writer_oid}")
    trace_shown = ("SELECT count(*) > 0, bool_and(query_id <> 0 AND cpu_ms > 0 AND arrival IS NOT NULL "
                   "AND group_name IS NOT NULL AND processes > 0 AND failed IS NOT NULL) "
                   f"FROM pg_stride.trace WHERE userid = {writer_oid}")
    direct = ("SELECT bool_and(query_id IS NULL AND cpu_ms IS NULL) FROM pg_stride.trace_records() "
              f"WHERE userid = {writer_oid}")
    assert s.sql(trace_hidden, user="regress_other") == "t|t", s.sql(trace_hidden, user="regress_other")
    assert s.sql(direct, user="regress_other") == "t"
    for user in ["regress_stats", "regress_writer", "postgres"]:
        assert s.sql(trace_shown, user=user) == "t|t", (user, s.sql(trace_shown, user=user))
    print("    other role: NULL; own role, pg_read_all_stats, superuser: shown")


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql("CREATE ROLE regress_writer LOGIN; CREATE ROLE regress_other LOGIN; "
          "CREATE ROLE regress_stats LOGIN IN ROLE pg_read_all_stats")
    s.sql("ALTER ROLE regress_writer SET pg_stride.trace = on; "
          "ALTER ROLE regress_writer SET compute_query_id = on")
    s.sql("CREATE TABLE big AS SELECT g AS a FROM generate_series(1, 3000000) g")
    s.sql("VACUUM ANALYZE big")
    s.sql("CREATE TABLE one_row AS SELECT 1 AS a; ALTER TABLE one_row SET (parallel_workers = 2); "
          "GRANT SELECT ON one_row TO PUBLIC")
    s.sql("SELECT pg_stride.create_group('no_workers', max_parallel_workers => 0)")
    s.sql("GRANT SELECT ON big TO regress_writer, regress_other")
    s.sql("CREATE FUNCTION few() RETURNS SETOF int LANGUAGE plpgsql ROWS 1 "
          "AS 'BEGIN RETURN QUERY SELECT generate_series(1, 2000000); END'")
    s.sql("CREATE FUNCTION plan_of(q text) RETURNS SETOF text LANGUAGE plpgsql "
          "AS 'BEGIN RETURN QUERY EXECUTE ''EXPLAIN '' || q; END'")


def main():
    server = concurrency.Server(port=concurrency.PORT + 10, extra_conf=CONF)
    return concurrency.run_suite("trace", server, CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
