#!/usr/bin/env python3
"""Pool workers give a leader's role exactly its own rights (docs/internals/pool.md,
"Whose rights a fragment has"; rule 11 of the safety rules).

Every check logs in as `regress_alice`, an ordinary LOGIN role with CREATE on a schema
of her own, and compares what the same statement gives in three ways: run by pool
workers (`pg_stride.parallel_mode = pool`), by PostgreSQL's own parallel workers
(`native`), and serially (no workers). The leader does not take part in the parallel
scans (`parallel_leader_participation = off`), so every expression under the Gather is
evaluated in a worker. Results must be identical, errors included (their SQLSTATE and
message); each pooled run must really have entered pool workers and each native run
must have launched PostgreSQL's workers.

- functions whose SET clauses change `session_authorization` (to the superuser, to an
  ordinary role whose table she cannot read) and `role`;
- a table she may not read, read from inside a worker;
- a table with row-level security (`row_security` on);
- a SECURITY DEFINER function of another role;
- `current_user`, `session_user`, `system_user` (16 on), `has_table_privilege`;
- a custom placeholder that another session of hers set (`SET app.tenant`) in the same
  pool workers, read with `current_setting(…, true)`;
- bob's and her fragments never share a pool worker process.

Also: the pool's own baseline does not leak into a fragment (the pool workers connect as
the bootstrap superuser), and a command that fails its permission check leaves the pool
alone (ALTER DATABASE, DROP DATABASE, CREATE DATABASE … TEMPLATE by a non-owner), while
the same commands by the owner are not blocked by the pool, nor by the groups loader;
a DROP DATABASE that PostgreSQL refuses after its drop hook ran (other sessions are
connected) leaves a superuser's running pooled query alone, and the owner's DROP DATABASE
… WITH (FORCE) ends his own.

Starts its own temporary server; prints one line per check, then
"pool_identity: N passed, N failed".
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402

CONF = """
pg_stride.parallel_mode = pool
pg_stride.pool_size = 2
pg_stride.cpu_slots = 8
max_worker_processes = 32
max_parallel_workers = 16
max_parallel_workers_per_gather = 2
"""
ALICE = "regress_alice"
BOB = "regress_bob"
CAROL = "regress_carol"
DAVE = "regress_dave"
# Parallel plans for the small test tables, every row read by a worker.
FORCE = ("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
         "SET min_parallel_table_scan_size = 0; SET parallel_leader_participation = off; "
         "SET max_parallel_workers_per_gather = 2; \\set VERBOSITY verbose\n")
MODES = ["pool", "native", "serial"]

CHECKS = []
check = concurrency.collector(CHECKS)


def counters(s):
    return {k: int(v) for k, v in (line.split("|") for line in s.sql(
        "SELECT name, value FROM pg_stride.pool_counters()").splitlines())}


def run_as(s, user, sql, settings=""):
    """Runs `sql` as `user` (a login of its own) after FORCE and `settings`; returns
    (output lines, the ERROR line with its SQLSTATE or None)."""
    args = s.psql_args("", user=user)
    args = args[:args.index("-c")] + ["-v", "ON_ERROR_STOP=1"]
    script = FORCE + settings + "\n" + sql + ";\n"
    out = s.run(*args[len(concurrency.AS_POSTGRES):], input=script, capture_output=True,
                text=True)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ERROR:")]
    return out.stdout.strip().splitlines(), (errors[0] if errors else None)


def set_mode(s, role, mode):
    if mode == "serial":
        s.sql(f"ALTER ROLE {role} SET pg_stride.parallel_mode = native; "
              f"ALTER ROLE {role} SET max_parallel_workers_per_gather = 0")
    else:
        s.sql(f"ALTER ROLE {role} SET pg_stride.parallel_mode = {mode}; "
              f"ALTER ROLE {role} RESET max_parallel_workers_per_gather")


def in_three_ways(s, sql, user=ALICE, before=None):
    """Runs `sql` as `user` pooled, native and serially; returns {mode: (rows, error)}
    after checking that each way really ran as it says. `before`, if given, is called
    with the mode before each run (to set up state another session leaves behind)."""
    results = {}
    for mode in MODES:
        set_mode(s, user, mode)
        if before:
            before(mode)
        if mode == "pool":
            warm_pool(s, "postgres", user=user)
        c0 = counters(s)
        results[mode] = run_as(s, user, sql, settings="" if mode != "serial" else
                               "SET max_parallel_workers_per_gather = 0;")
        c1 = counters(s)
        entered = c1["fragments_entered"] - c0["fragments_entered"]
        if mode == "pool":
            assert entered >= 1, (sql, c0, c1, results[mode])
        else:
            assert entered == 0, (mode, sql, c0, c1)
    set_mode(s, user, "pool")
    return results


def same_in_three_ways(s, sql, expect_error=None, expect_rows=None, **kw):
    results = in_three_ways(s, sql, **kw)
    assert results["pool"] == results["native"] == results["serial"], results
    rows, error = results["serial"]
    if expect_error is not None:
        assert error is not None and expect_error in error, results
    else:
        assert error is None, results
    if expect_rows is not None:
        assert rows == expect_rows, results
    return results["serial"]


def native_launches_workers(s, sql):
    """EXPLAIN ANALYZE of `sql` with native workers as alice: workers were launched."""
    set_mode(s, ALICE, "native")
    rows, error = run_as(s, ALICE, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql)
    set_mode(s, ALICE, "pool")
    assert error is None, error
    launched = [r for r in rows if "Workers Launched" in r]
    assert launched and all(not r.strip().endswith(": 0") for r in launched), rows


# One column per row of t, computed under the Gather; grouped above it.
def per_row(expr, table="alice.t", where=""):
    return f"SELECT v, count(*) FROM (SELECT {expr} AS v FROM {table} {where}) q GROUP BY v ORDER BY v"


@check
def session_authorization_to_the_superuser_is_refused_as_in_her_own_backend(s):
    """The escalation: a parallel-safe function with SET session_authorization =
    postgres. PostgreSQL checks the authenticated user; in a pool worker that must be
    alice, not the superuser the worker connected as."""
    native_launches_workers(s, per_row("alice.as_postgres(a)", where="WHERE a < 0"))
    sql = per_row("alice.as_postgres(a)")
    same_in_three_ways(s, sql, expect_error="42501")
    print("    refused (42501) pooled, native and serial")


@check
def session_authorization_to_another_ordinary_role_is_refused(s):
    same_in_three_ways(s, per_row("alice.as_bob(a)"), expect_error="42501")


@check
def set_role_clauses_follow_her_memberships(s):
    """SET role to a role she is not a member of fails; to one she is a member of, runs
    as that role."""
    same_in_three_ways(s, per_row("alice.role_bob(a)"), expect_error="42501")
    rows, _ = same_in_three_ways(s, per_row("alice.role_carol(a)"))
    assert rows == [f"{CAROL}|2000"], rows


@check
def a_table_she_may_not_read_stays_unreadable_from_a_worker(s):
    same_in_three_ways(s, per_row("alice.peek_secret(a)"), expect_error="42501")


@check
def row_level_security_filters_as_in_her_own_backend(s):
    rows, _ = same_in_three_ways(s, "SELECT owner, count(*) FROM alice.shared_rows GROUP BY owner")
    assert rows == [f"{ALICE}|1000"], rows


@check
def a_security_definer_function_runs_as_its_owner_only(s):
    rows, _ = same_in_three_ways(s, per_row("bob.definer_count(a)"))
    assert rows == ["500|2000"], rows


@check
def identity_functions_answer_as_in_her_own_backend(s):
    exprs = ["current_user", "session_user", "has_table_privilege('bob.secret', 'SELECT')",
             "has_table_privilege('alice.t', 'SELECT')", "pg_has_role('pg_read_all_stats', 'USAGE')",
             "current_setting('is_superuser')", "current_setting('session_authorization')"]
    if int(s.sql("SHOW server_version_num")) >= 160000:
        exprs.append("coalesce(system_user, '<null>')")
    for expr in exprs:
        rows, _ = same_in_three_ways(s, per_row(f"({expr})::text"))
        assert len(rows) == 1 and rows[0].endswith("|2000"), (expr, rows)
    print(f"    {len(exprs)} identity functions alike")


@check
def another_leaders_placeholder_does_not_reach_her_fragments(s):
    """Another session of hers sets app.tenant and runs pooled statements; her next
    session's fragments then read current_setting('app.tenant', true) as NULL, as in
    its own backend."""
    def she_sets_a_placeholder(mode):
        if mode == "pool":
            warm_pool(s, "postgres")
        out, error = run_as(s, ALICE, "SET app.tenant = 'alice-corp'; " + per_row(
            "coalesce(current_setting('app.tenant', true), '<null>')"))
        assert error is None and out == ["alice-corp|2000"], (out, error)
    retired = counters(s)["workers_retired_for_settings"]
    rows, _ = same_in_three_ways(
        s, per_row("coalesce(current_setting('app.tenant', true), '<null>')"),
        before=she_sets_a_placeholder)
    assert rows == ["<null>|2000"], rows
    retired = counters(s)["workers_retired_for_settings"] - retired
    # The pool workers that ran the first session's fragments kept its placeholder,
    # and retired.
    assert retired >= 1, retired
    print(f"    {retired} pool workers retired after restoring her other session's placeholder")


@check
def a_pool_worker_serves_the_leaders_of_one_role_only(s):
    """What a fragment leaves in a pool worker beyond identity and settings (PL/pgSQL
    functions compiled under its leader's search_path, a temporary type they resolved
    to, PL/Python's session data) must not reach another role's fragments: alternating
    bob's and alice's pooled statements, each gets pool workers, and no process runs
    fragments of both."""
    ran = {ALICE: set(), BOB: set()}
    retired = counters(s)["workers_retired"]
    for _ in range(3):
        for user, schema in ((BOB, "bob"), (ALICE, "alice")):
            warm_pool(s, "postgres", user=user, table=f"{schema}.t")
            out, error = run_as(s, user, f"SELECT DISTINCT {schema}.worker_pid(a) FROM {schema}.t")
            assert error is None, error
            pooled = {int(p) for p in out} & set(pool_pids(s, "postgres"))
            assert pooled, (user, out, pool_pids(s, "postgres"))
            ran[user] |= pooled
    assert not ran[ALICE] & ran[BOB], ran
    # The other role's idle workers made way.
    assert counters(s)["workers_retired"] - retired >= 1, counters(s)
    print(f"    bob's fragments ran in {sorted(ran[BOB])}, alice's in {sorted(ran[ALICE])}")


@check
def the_pool_workers_own_identity_does_not_leak_into_a_fragment(s):
    """Repeated pooled statements alternating alice and the superuser: each fragment
    sees only its own leader's identity."""
    for _ in range(5):
        out, error = run_as(s, "postgres", per_row("current_user || '/' || session_user"))
        assert error is None and out == ["postgres/postgres|2000"], (out, error)
        out, error = run_as(s, ALICE, per_row("current_user || '/' || session_user"))
        assert error is None and out == [f"{ALICE}/{ALICE}|2000"], (out, error)
        _, error = run_as(s, ALICE, per_row("alice.as_postgres(a)"))
        assert error and "42501" in error, error


def pool_pids(s, database):
    out = s.sql(f"SELECT pid FROM pg_stride.pool WHERE datname = '{database}' ORDER BY pid")
    return [int(p) for p in out.split()]


def warm_pool(s, database, user=ALICE, table="alice.t"):
    """Runs pooled statements of `user` in `database` until one ran in pool workers (a
    worker serves the leaders of one role: another role's idle ones make way for fresh
    workers) and the pool's workers are idle; returns their pids."""
    deadline = time.monotonic() + 20
    while True:
        args = s.psql_args(FORCE.replace("\\set VERBOSITY verbose\n", "") +
                           f"SELECT count(*) FROM {table}", user=user)
        args[args.index("-d") + 1] = database
        entered = counters(s)["fragments_entered"]
        s.run(*args[len(concurrency.AS_POSTGRES):], capture_output=True, check=True)
        entered = counters(s)["fragments_entered"] - entered
        pids = pool_pids(s, database)
        if entered > 0 and s.sql(f"SELECT count(*) FROM pg_stride.pool WHERE datname = '{database}' "
                                 "AND state = 'idle'") == str(len(pids)):
            return pids
        assert time.monotonic() < deadline, s.sql("SELECT * FROM pg_stride.pool")
        time.sleep(0.1)


@check
def a_database_command_that_fails_its_permission_check_leaves_the_pool_alone(s):
    """ALTER DATABASE, DROP DATABASE, RENAME and CREATE DATABASE … TEMPLATE by a role
    that owns nothing fail with PostgreSQL's own error, and the pool's workers are the
    same afterwards."""
    pids = warm_pool(s, "postgres")
    for sql, code in [("ALTER DATABASE postgres CONNECTION LIMIT 1", "42501"),
                      ("ALTER DATABASE postgres SET TABLESPACE pg_default", "42501"),
                      ("ALTER DATABASE postgres RENAME TO regress_renamed", "42501"),
                      ("DROP DATABASE postgres", "42501"),
                      ("DROP DATABASE postgres WITH (FORCE)", "42501"),
                      ("CREATE DATABASE regress_copy TEMPLATE postgres", "42501")]:
        _, error = run_as(s, CAROL, sql)
        assert error and code in error, (sql, error)
    time.sleep(0.5)
    assert pool_pids(s, "postgres") == pids, (pool_pids(s, "postgres"), pids)
    _, error = run_as(s, ALICE, per_row("current_user"))
    assert error is None, error


def database_of_dave(s, name, rights):
    """Creates database `name`, owned by DAVE, with pg_stride and a table t of 2000 rows,
    then runs `rights` (SQL: t's owner, or grants on it) there."""
    s.sql(f"CREATE DATABASE {name} OWNER {DAVE}")
    setup_args = s.psql_args("CREATE EXTENSION IF NOT EXISTS pg_stride; "
                             "CREATE TABLE t AS SELECT g AS a FROM generate_series(1, 2000) g; "
                             f"ANALYZE t; {rights}")
    setup_args[setup_args.index("-d") + 1] = name
    s.run(*setup_args[len(concurrency.AS_POSTGRES):], capture_output=True, check=True)


@check
def database_commands_of_the_owner_are_not_blocked_by_the_pool(s):
    """The owner's commands that need a database nobody is connected to succeed while
    that database has an idle pool: PostgreSQL ends the pool's workers where it ends
    autovacuum workers, once the command has passed its checks."""
    database_of_dave(s, "regress_pool_db", f"ALTER TABLE t OWNER TO {DAVE}")
    ts = os.path.join(s.dir, "ts")
    s.run("mkdir", ts, check=True)
    s.sql(f"CREATE TABLESPACE regress_ts LOCATION '{ts}'")
    s.sql(f"GRANT CREATE ON TABLESPACE regress_ts TO {DAVE}")
    timings = []
    for database, user, sql in [
            ("regress_pool_db", DAVE, "ALTER DATABASE regress_pool_db RENAME TO regress_pool_db2"),
            ("regress_pool_db2", "postgres", "CREATE DATABASE regress_pool_copy TEMPLATE regress_pool_db2"),
            ("regress_pool_db2", DAVE, "ALTER DATABASE regress_pool_db2 SET TABLESPACE regress_ts"),
            ("regress_pool_db2", DAVE, "DROP DATABASE regress_pool_db2")]:
        warm_pool(s, database, user=DAVE, table="t")
        started = time.monotonic()
        _, error = run_as(s, user, sql)
        timings.append(time.monotonic() - started)
        assert error is None, (sql, error)
        assert timings[-1] < 4, (sql, timings[-1])
    assert not pool_pids(s, "regress_pool_db2")
    s.sql("DROP DATABASE regress_pool_copy")
    s.sql("DROP TABLESPACE regress_ts")
    print("    rename, template copy, set tablespace, drop: "
          + ", ".join(f"{t:.2f} s" for t in timings))


def slow_pooled_query(s, database, user, table="t"):
    """Starts, as `user` in `database`, a pooled query of about 15 s (2000 rows of
    `table`, 15 ms each, read by two pool workers); returns its psql once its workers
    are busy.
    A run that got no pool worker within 5 s (the concurrency hint granted none, or
    the workers were still being replaced for this role) is cancelled and started
    again, up to five times."""
    sql = f"SELECT count(*) FROM (SELECT pg_sleep(0.015) FROM {table}) x"
    busy = ("SELECT count(*) > 0 FROM pg_stride.pool "
            f"WHERE datname = '{database}' AND state = 'busy'")
    for _ in range(5):
        warm_pool(s, database, user=user, table=table)
        args = s.psql_args(FORCE.replace("\\set VERBOSITY verbose\n", "") + sql, user=user)
        args[args.index("-d") + 1] = database
        slow = subprocess.Popen(args, env=concurrency.ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if s.sql(busy) == "t":
                return slow
            time.sleep(0.05)
        s.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
              f"WHERE datname = '{database}' AND query LIKE '%pg_sleep(0.015)%' "
              "AND pid <> pg_backend_pid()")
        concurrency.finish(slow, timeout=60)
    raise AssertionError(f"no run of {user}'s query in {database} got a pool worker: "
                         + s.sql("SELECT * FROM pg_stride.pool"))


@check
def her_fragments_show_as_hers_in_pg_stat_activity(s):
    """While alice's pooled query runs, the pool workers running it show alice as their
    user in pg_stat_activity, and she reads their query, as PostgreSQL's parallel
    workers of her statement show; dave, another ordinary role, sees them as hers
    without their query; once they are idle, they show their own user again. Catches: a pool worker left showing the
    bootstrap superuser it connected as, for which alice read '<insufficient
    privilege>' for her own statement's workers."""
    busy = ("SELECT coalesce(string_agg(usename || ' ' || (query LIKE '%pg_sleep(0.015)%'), "
            "',' ORDER BY pid), '') FROM pg_stat_activity "
            f"WHERE backend_type = 'pg_stride pool' AND usename = '{ALICE}'")
    # Dave sees her rows' user only: the backend type is hidden from him too.
    hidden = ("SELECT count(*) FROM pg_stat_activity "
              f"WHERE usename = '{ALICE}' AND query = '<insufficient privilege>'")
    # The pool workers running a fragment, as the superuser sees them (one or two: a
    # worker that served another role earlier serves none of hers).
    workers = ("SELECT count(*) FROM pg_stat_activity "
               "WHERE backend_type = 'pg_stride pool' AND state = 'active'")
    slow = slow_pooled_query(s, "postgres", ALICE, "alice.t")
    try:
        time.sleep(0.5)
        n = int(s.sql(workers))
        seen = {ALICE: s.sql(busy, user=ALICE), DAVE: s.sql(hidden, user=DAVE)}
        assert s.sql(workers) == str(n) and n > 0, s.sql("SELECT * FROM pg_stride.pool")
    finally:
        s.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
              "WHERE query LIKE '%pg_sleep(0.015)%' AND backend_type = 'client backend' "
              "AND pid <> pg_backend_pid()")
        concurrency.finish(slow, timeout=60)
    print(f"    pool workers shown as alice's, to alice: {seen[ALICE]!r}; alice's processes "
          f"whose query dave may not read: {seen[DAVE]}")
    assert seen == {ALICE: ",".join([f"{ALICE} true"] * n), DAVE: str(1 + n)}, (n, seen)
    s.wait_until("SELECT count(*) FROM pg_stride.pool WHERE datname = 'postgres' AND state = 'busy'", "0")
    idle = s.sql("SELECT string_agg(DISTINCT coalesce(usename, '-'), ',') FROM pg_stat_activity "
                 "WHERE backend_type = 'pg_stride pool'")
    assert ALICE not in idle, idle


@check
def a_drop_database_that_fails_leaves_running_fragments_alone(s):
    """The owner of a database, then a superuser, try to drop it while a superuser's
    pooled query runs there. PostgreSQL refuses (the owner's FORCE, 42501: he may not
    end a superuser's session; without FORCE, 55006 after 5 s: other sessions are
    connected), and the query finishes with its rows: the drop hook ends only the
    pool's workers that serve no leader, and with FORCE those of leaders the caller may
    end. The owner's FORCE while his own pooled query runs there goes through."""
    database_of_dave(s, "regress_busy_db", f"GRANT SELECT ON t TO {DAVE}")
    try:
        slow = slow_pooled_query(s, "regress_busy_db", "postgres")
        # The superuser's own plain DROP too: it may end that session, but without
        # FORCE PostgreSQL ends none.
        for user, sql, code in [(DAVE, "DROP DATABASE regress_busy_db WITH (FORCE)", "42501"),
                                (DAVE, "DROP DATABASE regress_busy_db", "55006"),
                                ("postgres", "DROP DATABASE regress_busy_db", "55006")]:
            _, error = run_as(s, user, sql)
            assert error and code in error, (user, sql, error)
        rc, out, err = concurrency.finish(slow, timeout=60)
        assert (rc, out) == (0, "2000"), (rc, out, err)
        own = slow_pooled_query(s, "regress_busy_db", DAVE)
        _, error = run_as(s, DAVE, "DROP DATABASE regress_busy_db WITH (FORCE)")
        assert error is None, error
        rc, out, err = concurrency.finish(own, timeout=60)
        assert rc != 0 and "terminat" in err, (rc, out, err)
    finally:
        s.sql("DROP DATABASE IF EXISTS regress_busy_db WITH (FORCE)")


@check
def database_commands_are_not_blocked_by_the_groups_loader(s):
    """The groups loader stays connected to pg_stride.database (postgres here) between
    reloads; a copy of that database, which needs it to have no other session, is made
    (PostgreSQL gives up after waiting 5 s for the others to leave), and the loader is
    back within its restart time."""
    loader = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_stride groups'"
    s.wait_until(loader, "1")
    warm_pool(s, "postgres")
    _, error = run_as(s, "postgres", "CREATE DATABASE regress_loader_copy TEMPLATE postgres")
    assert error is None, error
    s.sql("DROP DATABASE regress_loader_copy")
    s.wait_until(loader, "1", timeout=30)


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql(f"CREATE ROLE {ALICE} LOGIN; CREATE ROLE {BOB} LOGIN; CREATE ROLE {CAROL} LOGIN; "
          f"CREATE ROLE {DAVE} LOGIN CREATEDB")
    s.sql(f"GRANT {CAROL} TO {ALICE}")
    s.sql(f"CREATE SCHEMA alice AUTHORIZATION {ALICE}; CREATE SCHEMA bob AUTHORIZATION {BOB}")
    s.sql(f"GRANT USAGE ON SCHEMA bob TO {ALICE}; GRANT USAGE ON SCHEMA alice TO {CAROL}")
    s.sql(f"GRANT pg_read_all_stats TO {BOB}")
    bob = [
        "CREATE TABLE bob.secret AS SELECT g AS x FROM generate_series(1, 500) g",
        "CREATE TABLE bob.t AS SELECT g AS a FROM generate_series(1, 2000) g",
        "ANALYZE bob.secret; ANALYZE bob.t",
        "CREATE FUNCTION bob.worker_pid(int) RETURNS int LANGUAGE plpgsql VOLATILE "
        "PARALLEL SAFE AS 'BEGIN RETURN pg_backend_pid(); END'",
        "CREATE FUNCTION bob.definer_count(int) RETURNS bigint LANGUAGE sql STABLE "
        "PARALLEL SAFE SECURITY DEFINER AS 'SELECT count(*) FROM bob.secret'",
        f"GRANT EXECUTE ON FUNCTION bob.definer_count(int) TO {ALICE}",
    ]
    s.sql("; ".join(bob), user=BOB)
    # SQL functions of hers whose SET clauses try to change identity; the bodies would
    # read what only the target role may read.
    alice = [
        "SET check_function_bodies = off",
        "CREATE TABLE alice.t AS SELECT g AS a FROM generate_series(1, 2000) g",
        "CREATE FUNCTION alice.worker_pid(int) RETURNS int LANGUAGE plpgsql VOLATILE "
        "PARALLEL SAFE AS 'BEGIN RETURN pg_backend_pid(); END'",
        "ANALYZE alice.t",
        "CREATE FUNCTION alice.as_postgres(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE "
        "SET session_authorization = 'postgres' "
        "AS 'SELECT current_user || (SELECT count(*) FROM pg_authid)::text'",
        "CREATE FUNCTION alice.as_bob(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE "
        f"SET session_authorization = '{BOB}' "
        "AS 'SELECT current_user || (SELECT count(*) FROM bob.secret)::text'",
        "CREATE FUNCTION alice.role_bob(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE "
        f"SET role = '{BOB}' AS 'SELECT current_user::text'",
        "CREATE FUNCTION alice.role_carol(int) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE "
        f"SET role = '{CAROL}' AS 'SELECT current_user::text'",
        "CREATE FUNCTION alice.peek_secret(int) RETURNS bigint LANGUAGE sql STABLE PARALLEL SAFE "
        "AS 'SELECT count(*) FROM bob.secret'",
        # Rows of two owners; the policy shows each role its own.
        "CREATE TABLE alice.shared_rows AS SELECT g AS a, "
        f"CASE WHEN g % 2 = 0 THEN '{ALICE}' ELSE '{BOB}' END::name AS owner "
        "FROM generate_series(1, 2000) g",
        "ANALYZE alice.shared_rows",
        "ALTER TABLE alice.shared_rows ENABLE ROW LEVEL SECURITY",
        "ALTER TABLE alice.shared_rows FORCE ROW LEVEL SECURITY",
        "CREATE POLICY own_rows ON alice.shared_rows USING (owner = current_user)",
    ]
    s.sql("; ".join(alice), user=ALICE)
    for role in (ALICE, BOB, CAROL):
        s.sql(f"ALTER ROLE {role} SET row_security = on")


def main():
    server = concurrency.Server(port=concurrency.PORT + 14, extra_conf=CONF)
    return concurrency.run_suite("pool_identity", server, CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
