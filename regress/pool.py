#!/usr/bin/env python3
"""Pooled parallel execution, `pg_stride.parallel_mode = pool` (docs/internals/pool.md).

Every check runs real Gathers against a temporary server and reads what the pool did
from its views (`pg_stride.pool`, `pg_stride.pool_fallbacks`) and counters
(`pg_stride.pool_counters()`):

- results are those of a serial run, for two roles with different search_path (that
  resolves `t` to two different tables) and work_mem, checked inside the fragment, and
  for a Gather that projects (a parallel-restricted function in the target list) and
  one that needs the value of an initPlan;
- a Gather Merge run by pool workers gives its rows in the serial order (keys up and
  down, NULLs, ties, LIMIT), with the leader taking part and without, and a worker's
  ERROR in one reaches the leader;
- a pool worker keeps the settings of the leader it last served, restoring them only
  when they differ, and a SET, a function's SET clause or an ERROR in a fragment still
  reaches the session's next fragment;
- an ERROR in a fragment reaches the leader with its SQLSTATE, and the pool worker
  serves on (same pids);
- a worker's ERROR reaches a leader that waits for it at a Parallel Hash build's
  barrier at once, and a PL/pgSQL block that catches it goes on;
- notices of workers that a leader waits for at a barrier all arrive, and the
  statement does not wait for its timeout;
- statement_timeout and cancel of the leader stop its fragments: no wrong result, no
  lock left to a pool worker, the same pool afterwards;
- a pool worker terminated mid-fragment, under a Gather or a Gather Merge, or while
  the leader waits for it at a hash build's barrier, fails the leader's statement
  cleanly and is replaced;
- a leader with an XID runs with PostgreSQL's own workers, and the fallback is counted;
- DROP DATABASE is not blocked by that database's pool;
- pool workers idle for pg_stride.pool_idle_timeout exit;
- pool workers show in pg_stat_activity as backend_type 'pg_stride pool';
- the trace counts a pool worker's CPU per fragment.

Starts its own temporary server and prints one line per check, then
"pool: N passed, N failed". Run as root, the server runs as postgres.
"""

import json
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
import wire  # noqa: E402

POOL_SIZE = 4
# Parallel plans for small tables (not for catalogs: a monitoring query whose leader
# has RECORD typmods would retire the worker that helped it), and CPU slots enough for
# the concurrency hint to grant every planned worker. Prediction off: these small
# statements would be predicted short, and get no workers while another statement runs
# (regress/prediction.py checks that rule).
CONF = f"""
pg_stride.parallel_mode = pool
pg_stride.predict = off
pg_stride.pool_size = {POOL_SIZE}
pg_stride.cpu_slots = 8
max_worker_processes = 32
max_parallel_workers = 16
max_parallel_workers_per_gather = 2
parallel_setup_cost = 0
parallel_tuple_cost = 0
min_parallel_table_scan_size = '512kB'
"""
# Evaluated in every process of the plan: the row counts only if the process runs with
# the session's role, search_path and work_mem.
QUERY = ("SELECT count(*), sum(b), sum((current_user = '{role}' AND "
         "current_setting('search_path') = '{path}' AND "
         "current_setting('work_mem') = '{work_mem}')::int) FROM t")
SESSIONS = [("regress_pool_a", "s1, public", "3MB"), ("regress_pool_b", "s2, public", "5MB")]

# What EXPLAIN shows for a Gather (a Gather Merge) in a plan made for the pool.
STRIDE_GATHER = "->  Custom Scan (Stride Gather)"
STRIDE_GATHER_MERGE = "Custom Scan (Stride Gather Merge)"

CHECKS = []
check = concurrency.collector(CHECKS)


def counters(s):
    return dict(line.split("|") for line in s.sql(
        "SELECT name, value FROM pg_stride.pool_counters()").splitlines())


def counted(s, before, name):
    return int(counters(s)[name]) - int(before[name])


def pool_pids(s, database="postgres"):
    out = s.sql(f"SELECT pid FROM pg_stride.pool WHERE datname = '{database}' ORDER BY pid")
    return [int(p) for p in out.split()]


def full_pool(s, role=None, fresh=True):
    """Runs parallel statements, as the sessions of `role` do (SET ROLE; the superuser's
    own without), until the pool of `postgres` has all its workers idle; returns their
    pids. A pool worker serves the leaders of one identity only, the first it served
    (docs/internals/pool.md): `fresh`, the pool's workers are replaced first, so that
    none serves another identity than the check's."""
    if fresh:
        s.sql("SELECT pg_terminate_backend(pid) FROM pg_stride.pool WHERE datname = 'postgres'")
        deadline = time.monotonic() + 10
        while pool_pids(s):
            assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
            time.sleep(0.05)
    as_role = f"SET ROLE {role}; " if role else ""
    deadline = time.monotonic() + 30
    while True:
        s.sql(as_role + "SELECT count(*) FROM s1.t")
        idle = s.sql("SELECT count(*) FROM pg_stride.pool WHERE datname = 'postgres' AND state = 'idle'")
        if int(idle) == POOL_SIZE:
            return pool_pids(s)
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        time.sleep(0.2)


def assert_pool_clean(s, pids):
    """The same pool workers, all idle, holding no lock and in nobody's lock group."""
    deadline = time.monotonic() + 10
    while s.sql("SELECT count(*) FROM pg_stride.pool WHERE state <> 'idle'") != "0":
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        time.sleep(0.1)
    assert pool_pids(s) == pids, (pool_pids(s), pids)
    locks = s.sql("SELECT count(*) FROM pg_locks JOIN pg_stride.pool USING (pid)")
    assert locks == "0", s.sql("SELECT * FROM pg_locks JOIN pg_stride.pool USING (pid)")
    groups = s.sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_stride pool' "
                   "AND leader_pid IS NOT NULL")
    assert groups == "0", groups


def session(s, i, role=None):
    """A session of SESSIONS[i] (as `role` if given), and its QUERY."""
    own_role, path, work_mem = SESSIONS[i]
    role = role or own_role
    x = concurrency.Session(s)
    x.run(f"SET ROLE {role}; SET search_path = {path}; SET work_mem = '{work_mem}'; SELECT 1")
    return x, QUERY.format(role=role, path=path, work_mem=work_mem)


def session_going_on_after_errors(s, i, role=None):
    """session(), with psql going on after a failed statement (it prints the error on
    stderr); also returns the result of the session's query from a first run."""
    x, sql = session(s, i, role)
    expected = x.run(sql)
    x.run("\\set ON_ERROR_STOP 0\nSELECT 1")
    return x, sql, expected


def lines_until(x, marker, timeout=60):
    """Reads the session's output lines up to the one that is `marker`."""
    out = []
    while (line := x.run("", lines=1, timeout=timeout, end="")[0]) != marker:
        out.append(line)
    return out


def serial_result(x, sql):
    x.run("SET max_parallel_workers_per_gather = 0; SELECT 1")
    expected = x.run(sql)
    x.run("RESET max_parallel_workers_per_gather; SELECT 1")
    return expected


@check
def pooled_results_match_serial_ones_across_roles_and_search_paths(s):
    """Two roles' sessions, each with its search_path and work_mem, alternate: every
    result is the serial one, and no pool worker runs fragments of both roles (each
    serves one identity), while the pool keeps its workers."""
    pids = full_pool(s, SESSIONS[0][0])
    before = counters(s)
    sessions = [session(s, i) for i in range(len(SESSIONS))]
    leaders = [int(x.run("SELECT pg_backend_pid()")[0]) for x, _ in sessions]
    expected = [serial_result(x, sql) for x, sql in sessions]
    # Each table's own count in the last column: the fragment saw the session's state.
    assert expected[0] != expected[1], expected
    for exp in expected:
        count, _, matching = exp[0].split("|")
        assert count == matching, exp
    # the leaders each pool worker served, as pg_stride.pool shows its last one
    served = {}
    for _ in range(20):
        for (x, sql), exp in zip(sessions, expected):
            assert x.run(sql) == exp
            for line in s.sql("SELECT pid, leader_pid FROM pg_stride.pool "
                              "WHERE datname = 'postgres' AND leader_pid IS NOT NULL").split():
                pid, leader = map(int, line.split("|"))
                served.setdefault(pid, set()).add(leader)
    for x, _ in sessions:
        x.close()
    ran = counted(s, before, "fragments_ok")
    assert ran >= 20, counters(s)
    assert all(len(seen) == 1 for seen in served.values()), (served, leaders)
    assert {l for seen in served.values() for l in seen} == set(leaders), (served, leaders)
    assert_pool_clean(s, pids)
    print(f"    40 of 40 results as serial, {ran} fragments in pool workers; "
          f"{len(served)} workers, each serving one role's session")


def ten_runs_as_serial_in_the_pool(s, pids, sql, serial_prefix, gathers):
    """Runs `sql` serially (its result must start with `serial_prefix`), then 10 times
    with the pool: each result as the serial one, and `gathers` Gathers run by pool
    workers in all."""
    x = concurrency.Session(s)
    expected = serial_result(x, sql)
    assert expected[0].startswith(serial_prefix), expected
    before = counters(s)
    for _ in range(10):
        assert x.run(sql) == expected
    x.close()
    pooled = counted(s, before, "gathers_pooled")
    assert pooled == gathers, counters(s)
    assert_pool_clean(s, pids)
    print(f"    10 of 10 results as serial; {pooled} Gathers ran in the pool")


@check
def a_gather_that_projects_runs_in_the_pool(s):
    """A parallel-restricted function in the target list: the Gather itself evaluates it
    (its own projection) over the tuples the pool workers send."""
    pids = full_pool(s)
    sql = ("SELECT count(*), string_agg(v::text, ',' ORDER BY v) FROM "
           "(SELECT s1.restricted(a) * 2 + b AS v FROM s1.t WHERE a % 997 = 0) q")
    plan = s.sql("EXPLAIN (VERBOSE, COSTS OFF) " + sql).splitlines()
    gather = [i for i, line in enumerate(plan) if line.strip().startswith(STRIDE_GATHER)]
    assert len(gather) == 1 and "Merge" not in plan[gather[0]], plan
    assert "s1.restricted" in plan[gather[0] + 1], plan
    ten_runs_as_serial_in_the_pool(s, pids, sql, f"{200000 // 997}|", gathers=10)


@check
def a_gather_with_an_init_plan_parameter_runs_in_the_pool(s):
    """The leader evaluates the initPlan and sends its value with the fragment, as
    ExecGather does for PostgreSQL's workers."""
    pids = full_pool(s)
    sql = ("SELECT count(*), sum(b) FROM s1.t "
           "WHERE a > (SELECT max(a) FROM s2.t WHERE b = 3) - 100000")
    # two Gathers: the initPlan's own, and the main one, whose scan filters on the
    # initPlan's value (EXPLAIN shows it as "Params Evaluated" up to 17 only)
    plan = s.sql("EXPLAIN (COSTS OFF) " + sql)
    assert "InitPlan 1" in plan and plan.count(STRIDE_GATHER) == 2, plan
    ten_runs_as_serial_in_the_pool(s, pids, sql, "150002|", gathers=20)


# Gather Merges (sorted in the workers, merged by the leader) whose row order is total,
# so that a serial run gives the one right answer: ascending, descending, NULLs first,
# ties on the first key broken by the second, a LIMIT (the bound reaches the workers'
# sorts), and an expression the workers compute.
MERGES = [
    "SELECT a, b FROM s1.t WHERE a % 97 = 0 ORDER BY a",
    "SELECT nullif(b, 3) AS n, a FROM s1.t WHERE a % 13 = 0 ORDER BY n NULLS FIRST, a DESC",
    "SELECT b, a FROM s1.t ORDER BY b DESC, a LIMIT 500",
    "SELECT a % 1000 AS m, a FROM s1.t WHERE b = 2 ORDER BY m, a DESC",
]


@check
def a_gather_merge_runs_in_the_pool_and_keeps_its_order(s):
    """Each query of MERGES runs through a Stride Gather Merge that pool workers run
    (EXPLAIN ANALYZE says so), and gives the serial run's rows in the serial order, 10
    times, with the leader taking part and without."""
    pids = full_pool(s)
    runs = 0
    for sql in MERGES:
        plan = s.sql("EXPLAIN (COSTS OFF) " + sql)
        assert plan.count(STRIDE_GATHER_MERGE) == 1, plan
        [gm] = stride_gathers(explain_json(s, sql))
        assert gm["Pool"] == "used" and gm["Workers Launched"] == 2, gm
        expected = s.sql("SET max_parallel_workers_per_gather = 0; " + sql).splitlines()
        assert len(expected) > 100 and len(set(expected)) == len(expected), expected[:5]
        before = counters(s)
        for participation in ["on", "off"]:
            for _ in range(5):
                got = s.sql(f"SET parallel_leader_participation = {participation}; "
                            + sql).splitlines()
                assert got == expected, next(
                    (i, g, e) for i, (g, e) in enumerate(zip(got + [None], expected)) if g != e)
                runs += 1
        assert counted(s, before, "gathers_pooled") == 10, counters(s)
        # (with the LIMIT, the workers stop at their next row once the leader has its rows)
        assert counted(s, before, "fragments_entered") >= 10, counters(s)
    assert_pool_clean(s, pids)
    print(f"    {runs} of {runs} results in the serial order ({len(MERGES)} queries), "
          "every Gather Merge run by pool workers")


@check
def an_error_in_a_gather_merge_fragment_reaches_the_leader(s):
    """A division by zero in a worker's part of a Gather Merge fails the statement with
    that error, and the pool serves on with the same workers."""
    pids = full_pool(s, SESSIONS[0][0])
    before = counters(s)
    x, sql, expected = session_going_on_after_errors(s, 0)
    failing = "SELECT a, 1 / (a % 50000) AS q FROM s1.t ORDER BY q, a"
    plan = s.sql("EXPLAIN (COSTS OFF) " + failing)
    assert plan.count(STRIDE_GATHER_MERGE) == 1, plan
    for _ in range(10):
        x.send(failing)
        assert x.run("SELECT 'after'") == ["after"]
    assert x.run(sql) == expected
    err = x.close()[2].decode()
    assert err.count("division by zero") == 10, err
    assert counted(s, before, "fragments_error") > 0, counters(s)
    assert_pool_clean(s, pids)
    print(f"    10 of 10 statements failed with division by zero; "
          f"{counted(s, before, 'fragments_error')} pool fragments ended in that ERROR")


@check
def a_pool_worker_keeps_a_leaders_settings_only_while_they_are_the_leaders(s):
    """A pool worker keeps the settings of the leader it last served: the same session
    running again restores none, and each change (SET, a function's SET clause, a
    fragment's ERROR, another session's settings, another session's fragment failing
    after its restore, a read-only transaction on 18) still reaches the next
    fragment."""
    pids = full_pool(s, SESSIONS[0][0])
    x, sql, _ = session_going_on_after_errors(s, 0)
    expected = serial_result(x, sql)
    role, path, _ = SESSIONS[0]
    before = counters(s)
    for _ in range(20):
        assert x.run(sql) == expected
    ran, restored = (counted(s, before, n) for n in ("fragments_ok", "leader_settings_restored"))
    # At most once per worker: the others found the session's settings in force.
    assert ran >= 20 and restored <= POOL_SIZE, counters(s)
    x.run("SET work_mem = '4MB'; SELECT 1")
    changed = QUERY.format(role=role, path=path, work_mem="4MB")
    serial = serial_result(x, changed)
    count, _, matching = serial[0].split("|")
    assert count == matching, serial
    before = counters(s)
    for _ in range(5):
        assert x.run(changed) == serial
    assert counted(s, before, "leader_settings_restored") > 0, counters(s)
    # A SET clause and an ERROR inside a fragment leave the session's settings as they were.
    own = "SELECT count(*) FROM s1.t WHERE s1.own_work_mem() = '9MB'"
    total = s.sql("SET max_parallel_workers_per_gather = 0; SELECT count(*) FROM s1.t")
    for _ in range(5):
        assert x.run(own) == [total]
        assert x.run(changed) == serial
        x.send("SELECT sum(1 / (a % 50000)) FROM s1.t")
        assert x.run(changed) == serial
    # Another session of the same identity (a worker serves no other), with its own
    # search_path and work_mem in force.
    y, ysql, _ = session_going_on_after_errors(s, 1, role)
    yexpected = serial_result(y, ysql)
    count, _, matching = yexpected[0].split("|")
    assert count == matching, yexpected
    for _ in range(5):
        assert y.run(ysql) == yexpected
        assert x.run(changed) == serial
    # Another session's fragments restore its settings, then fail.
    before = counters(s)
    for _ in range(5):
        y.send("SELECT sum(1 / (a % 50000)) FROM s1.t")
        assert y.run("SELECT 'after'") == ["after"]
        assert y.run(ysql) == yexpected
        y.send("SELECT sum(1 / (a % 50000)) FROM s1.t")
        assert y.run("SELECT 'after'") == ["after"]
        assert x.run(changed) == serial
    assert counted(s, before, "leader_settings_restored") >= 5, counters(s)
    y.close()
    # A read-only transaction: from 18 on, a parallel worker restores the leader's
    # settings inside its transaction, so every fragment in it sees transaction_read_only
    # on (up to 17 a parallel worker's transaction takes default_transaction_read_only).
    if int(s.sql("SHOW server_version_num")) >= 180000:
        read_only = ("SELECT sum((current_setting('transaction_read_only') = 'on')::int) "
                     "FROM s1.t")
        x.run("BEGIN READ ONLY; SELECT 1")
        for _ in range(5):
            assert x.run(read_only) == [total]
        x.run("COMMIT; SELECT 1")
        assert x.run(changed) == serial
    err = x.close()[2].decode()
    assert err.count("division by zero") == 5, err
    assert_pool_clean(s, pids)
    print(f"    {ran} fragments of one session restored its settings {restored} times "
          f"({POOL_SIZE} workers); a SET, a SET clause, an ERROR, another session's "
          "settings, its failed fragments (and on 18 a read-only transaction) "
          "each reached the next")


@check
def an_error_in_a_fragment_reaches_the_leader_and_the_worker_serves_on(s):
    pids = full_pool(s, SESSIONS[0][0])
    before = counters(s)
    x, sql, expected = session_going_on_after_errors(s, 0)
    for _ in range(20):
        x.send("SELECT sum(1 / (a % 50000)) FROM s1.t")
        # psql prints the error on stderr; the next statement's result shows it ended.
        assert x.run("SELECT 'after'") == ["after"]
    assert x.run(sql) == expected
    err = x.close()[2].decode()
    assert err.count("division by zero") == 20, err
    failed = counted(s, before, "fragments_error")
    assert failed > 0, counters(s)
    assert_pool_clean(s, pids)
    errors = s.sql("SELECT sum(errors) FROM pg_stride.pool")
    assert int(errors) >= failed, errors
    print(f"    20 of 20 statements failed with division by zero; {failed} pool fragments "
          "ended in that ERROR, their workers serve on")


# A Parallel Hash Join whose inner scan raises in every process but the leader (its pid
# is the second argument): the workers fail after they attached to the hash build's
# barrier, where the leader then waits for them.
BARRIER_QUERY = ("SELECT count(*) FROM s1.t JOIN s2.t u USING (a) "
                 "WHERE s1.fails_outside(u.b, {leader})")


@check
def a_workers_error_reaches_a_leader_waiting_at_a_parallel_hash_barrier(s):
    """The leader runs its own part of the join and waits at the build barrier for the
    failed workers: their ERROR must reach it there at once (as with PostgreSQL's own
    workers), not after statement_timeout; and a PL/pgSQL block that catches the ERROR
    goes on without a cancel left behind."""
    pids = full_pool(s, SESSIONS[0][0])
    before = counters(s)
    x, sql, expected = session_going_on_after_errors(s, 0)
    leader = x.run("SELECT pg_backend_pid()")[0]
    failing = BARRIER_QUERY.format(leader=leader)
    plan = s.sql("SET ROLE regress_pool_a; SET search_path = s1, public; "
                 "EXPLAIN (COSTS OFF) " + BARRIER_QUERY.format(leader=leader))
    assert "Parallel Hash Join" in plan and STRIDE_GATHER in plan, plan
    x.run("SET statement_timeout = '10s'; SELECT 1")
    took = []
    for _ in range(5):
        start = time.monotonic()
        x.send(failing)
        assert x.run("SELECT 'after'", timeout=20) == ["after"]
        took.append(time.monotonic() - start)
    # Caught in PL/pgSQL, the ERROR leaves no cancel behind: the block goes on.
    caught = x.run(f"""DO $$
BEGIN
  BEGIN
    PERFORM count(*) FROM s1.t JOIN s2.t u USING (a) WHERE s1.fails_outside(u.b, {leader});
  EXCEPTION WHEN raise_exception THEN
    PERFORM pg_sleep(0.2);
    RAISE NOTICE 'caught: %', SQLERRM;
  END;
  PERFORM pg_sleep(0.2);
END
$$; SELECT 'went on'""", timeout=20)
    assert caught == ["went on"], caught
    assert x.run(sql) == expected
    err = x.close()[2].decode()
    assert err.count("ERROR:  worker part failed") == 5, err
    assert "NOTICE:  caught: worker part failed" in err, err
    assert "canceling statement" not in err, err
    assert max(took) < 5, took
    assert counted(s, before, "fragments_error") >= 6, counters(s)
    assert_pool_clean(s, pids)
    print(f"    5 of 5 statements failed with the workers' ERROR after "
          f"{', '.join(f'{t:.2f}' for t in took)} s (statement_timeout 10 s); "
          "a PL/pgSQL block caught it and went on")


@check
def notices_of_workers_a_leader_waits_for_at_a_barrier_all_arrive(s):
    """Every process of a Parallel Hash build raises a notice per 300 inner rows, more
    than a worker's queue holds while the leader waits at the barrier without reading
    it: the statement ends at once with the serial result, and the client gets every
    notice (500), as with PostgreSQL's own workers."""
    pids = full_pool(s, SESSIONS[0][0])
    x, sql, expected = session_going_on_after_errors(s, 0)
    noisy = ("SELECT count(*) FROM s1.t JOIN s2.t u USING (a) "
             "WHERE s1.noisy(u.a)")
    plan = s.sql("EXPLAIN (COSTS OFF) " + noisy)
    assert "Parallel Hash Join" in plan and STRIDE_GATHER in plan, plan
    x.run("SET statement_timeout = '10s'; SELECT 1")
    start = time.monotonic()
    assert x.run(noisy, timeout=20) == ["150000"]
    took = time.monotonic() - start
    assert x.run(sql) == expected
    err = x.close()[2].decode()
    assert err.count("NOTICE:  every 300th row") == 500, err[-2000:]
    assert took < 5, took
    assert_pool_clean(s, pids)
    print(f"    the statement took {took:.2f} s; 500 of 500 notices reached the client")


@check
def statement_timeout_and_cancel_stop_the_fragments(s):
    pids = full_pool(s, SESSIONS[1][0])
    before = counters(s)
    x, sql, expected = session_going_on_after_errors(s, 1)
    ok = 0
    rng = random.Random(7)
    for _ in range(40):
        x.send(f"SET statement_timeout = '{rng.choice([5, 10, 20, 40, 80])}ms'; {sql}; "
               "RESET statement_timeout; SELECT 'end'")
        out = lines_until(x, "end")
        assert out in ([], expected), out
        ok += out == expected
    assert x.run(sql) == expected
    pid = x.run("SELECT pg_backend_pid()")[0]
    for _ in range(10):
        x.send("SELECT count(*) FROM s1.t a, generate_series(1, 40)")
        time.sleep(rng.uniform(0.02, 0.3))
        s.sql(f"SELECT pg_cancel_backend({pid})")
        x.send("SELECT 'next'")
        assert lines_until(x, "next") in ([], ["8000000"])
    assert x.run(sql) == expected
    err = x.close()[2].decode()
    cancelled = err.count("canceling statement")
    assert cancelled > 0, err
    assert_pool_clean(s, pids)
    print(f"    {cancelled} statements cancelled or timed out, {ok} finished, none wrong; "
          f"{counted(s, before, 'cancels_sent')} fragments cancelled; the same {len(pids)} workers idle")


def terminated_pool_worker_fails_the_statement(s, sql, node):
    """Terminates a pool worker while it runs its part of `sql`, whose plan has `node`:
    the leader's statement fails cleanly, and the pool is whole again afterwards."""
    pids = full_pool(s)
    assert node in s.sql("EXPLAIN (COSTS OFF) " + sql)
    x = concurrency.Session(s)
    x.run("\\set ON_ERROR_STOP 0\nSELECT 1")
    x.send(sql)
    deadline = time.monotonic() + 20
    while True:
        busy = s.sql("SELECT pid FROM pg_stride.pool WHERE state = 'busy' LIMIT 1")
        assert busy, s.sql("SELECT * FROM pg_stride.pool")
        if busy:
            break
        assert time.monotonic() < deadline, "no pool worker took the fragment"
        time.sleep(0.05)
    s.sql(f"SELECT pg_terminate_backend({busy})")
    assert x.run("SELECT 'after'", timeout=60) == ["after"]
    err = x.close()[2].decode()
    # The worker's FATAL reaches the leader as a parallel worker's ERROR (57P01).
    assert "due to administrator command" in err and "parallel worker" in err, err
    after = full_pool(s, fresh=False)
    assert int(busy) not in after and len(after) == POOL_SIZE, (busy, after)
    assert len(set(after) & set(pids)) == POOL_SIZE - 1, (pids, after)
    print(f"    {node}: the leader's statement failed: {err.strip().splitlines()[0]!r}; "
          f"pool back to {len(after)} workers")


@check
def a_pool_worker_terminated_while_the_leader_waits_at_a_barrier_fails_the_statement(s):
    """The leader has built its part of a Parallel Hash and waits at the barrier for
    the workers, which sleep at each row; one is terminated: the leader's statement
    fails with its FATAL at once, not at statement_timeout. Twice: the second time the
    workers also raise a notice per row, so that the terminated one has notices its
    full queue could not take when its FATAL comes."""
    for noisy in (False, True):
        pids = full_pool(s)
        x = concurrency.Session(s)
        leader = x.run("SELECT pg_backend_pid()")[0]
        sql = ("SELECT count(*) FROM s1.t JOIN s2.t u USING (a) "
               f"WHERE s1.slow_outside(u.b, {leader}, {noisy})")
        assert "Parallel Hash Join" in s.sql("EXPLAIN (COSTS OFF) " + sql)
        x.run("\\set ON_ERROR_STOP 0\nSET statement_timeout = '30s'; SELECT 1")
        x.send(sql)
        deadline = time.monotonic() + 20
        # HashBuildHashInner, or HashGrowBucketsElect when the table grows meanwhile.
        while s.sql(f"SELECT wait_event LIKE 'Hash%' FROM pg_stat_activity WHERE pid = {leader}") != "t":
            assert time.monotonic() < deadline, s.sql(f"SELECT * FROM pg_stat_activity WHERE pid = {leader}")
            time.sleep(0.05)
        if noisy:
            time.sleep(0.5)  # about 500 notices per worker, its 16 kB queue holds ~100
        busy = s.sql("SELECT pid FROM pg_stride.pool WHERE state = 'busy' LIMIT 1")
        assert busy, s.sql("SELECT * FROM pg_stride.pool")
        start = time.monotonic()
        s.sql(f"SELECT pg_terminate_backend({busy})")
        assert x.run("SELECT 'after'", timeout=60) == ["after"]
        took = time.monotonic() - start
        err = x.close()[2].decode()
        error = next((line for line in err.splitlines() if line.startswith("ERROR:")), err)
        assert "due to administrator command" in error and "parallel worker" in err, err[-2000:]
        assert took < 5, took
        after = full_pool(s, fresh=False)
        assert int(busy) not in after and len(after) == POOL_SIZE, (busy, after)
        assert len(set(after) & set(pids)) == POOL_SIZE - 1, (pids, after)
        print(f"    {'with' if noisy else 'without'} notices: the leader waited at the hash "
              f"build's barrier; it failed {took:.2f} s after the worker was terminated: "
              f"{error!r}")


@check
def a_terminated_pool_worker_fails_the_statement_and_is_replaced(s):
    slow = "FROM s1.slow WHERE pg_sleep(0.001) IS NOT NULL"
    terminated_pool_worker_fails_the_statement(s, f"SELECT count(*) {slow}", STRIDE_GATHER)
    # the leader waits for one worker's next tuple here, not for any
    terminated_pool_worker_fails_the_statement(s, f"SELECT a {slow} ORDER BY a",
                                               STRIDE_GATHER_MERGE)


@check
def a_leader_with_an_xid_runs_with_native_workers(s):
    full_pool(s)
    before = counters(s)
    reason = "transaction has an xid"
    fallbacks = f"SELECT coalesce(sum(gathers), 0) FROM pg_stride.pool_fallbacks WHERE reason = '{reason}'"
    fell_back = int(s.sql(fallbacks))
    out = s.sql("BEGIN; CREATE TEMP TABLE x (v int); SELECT count(*) FROM s1.t; COMMIT").split()
    assert out == [s.sql("SELECT count(*) FROM s1.t")], out
    assert int(s.sql(fallbacks)) == fell_back + 1, s.sql("SELECT * FROM pg_stride.pool_fallbacks")
    assert counted(s, before, "gathers_pooled") == 1, counters(s)  # the second count only
    print(f"    counted under {reason!r}")


def explain_json(s, sql, settings=""):
    """The top plan node of EXPLAIN (ANALYZE, VERBOSE, BUFFERS, FORMAT JSON) `sql`, run
    after `settings` (SQL) in the same session."""
    out = s.sql(f"{settings} EXPLAIN (ANALYZE, VERBOSE, BUFFERS, FORMAT JSON) {sql}")
    # what `settings` printed comes first
    return json.loads(out[out.index("\n[") + 1 if not out.startswith("[") else 0:])[0]["Plan"]


def plan_nodes(node):
    """`node` and every node below it, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def stride_gathers(plan):
    return [n for n in plan_nodes(plan) if n.get("Custom Plan Provider", "").startswith("Stride")]


@check
def explain_shows_stride_gathers_and_per_worker_figures(s):
    """A plan made in pool mode has a Stride Gather where the Gather was; EXPLAIN
    ANALYZE VERBOSE says the pool ran it and gives each pool worker's rows and buffers.
    Without the leader's own part, the workers' rows add up to the table's."""
    full_pool(s)
    sql = "SELECT count(*) FROM s1.t"
    plan = s.sql("EXPLAIN (COSTS OFF) " + sql)
    assert STRIDE_GATHER in plan and " Gather" not in plan.replace("Stride Gather", ""), plan
    native = s.sql("SET pg_stride.parallel_mode = native; EXPLAIN (COSTS OFF) " + sql)
    assert "->  Gather" in native and "Stride" not in native, native
    before = counters(s)
    plan = explain_json(s, sql, "SET parallel_leader_participation = off;")
    [gather] = stride_gathers(plan)
    assert gather["Custom Plan Provider"] == "Stride Gather", gather
    assert gather["Pool"] == "used" and gather["Workers Planned"] == 2, gather
    assert gather["Workers Launched"] == 2 and gather["Single Copy"] is False, gather
    [scan] = [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan"]
    workers = scan.get("Workers", [])
    assert sorted(w["Worker Number"] for w in workers) == [0, 1], scan
    rows = sum(w["Actual Rows"] for w in workers)
    blocks = [w["Shared Hit Blocks"] + w["Shared Read Blocks"] for w in workers]
    assert rows == 200000 and sum(blocks) > 0, workers
    assert counted(s, before, "gathers_pooled") == 1, counters(s)
    print(f"    Stride Gather, Pool: used; worker rows {[w['Actual Rows'] for w in workers]}"
          f" (sum {rows}), worker blocks {blocks}")


@check
def a_limit_met_early_lets_the_pool_workers_stop_as_postgresqls_do(s):
    """A LIMIT met while pool workers still send rows ends the round as PostgreSQL ends
    its own workers': their tuple queues are detached and they stop at their next row,
    uncancelled, and give EXPLAIN ANALYZE their figures; the scan's filter takes a value
    the leader computed (an initPlan's parameter). Catches: the round ended only by the
    DSM-detach callback, after PostgreSQL had freed the parameters sent to the workers
    (which a worker that had not started yet would read freed), cancelling every
    worker still running and losing its figures."""
    pids = full_pool(s)
    no_leader = "SET parallel_leader_participation = off;"
    queries = ["SELECT a FROM s1.t LIMIT 10",
               "SELECT a FROM s1.t WHERE b >= (SELECT floor(random())::int) LIMIT 10"]
    before = counters(s)
    for sql in queries:
        plan = explain_json(s, sql, no_leader)
        [gather] = stride_gathers(plan)
        assert gather["Pool"] == "used" and plan["Actual Rows"] == 10, gather
        [scan] = [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan"]
        assert scan.get("Workers"), scan
        for _ in range(10):
            assert len(s.sql(f"{no_leader} {sql}").split()) == 10
    changed = {name: counted(s, before, name) for name in
               ("gathers_pooled", "cancels_sent", "fragments_error", "tickets_short")}
    assert changed["gathers_pooled"] == 22 and changed["cancels_sent"] == 0 \
        and changed["fragments_error"] == 0, changed
    assert_pool_clean(s, pids)


@check
def a_fragments_statistics_count_at_its_end(s):
    """The rows pool workers scanned count in pg_stat_user_tables once their fragments
    end, as PostgreSQL's workers' do when they exit, while the pool workers live on.
    Catches: a pool worker holding its statistics back until it exits."""
    pids = full_pool(s)
    read = "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 's1.t'::regclass"
    before = int(s.sql(read))
    s.sql("SET parallel_leader_participation = off; SELECT count(*) FROM s1.t")
    s.wait_until(f"SELECT seq_tup_read - {before} FROM pg_stat_user_tables "
                 "WHERE relid = 's1.t'::regclass", "200000", timeout=5)
    assert pool_pids(s) == pids, (pool_pids(s), pids)


@check
def a_workers_notices_keep_the_databases_encoding(s):
    """In a UTF8 database whose client_encoding is set to LATIN1 (ALTER DATABASE … SET),
    a notice with characters LATIN1 lacks, raised in pool workers, reaches a UTF8
    client whole, also after the pool workers went back to their own settings (a
    reload). Catches: a pool worker converting its messages to the client_encoding its
    own settings restore, which the leader reads as the database's: the second round
    failed in the workers ("has no equivalent in encoding LATIN1")."""
    s.sql("CREATE DATABASE regress_utf8 TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'")
    s.sql("ALTER DATABASE regress_utf8 SET client_encoding = 'LATIN1'")

    def run(sql):
        args = s.psql_args(sql)
        args[args.index("-d") + 1] = "regress_utf8"
        return s.run("env", "PGCLIENTENCODING=UTF8", *args[len(concurrency.AS_POSTGRES):],
                     capture_output=True)

    try:
        out = run("CREATE TABLE t AS SELECT g AS a FROM generate_series(1, 100000) g; ANALYZE t; "
                  "CREATE FUNCTION greet(int) RETURNS bool LANGUAGE plpgsql PARALLEL SAFE AS "
                  "$$BEGIN IF $1 % 50000 = 0 THEN RAISE NOTICE 'Grüße € %', $1; END IF; "
                  "RETURN true; END$$")
        assert out.returncode == 0, out.stderr
        sql = "SET parallel_leader_participation = off; SELECT count(*) FROM t WHERE greet(a)"
        for round_ in range(3):
            out = run(sql)
            notices = sorted(line for line in out.stderr.decode("utf-8", "replace").splitlines()
                             if line.startswith("NOTICE"))
            assert out.returncode == 0 and out.stdout.decode().strip() == "100000", (round_, out)
            assert notices == ["NOTICE:  Grüße € 100000", "NOTICE:  Grüße € 50000"], (round_, notices)
            pooled = s.sql("SELECT count(*) FROM pg_stride.pool WHERE datname = 'regress_utf8'")
            assert int(pooled) > 0, pooled
            s.sql("SELECT pg_reload_conf()")
            time.sleep(0.5)
    finally:
        s.sql("SELECT pg_terminate_backend(pid) FROM pg_stride.pool WHERE datname = 'regress_utf8'")
        s.sql("DROP DATABASE regress_utf8 WITH (FORCE)")


def peak_kb(pid):
    """Process `pid`'s peak resident memory (VmHWM), kB."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])


@check
def a_workers_notices_do_not_grow_the_leaders_memory(s):
    """200,000 NOTICEs raised by pool workers (one per row) reach the client while the
    leader's peak memory grows by less than 32 MB. Catches: each notice parsed in the
    statement's memory and kept there to its end (about 1 kB each: hundreds of MB)."""
    full_pool(s)
    s.sql("CREATE FUNCTION s1.loud(int) RETURNS bool LANGUAGE plpgsql PARALLEL SAFE AS "
          "$$BEGIN RAISE NOTICE 'row %', $1; RETURN true; END$$")
    x = wire.Session(s.dir, s.port, timeout=120)
    try:
        x.query("SET parallel_leader_participation = off; SET client_min_messages = notice")
        pid = int(x.query("SELECT pg_backend_pid()")[0][0])
        before = peak_kb(pid)
        rows = x.query("SELECT count(*) FROM s1.t WHERE s1.loud(a)")
        grew = peak_kb(pid) - before
    finally:
        x.close()
        s.sql("DROP FUNCTION s1.loud(int)")
    assert rows == [["200000"]], rows
    print(f"    the leader's peak memory grew by {grew} kB over 200,000 notices")
    assert grew < 32 * 1024, f"{grew} kB"


@check
def a_transaction_of_pooled_statements_keeps_its_memory_flat(s):
    """One transaction runs a pooled parallel statement 50 and then 350 times: the
    transaction's memory grows by less than 200 kB between the two. Catches: the pool's
    state of each Gather run allocated anew each time and kept to the transaction's end
    (about 1 kB each)."""
    full_pool(s)
    before = counters(s)
    size = ("SELECT total_bytes FROM pg_backend_memory_contexts "
            "WHERE name = 'TopTransactionContext'")
    x = wire.Session(s.dir, s.port, timeout=60)
    try:
        x.query("SET parallel_leader_participation = off; BEGIN")
        sizes = []
        for runs in (50, 300):
            for _ in range(runs):
                assert x.query("SELECT count(*) FROM s1.t") == [["200000"]]
            sizes.append(int(x.query(size)[0][0]))
        x.query("COMMIT")
    finally:
        x.close()
    print(f"    TopTransactionContext after 50 and 350 statements: {sizes} bytes")
    assert counted(s, before, "gathers_pooled") >= 300, counters(s)
    assert sizes[1] - sizes[0] < 200 * 1024, sizes


@check
def explain_says_why_a_stride_gather_ran_without_the_pool(s):
    """The fallbacks show in EXPLAIN ANALYZE VERBOSE: a leader with an XID, and a plan
    cached in pool mode run after parallel_mode was set to native."""
    full_pool(s)
    xid = explain_json(s, "SELECT count(*) FROM s1.t", "BEGIN; SELECT txid_current();")
    [gather] = stride_gathers(xid)
    assert gather["Pool"] == "not used: transaction has an xid", gather
    assert gather["Workers Launched"] == 2, gather
    cached = explain_json(
        s, "EXECUTE q",
        "SET plan_cache_mode = force_generic_plan; PREPARE q AS SELECT count(*) FROM s1.t; "
        "EXECUTE q; SET pg_stride.parallel_mode = native;")
    [gather] = stride_gathers(cached)
    assert gather["Pool"] == "not used: parallel_mode is not pool", gather
    assert gather["Workers Launched"] == 2 and cached["Actual Rows"] == 1, gather
    print("    xid: native; a plan cached in pool mode, run after SET parallel_mode = native: "
          "native")


@check
def the_group_cap_limits_a_stride_gathers_pool_workers(s):
    """The concurrency hint and the group's max_parallel_workers cap a Stride Gather's
    workers as they cap a Gather's: planned 2, granted 1, one pool worker runs."""
    full_pool(s)
    s.sql("SELECT pg_stride.create_group('regress_pool_capped', max_parallel_workers => 1)")
    role = SESSIONS[0][0]
    plan = explain_json(s, "SELECT count(*) FROM s1.t",
                        f"SET pg_stride.resource_group = 'regress_pool_capped'; SET ROLE {role};")
    [gather] = stride_gathers(plan)
    assert gather["Workers Planned"] == 1 and gather["Workers Launched"] == 1, gather
    assert gather["Pool"] == "used" and plan["Actual Rows"] == 1, gather
    [scan] = [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan"]
    assert [w["Worker Number"] for w in scan.get("Workers", [])] == [0], scan
    print("    group cap 1: Workers Planned 1, Launched 1, one pool worker's figures")


@check
def a_rescanned_stride_gather_asks_the_pool_again_after_no_idle_worker(s):
    """A Gather rescanned under a nested loop, whose first rounds find every pool
    worker busy with two other statements: once those are cancelled, the rounds after
    run in the pool, instead of with PostgreSQL's workers for good."""
    full_pool(s)
    busy_sql = "SELECT count(*) FROM s1.t a, generate_series(1, 400)"
    busy = [subprocess.Popen(s.psql_args(busy_sql), env=concurrency.ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(2)]
    try:
        s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE datname = 'postgres' "
                     "AND state = 'busy'", str(POOL_SIZE))
        # restricted() keeps the outer side out of the parallel part: the Gather is the
        # inner side, rescanned once per outer row
        x = concurrency.Session(s)
        x.run("SET enable_material = off; SET enable_hashjoin = off; "
              "SET enable_mergejoin = off; SELECT 1")
        x.send("EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON) SELECT count(*) FROM "
               "(SELECT s1.restricted(g) AS g FROM generate_series(1, 60) g) a "
               "JOIN s1.t ON t.a % 1000 = a.g")
        x.send("SELECT 'end'")
        time.sleep(0.3)
        s.sql(f"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = '{busy_sql}'")
        lines = lines_until(x, "end", timeout=120)
    finally:
        for proc in busy:
            proc.wait(60)
    x.close()
    plan = json.loads("\n".join(lines))[0]["Plan"]
    [gather] = stride_gathers(plan)
    assert gather["Actual Loops"] == 60 and plan["Plans"][0]["Actual Rows"] == 12000, gather
    m = re.fullmatch(r"used for (\d+) of 60 rounds \(others: no idle pool worker\)",
                     gather["Pool"])
    assert m and int(m.group(1)) >= 10, gather["Pool"]
    print(f"    Pool: {gather['Pool']}")


@check
def a_pool_worker_counts_each_fragments_cpu_apart(s):
    """The trace counts a pool worker's CPU per fragment, not over the process's life:
    after many fragments, a statement's CPU in all stays near its CPU in slots."""
    full_pool(s)
    since = s.sql("SELECT now()")
    s.sql("SET pg_stride.trace = on; " + "; ".join(["SELECT count(*) FROM s1.t"] * 20))
    rows = [tuple(float(v) for v in line.split("|")) for line in s.sql(
        "SELECT processes, cpu_ms, cpu_total_ms FROM pg_stride.trace "
        f"WHERE arrival > '{since}' ORDER BY arrival").splitlines()]
    pooled = [r for r in rows if r[0] >= 2]
    assert len(pooled) >= 10, rows
    worst = max(r[2] / max(r[1], 0.001) for r in pooled[-10:])
    print(f"    {len(pooled)} statements with pool workers; CPU in all at most {worst:.2f}× "
          f"the CPU in slots over the last 10 (e.g. {pooled[-1][2]:.1f} of {pooled[-1][1]:.1f} ms)")
    assert all(r[2] <= 2 * r[1] + 20 for r in pooled[-10:]), pooled


@check
def drop_database_is_not_blocked_by_its_pool(s):
    s.sql("CREATE DATABASE regress_pool_drop")
    args = s.psql_args("CREATE TABLE u AS SELECT g FROM generate_series(1, 100000) g; "
                       "ANALYZE u; SELECT count(*) FROM u; SELECT count(*) FROM u")
    args[args.index("-d") + 1] = "regress_pool_drop"
    out = s.run(*args[len(concurrency.AS_POSTGRES):], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 20
    while not pool_pids(s, "regress_pool_drop"):
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        time.sleep(0.1)
    started = time.monotonic()
    s.sql("DROP DATABASE regress_pool_drop")
    took = time.monotonic() - started
    assert took < 10, took
    assert not pool_pids(s, "regress_pool_drop")
    print(f"    dropped in {took:.2f} s")


@check
def pool_workers_are_pg_stat_activity_backends(s):
    pids = full_pool(s)
    listed = s.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_stride pool' "
                   "AND datname = 'postgres' ORDER BY pid").split()
    assert [int(p) for p in listed] == pids, (listed, pids)


@check
def idle_pool_workers_exit_after_the_idle_timeout(s):
    full_pool(s)
    before = counters(s)
    concurrency.set_server(s, "pg_stride.pool_idle_timeout", "'1s'")
    try:
        deadline = time.monotonic() + 15
        while pool_pids(s):
            assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
            time.sleep(0.2)
    finally:
        concurrency.set_server(s, "pg_stride.pool_idle_timeout", None)
    assert counted(s, before, "workers_idle_exited") == POOL_SIZE, counters(s)


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql("CREATE SCHEMA s1; CREATE SCHEMA s2")
    s.sql("CREATE TABLE s1.t AS SELECT g AS a, g % 7 AS b FROM generate_series(1, 200000) g")
    s.sql("CREATE TABLE s2.t AS SELECT g AS a, g % 5 AS b FROM generate_series(1, 150000) g")
    s.sql("CREATE TABLE s1.slow AS SELECT g AS a FROM generate_series(1, 20000) g")
    s.sql("ANALYZE s1.t; ANALYZE s2.t; ANALYZE s1.slow")
    # plpgsql, so that the planner cannot inline it into the parallel scan
    s.sql("CREATE FUNCTION s1.restricted(int) RETURNS int LANGUAGE plpgsql PARALLEL "
          "RESTRICTED AS 'BEGIN RETURN $1 + 1; END'")
    s.sql("CREATE FUNCTION s1.fails_outside(int, int) RETURNS bool LANGUAGE plpgsql "
          "PARALLEL SAFE AS $$BEGIN IF pg_backend_pid() <> $2 THEN "
          "RAISE EXCEPTION 'worker part failed'; END IF; RETURN true; END$$")
    s.sql("CREATE FUNCTION s1.noisy(int) RETURNS bool LANGUAGE plpgsql PARALLEL SAFE AS "
          "$$BEGIN IF $1 % 300 = 0 THEN RAISE NOTICE 'every 300th row'; END IF; "
          "RETURN true; END$$")
    s.sql("CREATE FUNCTION s1.slow_outside(int, int, bool) RETURNS bool LANGUAGE plpgsql "
          "PARALLEL SAFE AS $$BEGIN IF pg_backend_pid() <> $2 THEN "
          "IF $3 THEN RAISE NOTICE 'row %', $1; END IF; "
          "PERFORM pg_sleep(0.001); END IF; RETURN true; END$$")
    s.sql("CREATE FUNCTION s1.own_work_mem() RETURNS text LANGUAGE sql STABLE PARALLEL SAFE "
          "SET work_mem = '9MB' AS $$SELECT current_setting('work_mem')$$")
    for role, _, _ in SESSIONS:
        s.sql(f"CREATE ROLE {role}; GRANT USAGE ON SCHEMA s1, s2 TO {role}; "
              f"GRANT SELECT ON ALL TABLES IN SCHEMA s1, s2 TO {role}")


def main():
    server = concurrency.Server(port=concurrency.PORT + 12, extra_conf=CONF)
    return concurrency.run_suite("pool", server, CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
