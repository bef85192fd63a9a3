#!/usr/bin/env python3
"""The pool's limits and its reach (docs/internals/pool.md), each on a server of its own:

- caps: with PostgreSQL's default max_worker_processes (8) and cpu_slots = 8, a pooled
  query in one database leaves background-worker slots for a Gather in a second
  database and for PostgreSQL's own parallel workers; the pool of pg_stride.database
  is started with the server, before any query; one client looping a small parallel
  query on two CPU slots gets its workers (the hint counts the client's statement, not
  its workers), four such clients get none;
- an unchecked server release (simulated in the debug build through
  PG_STRIDE_TEST_SERVER_VERSION_NUM): Gathers run with PostgreSQL's own workers, the
  fallback is counted under its reason, and the server log has the WARNING once;
- a server started in pool mode preallocates 8MB of dynamic shared memory unless
  min_dynamic_shared_memory is configured, and a configured value wins;
- a ticket a pool worker must decline (its number past the context's workers, through
  PG_STRIDE_TEST_FAULTS in the debug build), with the leader not taking part: the
  leader does that part itself and the result is the serial one, for a Gather and a
  Gather Merge;
- a fragment that fails on its own lock_timeout and whose leader's cancel comes late
  (PG_STRIDE_TEST_FAULTS again): the next fragments of the worker are not cancelled;
- a ticket taken while its leader, its LIMIT met, revokes it (the same faults): the
  fragment stops at its detached tuple queue, uncancelled;
- the owner's DROP DATABASE, which PostgreSQL refuses because a session is connected,
  while that session's pooled statements reserve the idle workers the drop hook looked
  at (a fault holds the hook until they do) and are slow to start their fragments
  (another fault): every statement finishes, none stalls until the drop ends, and the
  pool serves again after it; the same for ALTER DATABASE … RENAME; database commands
  that fail before they wait (no such database, a savepoint) leave the pool serving;
- the owner's DROP DATABASE beside pool workers still starting does not wait for them.

Prints one line per check, then "pool_limits: N passed, N failed".
"""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import AS_POSTGRES, ENV, PGBIN  # noqa: E402

APP = "regress_pool_app"
FORCE = ("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
         "SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2; ")


class EnvServer(concurrency.Server):
    """A temporary server whose postmaster gets `env` besides the usual environment."""

    def __init__(self, port, extra_conf, env=None):
        super().__init__(port=port, extra_conf=extra_conf)
        self.env = dict(ENV, **(env or {}))

    def log(self):
        with open(self.logfile) as f:
            return f.read()


def counters(s):
    return {k: int(v) for k, v in (line.split("|") for line in s.sql(
        "SELECT name, value FROM pg_stride.pool_counters()").splitlines())}


def in_database(s, database, sql, user=APP):
    args = s.psql_args(sql, user=user)
    args[args.index("-d") + 1] = database
    out = s.run(*args[len(AS_POSTGRES):], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def launched(s, database, sql, settings="", user=APP):
    """Workers Launched of the single Gather of `sql` run in `database`."""
    plan = in_database(s, database, FORCE + settings +
                       "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, user)
    counts = [int(n) for n in re.findall(r"Workers Launched: (\d+)", plan)]
    assert len(counts) == 1, plan
    return counts[0]


def make_database(s, name):
    s.sql(f"CREATE DATABASE {name}")
    in_database(s, name, "CREATE EXTENSION IF NOT EXISTS pg_stride; "
                "CREATE TABLE t AS SELECT g AS a FROM generate_series(1, 100000) g; "
                f"ANALYZE t; GRANT SELECT ON t TO {APP}", user="postgres")


def gathers_until(s, done, timeout=30):
    """Runs a Gather in regress_db1 every 0.2 s until `done()`; fails after `timeout` s
    with the pool's rows."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        launched(s, "regress_db1", "SELECT count(*) FROM t")
        time.sleep(0.2)


def pool_workers(s, database=None):
    where = f" WHERE datname = '{database}'" if database else ""
    return int(s.sql(f"SELECT count(*) FROM pg_stride.pool{where}"))


def caps_and_reach():
    s = EnvServer(concurrency.PORT + 13, """
pg_stride.parallel_mode = pool
pg_stride.cpu_slots = 8
max_worker_processes = 8
max_parallel_workers = 8
""")
    checks = []
    s.start()
    try:
        s.sql(f"CREATE ROLE {APP} LOGIN")
        s.sql("CREATE EXTENSION pg_stride")
        # Started with the server: before any query, pg_stride.database has idle workers.
        deadline = time.monotonic() + 10
        while pool_workers(s, "postgres") == 0:
            assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
            time.sleep(0.1)
        started = pool_workers(s, "postgres")
        checks.append(("the_pool_of_pg_stride_database_starts_with_the_server", None,
                       f"{started} workers before any query"))
        # Each Gather's parallel context carved from memory every process has mapped.
        def preallocated():
            dsm = s.sql(DSM_SETTING)
            print(f"    min_dynamic_shared_memory: {dsm}")
            assert dsm == "8MB default", dsm
        checks.append(("a_server_started_in_pool_mode_preallocates_dynamic_shared_memory",
                       preallocated, None))
        # The pool of `postgres` took the 2 the cap allows (8 worker processes, 3 of
        # them pg_stride's own, 3 kept for native workers).
        in_database(s, "postgres", "CREATE TABLE t AS SELECT g AS a FROM generate_series(1, 100000) g; "
                    f"ANALYZE t; GRANT SELECT ON t TO {APP}", user="postgres")
        make_database(s, "regress_db2")

        def slots_stay_for_others():
            before = counters(s)
            first = launched(s, "postgres", "SELECT count(*) FROM t")
            first_again = launched(s, "postgres", "SELECT count(*) FROM t")
            pooled = counters(s)["gathers_pooled"] - before["gathers_pooled"]
            total = pool_workers(s)
            second_db = launched(s, "regress_db2", "SELECT count(*) FROM t")
            native = launched(s, "postgres", "SELECT count(*) FROM t",
                              settings="SET pg_stride.parallel_mode = native; ", user="postgres")
            # At the cap, the second database took an idle worker of the first's: its
            # later Gathers run in a pool of its own, the first keeps one.
            deadline = time.monotonic() + 10
            while True:
                mid = counters(s)["gathers_pooled"]
                second_again = launched(s, "regress_db2", "SELECT count(*) FROM t")
                if counters(s)["gathers_pooled"] > mid:
                    break
                assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
                time.sleep(0.2)
            shares = s.sql("SELECT datname, count(*) FROM pg_stride.pool GROUP BY 1 ORDER BY 1")
            print(f"    postgres: {first}, then {first_again} workers ({pooled} pooled); pool workers in all "
                  f"{total}; db2: {second_db}, later {second_again} pooled; native Gather: {native}; "
                  f"pools: {shares.splitlines()}")
            assert shares.splitlines() == ["postgres|1", "regress_db2|1"], shares
            assert pooled == 2 and first_again == 2, (first, first_again, pooled)
            # 8 worker processes, 3 of them pg_stride's: the pool takes at most 2.
            assert total <= 2, s.sql("SELECT * FROM pg_stride.pool")
            assert second_db == 2 and native == 2, (second_db, native)
        checks.append(("pooled_queries_leave_worker_slots_to_other_databases_and_native_workers",
                       slots_stay_for_others, None))

        # One small parallel query, looped by one client and by four.
        small = s.script("small.sql", FORCE.replace("; ", ";\n") + "SELECT count(*) FROM t;\n")

        def one_client_gets_its_workers():
            concurrency.set_server(s, "pg_stride.cpu_slots", 2)
            in_database(s, "postgres", FORCE + "SELECT count(*) FROM t")
            before = counters(s)
            out = s.run(f"{PGBIN}/pgbench", "-n", "-h", s.dir, "-p", str(s.port), "-U", APP,
                        "-c", "1", "-t", "300", "-f", small, "postgres",
                        capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            after = counters(s)
            pooled = after["gathers_pooled"] - before["gathers_pooled"]
            print(f"    {pooled} of 300 statements ran their Gather in the pool")
            # The issue this answers saw 50 of 300: the grant counted the client as busy.
            assert pooled >= 240, (before, after)
        checks.append(("one_client_looping_a_small_parallel_query_gets_its_workers",
                       one_client_gets_its_workers, None))

        def four_clients_get_none():
            # Four clients on the two slots: the hint's samples see more statements than
            # slots, so no Gather gets a worker, not even at a moment between two
            # statements when a slot is idle (the grant counted those once: about 4 % of
            # the Gathers ran in the pool, and cost the other clients more than that).
            concurrency.set_server(s, "pg_stride.cpu_slots", 2)
            fallbacks = "SELECT coalesce(sum(gathers), 0) FROM pg_stride.pool_fallbacks"
            bench = subprocess.Popen(
                AS_POSTGRES + [f"{PGBIN}/pgbench", "-n", "-h", s.dir, "-p", str(s.port), "-U",
                               APP, "-c", "4", "-j", "4", "-T", "8", "-f", small, "postgres"],
                env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                s.wait_until("SELECT hint < 1 FROM pg_stride.scheduler", "t", timeout=5)
                before = counters(s)
                native = int(s.sql(fallbacks))
                commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'"
                xacts = int(s.sql(commits))
                time.sleep(4)
                pooled = counters(s)["gathers_pooled"] - before["gathers_pooled"]
                native = int(s.sql(fallbacks)) - native
                xacts = int(s.sql(commits)) - xacts
            finally:
                out, err = bench.communicate(timeout=60)
            assert bench.returncode == 0, err
            print(f"    4 clients: {pooled} Gathers pooled and {native} given native workers "
                  f"in 4 s, {xacts} transactions")
            assert xacts > 100, out
            # At most one in a thousand (the rule gave 0 and 3 of about 8,000; with the
            # old one, about 40 in a thousand in a release build, 9 of 6,925 in a debug one).
            assert pooled + native <= max(2, xacts // 1000), (pooled, native, xacts)
        checks.append(("four_clients_on_two_slots_run_their_gathers_without_workers",
                       four_clients_get_none, None))

        def lowered_size_frees_slots():
            # Idle workers would otherwise keep their worker slots until the idle
            # timeout (5 minutes by default), busy ones for good.
            assert pool_workers(s) > 0, s.sql("SELECT * FROM pg_stride.pool")
            concurrency.set_server(s, "pg_stride.pool_size", 0)
            try:
                s.wait_until("SELECT count(*) FROM pg_stride.pool", "0", timeout=5)
                before = counters(s)
                # The Gather falls back to PostgreSQL's own workers.
                native = launched(s, "postgres", "SELECT count(*) FROM t")
                assert counters(s)["gathers_pooled"] == before["gathers_pooled"], (before, counters(s))
                assert native >= 1, native
            finally:
                concurrency.set_server(s, "pg_stride.pool_size", None)
            # Back at its size, the pool serves again once a Gather has started it.
            deadline = time.monotonic() + 10
            while True:
                mid = counters(s)["gathers_pooled"]
                launched(s, "postgres", "SELECT count(*) FROM t")
                if counters(s)["gathers_pooled"] > mid:
                    break
                assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
                time.sleep(0.2)
        checks.append(("a_lowered_pool_size_retires_the_workers_above_it_at_once",
                       lowered_size_frees_slots, None))
        return run(s, checks)
    finally:
        s.stop()


def one_check_on_its_server(port, conf, env, name, check):
    """Starts a server with `conf` and `env`, a login role and a database with a table,
    and runs `check(s)` on it as the check `name`."""
    return checks_on_their_server(port, conf, env, [(name, check)])


def checks_on_their_server(port, conf, env, checks):
    """[`one_check_on_its_server`] for several (name, check) pairs, in order. Prediction
    off: the checks' small statements would be predicted short, and get no workers while
    another statement runs (regress/prediction.py checks that rule)."""
    s = EnvServer(port, "pg_stride.parallel_mode = pool\npg_stride.cpu_slots = 8\n"
                  "pg_stride.predict = off\nmax_worker_processes = 16\n" + conf, env=env)
    s.start()
    try:
        s.sql(f"CREATE ROLE {APP} LOGIN")
        s.sql("CREATE EXTENSION pg_stride")
        make_database(s, "regress_db1")
        return run(s, [(name, lambda check=check: check(s), None) for name, check in checks])
    finally:
        s.stop()


def falls_back_with_one_warning(s):
    counts = [launched(s, "regress_db1", "SELECT count(*) FROM t") for _ in range(5)]
    fallbacks = s.sql("SELECT reason, gathers FROM pg_stride.pool_fallbacks")
    log = s.log()
    warnings = log.count("WARNING:  pg_stride.parallel_mode = pool is not available on PostgreSQL 15.9")
    print(f"    workers launched {counts}; fallbacks: {fallbacks!r}; {warnings} WARNING in the log")
    assert counts == [2] * 5, counts
    assert re.search(r"server release not checked for the pool\|5$", fallbacks, re.M), fallbacks
    assert warnings == 1, log[-3000:]
    assert "releases 15.10–15.20 of this major" in log, log[-3000:]
    assert counters(s)["gathers_pooled"] == 0


def unchecked_release():
    return one_check_on_its_server(
        concurrency.PORT + 15, "", {"PG_STRIDE_TEST_SERVER_VERSION_NUM": "150009"},
        "an_unchecked_release_uses_native_workers_and_says_so_once", falls_back_with_one_warning)


def the_leader_does_a_declined_part(s):
    """A Gather and a Gather Merge (whose leader must join before its first tuple),
    neither with the leader taking part, whose first ticket the worker declines."""
    off = "SET parallel_leader_participation = off; "
    for sql, node in (("SELECT count(*), sum(a) FROM t", "Gather"),
                      ("SELECT a FROM t WHERE a % 5000 = 0 ORDER BY a", "Gather Merge")):
        serial = in_database(s, "regress_db1", "SET max_parallel_workers_per_gather = 0; " + sql)
        plan = in_database(s, "regress_db1", FORCE + off + "EXPLAIN (COSTS OFF) " + sql)
        assert re.search(rf"Custom Scan \(Stride {node}\)$", plan, re.M), plan
        in_database(s, "regress_db1", FORCE + sql)
        time.sleep(1)
        before = counters(s)
        results = [in_database(s, "regress_db1", FORCE + off + sql) for _ in range(10)]
        after = counters(s)
        declined = after["fragments_declined_by_worker"] - before["fragments_declined_by_worker"]
        entered = after["fragments_entered"] - before["fragments_entered"]
        print(f"    {node}: {sum(r == serial for r in results)} of 10 results as serial; "
              f"{declined} tickets declined, {entered} fragments ran")
        assert results == [serial] * 10, (serial, results)
        assert declined >= 5 and entered >= 5, (before, after)


def declined_ticket():
    return one_check_on_its_server(
        concurrency.PORT + 16, "pg_stride.pool_size = 4\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_ticket_out_of_range"},
        "a_ticket_a_worker_declines_is_done_by_the_leader", the_leader_does_a_declined_part)


def batches_until_ended(s, settings, start, batch, timeout=120):
    """Connects a session of the app to regress_db1 with `settings`, starts a process
    with `start()`, and runs `SELECT count(*) FROM t` there, `batch` statements at a
    time, until that process has ended, and one batch more:
    each must give t's rows. Returns the process and how many statements ran."""
    loop = concurrency.Session(s, APP, db="regress_db1")
    loop.run(settings, lines=0)
    # Connected before the process starts (a DROP DATABASE must find it there).
    assert loop.run("SELECT 'connected'") == ["connected"]
    proc = start()
    statements, last = 0, False
    deadline = time.monotonic() + timeout
    try:
        while not last:
            assert time.monotonic() < deadline, f"{proc.args[-1]!r} never returned"
            last = proc.poll() is not None
            rows = loop.run("SELECT count(*) FROM t; " * (batch - 1) + "SELECT count(*) FROM t",
                            lines=batch, timeout=timeout)
            assert rows == ["100000"] * batch, rows
            statements += batch
    finally:
        loop.close()
    return proc, statements


def a_late_cancel_spares_the_next_fragment(s):
    """A fragment fails on its own lock_timeout (its process signals itself), and its
    leader, aborting, cancels it before the worker is done with it, with a SIGINT that
    comes a second late (a test fault: the worker and then the leader are slow, as
    processes taken off their CPU are). The worker must wait for that SIGINT before it
    serves again: the next statements of the same role, looping through the one pool
    worker, all finish."""
    in_database(s, "regress_db1", "CREATE TABLE locked (x int); "
                f"GRANT SELECT ON locked TO {APP}; "
                "CREATE FUNCTION peek(int) RETURNS bigint LANGUAGE plpgsql STABLE PARALLEL SAFE "
                "AS 'BEGIN RETURN (SELECT count(*) FROM locked); END'", user="postgres")
    # Two workers planned (the leader takes no part: with one, a parallel plan would
    # cost no less than a serial one), one pool worker to run them.
    one = FORCE + "SET parallel_leader_participation = off; "
    holder = concurrency.Session(s, "postgres", db="regress_db1")
    holder.run("BEGIN; LOCK TABLE locked IN ACCESS EXCLUSIVE MODE", lines=0)
    try:
        for attempt in range(5):
            assert launched(s, "regress_db1", "SELECT count(*) FROM t") == 1
            sent = counters(s)["cancels_sent"]
            args = s.psql_args(one + "SET lock_timeout = '1s'; "
                               "SELECT count(*) FROM t WHERE a <= 10 AND peek(a) >= 0", user=APP)
            args[args.index("-d") + 1] = "regress_db1"
            failing = subprocess.Popen(args, env=ENV, text=True, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
            # Its fragment waits for the lock in the pool worker.
            s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE datname = 'regress_db1' "
                         "AND state = 'busy'", "1")
            # Statements through the pool worker, in batches, until the failed
            # statement's session has returned (its leader sent its cancel before it
            # did), then one batch more.
            _, statements = batches_until_ended(s, one, lambda: failing, 50)
            batches = statements // 50
            rc, out, err = concurrency.finish(failing)
            assert rc != 0 and "lock timeout" in err, (rc, out, err)
            # A batch ran while the failed statement's leader was still in its abort.
            if counters(s)["cancels_sent"] > sent and batches >= 2:
                print(f"    the failed fragment's cancel was sent late at attempt {attempt + 1}; "
                      f"{batches * 50} statements beside and after it finished")
                return
        raise AssertionError("the leader never cancelled its failed fragment (the worker "
                             "ended it first in 5 attempts)")
    finally:
        holder.close()


def late_cancel():
    return one_check_on_its_server(
        concurrency.PORT + 19, "pg_stride.pool_size = 1\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_cancel_race"},
        "a_late_cancel_of_a_failed_fragment_spares_the_next_one", a_late_cancel_spares_the_next_fragment)


def a_ticket_taken_as_its_limit_was_met_runs_to_its_detached_queue(s):
    """A LIMIT met by the first pool worker's rows while the second has not taken its
    ticket: the leader revokes that ticket, and a worker that takes it meanwhile (the
    fault holds the second worker back 200 ms and the leader until it took the ticket)
    stops at the detached tuple queue, as PostgreSQL's workers do, uncancelled. Catches:
    the revoke, finding the ticket taken, cancelling the fragment (an ERROR in the
    worker, a SIGINT) where a LIMIT met by every worker's rows lets it end well."""
    deadline = time.monotonic() + 30
    idle = ("SELECT count(*) FROM pg_stride.pool WHERE datname = 'regress_db1' "
            "AND state = 'idle'")
    while int(s.sql(idle)) < 2:
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        launched(s, "regress_db1", "SELECT count(*) FROM t")
        time.sleep(0.2)
    before = counters(s)
    for _ in range(5):
        assert launched(s, "regress_db1", "SELECT a FROM t LIMIT 10",
                        "SET parallel_leader_participation = off; ") == 2
    changed = {k: counters(s)[k] - before[k]
               for k in ("gathers_pooled", "fragments_ok", "fragments_error", "cancels_sent")}
    print(f"    5 statements: {changed}")
    # Both workers of each round ran their fragment: the second took its ticket late.
    assert changed == {"gathers_pooled": 5, "fragments_ok": 10, "fragments_error": 0,
                       "cancels_sent": 0}, changed


def ticket_taken_late():
    return one_check_on_its_server(
        concurrency.PORT + 5, "pg_stride.pool_size = 4\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_revoke_race"},
        "a_ticket_taken_as_its_limit_was_met_runs_to_its_detached_queue",
        a_ticket_taken_as_its_limit_was_met_runs_to_its_detached_queue)


def a_refused_drop_spares_the_workers_leaders_reserved_after_its_look(s):
    """The owner's DROP DATABASE of regress_db1 while a session there runs pooled
    statements: PostgreSQL refuses it after 5 s (55006, the session is connected), once
    its drop hook has released the idle pool workers. Two faults: the hook, after it saw
    a worker idle, waits until a leader has taken it (the session's first statement is
    sent then), and a worker that took a ticket shows itself as an autovacuum worker for
    half a second more, while PostgreSQL's wait for the database to empty signals the
    autovacuum workers it sees. Catches: the hook terminating a worker it had seen idle,
    under the fragment of the leader that reserved it since, and a worker starting a
    fragment once the drop waits (in both, that statement failed); statements that
    stall until the drop ends (PostgreSQL's own workers cannot connect before); a pool
    that stays unused after the refused drop."""
    gathers_until(s, lambda: pool_workers(s, "regress_db1") >= 2)
    s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE datname = 'regress_db1' "
                 "AND state <> 'idle'", "0")
    before = counters(s)
    session = concurrency.Session(s, APP, db="regress_db1")
    session.run(FORCE + "SET parallel_leader_participation = off", lines=0)
    assert session.run("SELECT 'connected'") == ["connected"]
    args = s.psql_args("DROP DATABASE regress_db1", user="postgres")
    dropper = subprocess.Popen(args, env=ENV, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    waits = []
    try:
        deadline = time.monotonic() + 10
        while "pool_release_race: waiting" not in s.log():
            assert time.monotonic() < deadline and dropper.poll() is None, \
                concurrency.finish(dropper)
            time.sleep(0.02)
        # Until the drop is refused, then once more.
        last = False
        while not last:
            last = dropper.poll() is not None
            began = time.monotonic()
            assert session.run("SELECT count(*) FROM t", timeout=20) == ["100000"]
            waits.append(time.monotonic() - began)
            time.sleep(0.1)
    finally:
        session.close()
    rc, out, err = concurrency.finish(dropper)
    after = counters(s)
    change = {k: after[k] - before[k] for k in ("gathers_pooled", "fragments_declined_by_worker",
                                               "gathers_alone_for_database_command")}
    print(f"    {len(waits)} statements beside the drop, the longest took {max(waits):.2f} s; "
          f"{change}; the drop: {err.strip()[:90]!r}")
    assert rc != 0 and "is being accessed by other users" in err, (rc, out, err)
    # The fault saw a worker the hook looked at idle taken by a fragment.
    assert "the idle pool worker looked at is running a leader's fragment" in s.log(), \
        [line for line in s.log().splitlines() if "pool_release_race" in line]
    # Slow to take it up, the workers gave their tickets back once the drop waited; the
    # later statements' leaders ran their Gathers alone, without waiting for the drop.
    assert change["fragments_declined_by_worker"] > 0, change
    assert change["gathers_alone_for_database_command"] > 0, change
    assert max(waits) < 2.5, waits
    # The refused drop's mark went with its transaction: the pool serves again.
    pooled_fragments_run(s)


def refused_drop():
    return one_check_on_its_server(
        concurrency.PORT + 6, "pg_stride.pool_size = 2\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_release_race,pool_take_slowly"},
        "a_refused_drop_spares_the_workers_leaders_reserved_after_its_look",
        a_refused_drop_spares_the_workers_leaders_reserved_after_its_look)


def a_refused_rename_spares_the_pool_workers_fragments(s):
    """The owner's ALTER DATABASE regress_db1 RENAME while a session there runs pooled
    statements back to back: PostgreSQL refuses it after 5 s (55006, the session is
    connected). A fault keeps a worker that took a ticket shown as an autovacuum worker
    for half a second, while PostgreSQL's wait for the database to empty signals the
    autovacuum workers it sees. Catches: a worker terminated under a fragment (that
    statement failed), and a pool left unused after the refused command."""
    gathers_until(s, lambda: pool_workers(s, "regress_db1") >= 2)
    before = counters(s)
    args = s.psql_args("ALTER DATABASE regress_db1 RENAME TO regress_db1_renamed",
                       user="postgres")
    renamer, statements = batches_until_ended(
        s, FORCE + "SET parallel_leader_participation = off",
        lambda: subprocess.Popen(args, env=ENV, text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE), 1)
    rc, out, err = concurrency.finish(renamer)
    after = counters(s)
    alone = after["gathers_alone_for_database_command"] - \
        before["gathers_alone_for_database_command"]
    print(f"    {statements} statements beside the rename, {alone} Gathers alone; "
          f"the rename: {err.strip()[:90]!r}")
    assert rc != 0 and "is being accessed by other users" in err, (rc, out, err)
    assert alone > 0, (before, after)
    pooled_fragments_run(s)


def pooled_fragments_run(s):
    """Runs Gathers in regress_db1 until a pool worker has run one of their fragments
    (the pool may be starting); fails after 30 s."""
    before = counters(s)["fragments_ok"]
    gathers_until(s, lambda: counters(s)["fragments_ok"] != before)


def database_commands_that_fail_early_leave_the_pool_serving(s):
    """Database commands that end before PostgreSQL's wait for the database to empty:
    the role's own on a database that does not exist (its error stays PostgreSQL's),
    and the owner's inside a savepoint of a transaction that goes on. Catches: an error
    about OID 0, and the database's pool left unused for the rest of the transaction."""
    for sql in ("ALTER DATABASE regress_nosuch RENAME TO regress_x",
                "ALTER DATABASE regress_nosuch SET TABLESPACE pg_default",
                "CREATE DATABASE regress_x TEMPLATE regress_nosuch"):
        out = subprocess.run(s.psql_args(sql, user=APP), env=ENV, text=True,
                             capture_output=True)
        assert out.returncode != 0, out
        assert ('database "regress_nosuch" does not exist' in out.stderr
                or "permission denied to create database" in out.stderr), (sql, out.stderr)
    owner = concurrency.Session(s, "postgres")
    try:
        owner.run("\\set ON_ERROR_STOP 0", lines=0, end="")
        owner.run("BEGIN; SAVEPOINT a", lines=0)
        # The rename fails after its mark (the new name is taken); the other two fail
        # at once, in a transaction block, unmarked.
        for sql in ("ALTER DATABASE regress_db1 RENAME TO regress_db1",
                    "ALTER DATABASE regress_db1 SET TABLESPACE pg_default",
                    "CREATE DATABASE regress_x TEMPLATE regress_db1"):
            owner.send(sql)
            owner.send("ROLLBACK TO a")
            assert owner.run("SELECT 'still open'") == ["still open"]
        before = counters(s)["gathers_alone_for_database_command"]
        pooled_fragments_run(s)
        assert counters(s)["gathers_alone_for_database_command"] == before, counters(s)
    finally:
        owner.close()


def refused_rename():
    return checks_on_their_server(
        concurrency.PORT + 20, "pg_stride.pool_size = 2\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_take_slowly"},
        [("a_refused_rename_spares_the_pool_workers_fragments",
          a_refused_rename_spares_the_pool_workers_fragments),
         ("database_commands_that_fail_early_leave_the_pool_serving",
          database_commands_that_fail_early_leave_the_pool_serving)])


def a_drop_does_not_wait_for_pool_workers_still_starting(s):
    """A Gather in regress_db1 starts its pool, whose workers (a fault) take 4 s before
    they begin to connect; its session leaves, and the owner's DROP DATABASE follows
    while they are still starting. Catches: the drop waiting 5 s for workers that could
    not connect before it ended (PostgreSQL's wait does not see them); a worker left
    behind in its slot."""
    in_database(s, "regress_db1", FORCE + "SELECT count(*) FROM t")
    starting = int(s.sql("SELECT count(*) FROM pg_stride.pool "
                         "WHERE state = 'starting' AND datname = 'regress_db1'"))
    began = time.monotonic()
    s.sql("DROP DATABASE regress_db1")
    took = time.monotonic() - began
    print(f"    the drop beside {starting} pool workers still starting took {took:.2f} s")
    assert starting > 0, s.sql("SELECT * FROM pg_stride.pool")
    assert s.sql("SELECT count(*) FROM pg_database WHERE datname = 'regress_db1'") == "0"
    assert took < 4.5, took
    # They fail to connect to the dropped database and free their slots.
    s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE datname IS DISTINCT FROM "
                 "'postgres'", "0", timeout=15)


def drop_beside_starting_workers():
    return one_check_on_its_server(
        concurrency.PORT + 21, "pg_stride.pool_size = 2\n",
        {"PG_STRIDE_TEST_FAULTS": "pool_start_slowly"},
        "a_drop_does_not_wait_for_pool_workers_still_starting",
        a_drop_does_not_wait_for_pool_workers_still_starting)


def lowered_size_keeps_the_lowest_slots(s):
    # Pools in two databases (pg_stride.database's, started with the server, and
    # regress_db1's), at their shares of the server's cap; pool_size 4 -> 1 at a reload.
    gathers_until(s, lambda: pool_workers(s, "regress_db1") >= 3
                  and pool_workers(s, "postgres") >= 3, timeout=15)
    s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE state = 'starting' OR pid = 0", "0")
    pids = "SELECT datname, string_agg(pid::text, ',') FROM pg_stride.pool GROUP BY 1 ORDER BY 1"
    before_pids = dict(line.split("|") for line in s.sql(pids).splitlines())
    before = counters(s)["workers_retired"]
    concurrency.set_server(s, "pg_stride.pool_size", 1)
    s.wait_until("SELECT count(*) FROM pg_stride.pool", "2", timeout=5)
    after_pids = dict(line.split("|") for line in s.sql(pids).splitlines())
    retired = counters(s)["workers_retired"] - before
    print(f"    pools {before_pids} -> {after_pids}, {retired} retired")
    # One worker left in each database, one that was there before (the lowest slot's:
    # every worker above it retired, none was started again).
    assert sorted(after_pids) == ["postgres", "regress_db1"], after_pids
    for database, pid in after_pids.items():
        assert pid in before_pids[database].split(","), (database, before_pids, after_pids)
    assert retired == sum(len(p.split(",")) for p in before_pids.values()) - 2, retired
    # The pool of one still serves its database.
    mid = counters(s)["gathers_pooled"]
    launched(s, "regress_db1", "SELECT count(*) FROM t")
    assert counters(s)["gathers_pooled"] > mid


def lowered_pool_size():
    return one_check_on_its_server(
        concurrency.PORT + 18, "pg_stride.pool_size = 4\n", None,
        "a_lowered_pool_size_keeps_each_databases_lowest_slot", lowered_size_keeps_the_lowest_slots)


DSM_SETTING = ("SELECT setting || unit || ' ' || source FROM pg_settings "
               "WHERE name = 'min_dynamic_shared_memory'")


def keeps_the_configured_dynamic_shared_memory(s):
    setting = s.sql(DSM_SETTING)
    print(f"    min_dynamic_shared_memory: {setting}")
    assert setting == "1MB configuration file", setting


def configured_dynamic_shared_memory():
    return one_check_on_its_server(
        concurrency.PORT + 17, "min_dynamic_shared_memory = '1MB'\n", None,
        "a_configured_min_dynamic_shared_memory_wins_over_pool_modes_default",
        keeps_the_configured_dynamic_shared_memory)


def run(s, checks):
    passed = failed = 0
    for name, fn, note in checks:
        try:
            if fn:
                fn()
            elif note:
                print(f"    {note}")
            passed += 1
            print(f"ok     {name}")
        except Exception as e:  # noqa: BLE001 - report every failing check
            failed += 1
            print(f"FAILED {name}: {e}")
    return passed, failed


def main():
    passed = failed = 0
    for part in (caps_and_reach, unchecked_release, declined_ticket,
                 configured_dynamic_shared_memory, lowered_pool_size, late_cancel,
                 ticket_taken_late, refused_drop, refused_rename,
                 drop_beside_starting_workers):
        try:
            p, f = part()
        except Exception as e:  # noqa: BLE001 - a server that did not start
            p, f = 0, 1
            print(f"FAILED {part.__name__}: {e}")
        passed += p
        failed += f
    print(f"pool_limits: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
