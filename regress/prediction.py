#!/usr/bin/env python3
"""The CPU a statement is predicted to use and where that starts its priority
(`pg_stride.predict`, views `pg_stride.statements`, `pg_stride.prediction_quality` and
the `predicted_cpu_ms` and `class` columns of `pg_stride.activity`), with real sessions
of an ordinary login role.

The server runs with decay_lambda = 1, so that a statement keeps the priority it
started at and the view shows it:

- a statement run three times has a history under its query identifier (the one EXPLAIN
  VERBOSE shows): three calls, its mean, p95 and largest CPU, class long; run again,
  pg_stride.activity shows that mean as its prediction, class long, and its priority
  started at the initial priority scaled by the short threshold over the prediction;
- with pg_stride.predict off for its role, the same statement starts at the initial
  priority; pg_stride.activity still shows its prediction, and it still adds to its
  history;
- one query identifier in two databases (made from one template, so their tables have
  the same OIDs) has a history in each, shown in pg_stride.statements of each; one run
  by two roles has a history for each, each row naming its role (userid);
- a statement never seen is predicted from its plan's cost (the cost model calibrated by
  the others), and has a history of its own once it ended;
- a statement cancelled by statement_timeout adds nothing to its history;
- a statement whose plan is above the tiny bound runs unscheduled (the trace does not
  record it) once its history shows at least three executions under half a slice, its
  class then tiny, and is still recorded; once it grows past that, the run that grew
  takes a slot after a slice of CPU (the trace records it) and the next runs scheduled
  from its start;
- a parallel statement predicted short gets its planned workers on an idle server and
  none beside another running statement (with pg_stride.predict off it gets them there
  too);
- pg_stride.prediction_quality counts each scheduled statement that ended by the class
  it was predicted and the one it had, and how far off the prediction was;
- under compute_query_id = auto, a backend computes query identifiers from its first
  scheduled statement on, not before: that one is predicted from its plan's cost;
- pg_stride.statements is for members of pg_read_all_stats (it shows other roles'
  fingerprints); prediction_quality is for everyone; an ordinary role cannot change
  pg_stride.predict for itself (off, its long statements would start higher), nor
  pg_stride.slice (raised, more of its statements would run unscheduled).

Prints one line per check, then "prediction: N passed, N failed".
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import ENV, OWN_QUERY_ID_COMPUTED, finish  # noqa: E402

PORT = int(os.environ.get("PREDICTION_PORT", "5518"))
APP = "regress_predict_app"
OTHER = "regress_predict_other"
STATS = "regress_predict_stats"
# Prediction on (the default, set so that the suite does not depend on it); more CPU
# slots than the machine's, so that the concurrency hint would grant a Gather its
# workers beside one other statement. Query
# identifiers computed in every backend, as with pg_stat_statements loaded: the checks
# run each statement in a session of its own, whose first scheduled statement would
# otherwise have none (the last check covers compute_query_id = auto).
CONF = """
pg_stride.predict = on
compute_query_id = on
pg_stride.decay_lambda = 1.0
pg_stride.cpu_slots = 8
max_parallel_workers_per_gather = 0
"""
# About a quarter of a second of CPU: long beside the 16 ms threshold (8 quanta of 2 ms).
LONG = "SELECT count(*) FROM predict_big WHERE a % 3 <> 5"
# Another fingerprint over the same table.
OTHER_SHAPE = "SELECT max(a * 2) FROM predict_big WHERE a > 0"
# A parallel plan of a few ms.
PARALLEL = ("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
            "SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2; "
            "SET parallel_leader_participation = off; ")
SMALL = "SELECT count(*) FROM predict_small WHERE a > 0"
P0, SHORT_MS = 10_000, 16.0

CHECKS = []
check = concurrency.collector(CHECKS)


def query_id(s, sql, settings=""):
    plan = s.sql(f"{settings}EXPLAIN (VERBOSE, COSTS OFF) {sql}", user=APP)
    return next(line.split(":")[1].strip() for line in plan.splitlines()
                if "Query Identifier" in line)


def history(s, qid, user=APP):
    """(calls, mean, p95, max CPU ms, class) of fingerprint `qid` run by `user`, None
    without one."""
    row = s.sql("SELECT calls, mean_cpu_ms, p95_cpu_ms, max_cpu_ms, class "
                f"FROM pg_stride.statements WHERE queryid = {qid} "
                f"AND userid = '{user}'::regrole")
    if not row:
        return None
    calls, mean, p95, mx, cls = row.split("|")
    return int(calls), float(mean), float(p95), float(mx), cls


def run_app(s, sql, n=1):
    for _ in range(n):
        s.sql(sql, user=APP)


def while_running(s, sql):
    """Starts `sql` as APP and returns pg_stride.activity's (priority, predicted_cpu_ms,
    class) of it once it is scheduled, after it ended."""
    proc = subprocess.Popen(s.psql_args(sql, user=APP), env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = None
    deadline = time.monotonic() + 20
    while seen is None and time.monotonic() < deadline and proc.poll() is None:
        row = s.sql("SELECT priority, coalesce(predicted_cpu_ms::text, 'none'), "
                    "coalesce(class, 'none') FROM pg_stride.activity "
                    f"WHERE usename = '{APP}' AND cpu_time_ms IS NOT NULL")
        if row:
            priority, predicted, cls = row.split("|")
            seen = (int(priority), None if predicted == "none" else float(predicted),
                    None if cls == "none" else cls)
    rc, out, err = finish(proc, timeout=120)
    assert rc == 0, (rc, out, err)
    assert seen is not None, "the statement never showed up as scheduled"
    return seen


@check
def a_repeated_statement_starts_from_its_history(s):
    qid = query_id(s, LONG)
    assert history(s, qid) is None
    run_app(s, LONG, 3)
    calls, mean, p95, mx, cls = history(s, qid)
    assert calls == 3 and cls == "long" and mean > SHORT_MS, (calls, mean, cls)
    assert mean <= p95 <= mx, (mean, p95, mx)
    priority, predicted, cls = while_running(s, LONG)
    assert cls == "long" and abs(predicted - mean) < 0.01, (predicted, mean, cls)
    # start_policy: p0 · threshold / prediction, within [p_min, p0]
    p_min = int(s.sql("SHOW pg_stride.priority_min"))
    expected = max(p_min, min(P0, int(P0 * SHORT_MS / mean)))
    assert abs(priority - expected) <= 1, (priority, expected, mean)
    assert history(s, qid)[0] == 4
    print(f"    mean {mean:.1f} ms over 3 runs: started at priority {priority} (p0 {P0})")


@check
def one_identifier_has_a_history_per_database(s):
    """Two databases made from one template have the same table OIDs, so one query has
    one query identifier in both; with a table 30 times larger in one of them, each
    database keeps its own history of it."""
    s.sql("CREATE DATABASE regress_tenants")
    s.sql("CREATE EXTENSION pg_stride; CREATE TABLE tenant (a int); "
          f"GRANT SELECT ON tenant TO {APP}", db="regress_tenants")
    sizes = {"regress_tenant_small": 100_000, "regress_tenant_big": 3_000_000}
    try:
        for db, rows in sizes.items():
            s.sql(f"CREATE DATABASE {db} TEMPLATE regress_tenants")
            s.sql(f"INSERT INTO tenant SELECT g FROM generate_series(1, {rows}) g; "
                  "ANALYZE tenant", db=db)
        sql = "SELECT count(*) FROM tenant WHERE a % 3 <> 5"
        qids = {db: next(line.split(":")[1].strip() for line in s.sql(
                    f"EXPLAIN (VERBOSE, COSTS OFF) {sql}", user=APP, db=db).splitlines()
                    if "Query Identifier" in line) for db in sizes}
        assert len(set(qids.values())) == 1, qids
        qid = qids["regress_tenant_small"]
        for db in sizes:
            for _ in range(3):
                s.sql(sql, user=APP, db=db)
        seen = {db: s.sql(f"SELECT calls, mean_cpu_ms FROM pg_stride.statements WHERE queryid = {qid}",
                          user=STATS, db=db) for db in sizes}
        (small_calls, small_ms), (big_calls, big_ms) = (
            seen[db].split("|") for db in ("regress_tenant_small", "regress_tenant_big"))
        assert small_calls == big_calls == "3", seen
        assert float(big_ms) > 5 * float(small_ms), seen
        print(f"    query {qid}: {float(small_ms):.1f} ms in the small database, "
              f"{float(big_ms):.1f} ms in the big one, 3 calls each")
    finally:
        for db in [*sizes, "regress_tenants"]:
            s.sql(f"DROP DATABASE IF EXISTS {db}")


@check
def one_query_identifier_of_two_roles_has_a_history_for_each(s):
    """The same statement, by query identifier, from two roles whose constants make one
    role's executions ten times the other's: each role's history holds its own, so the
    heavy role's runs do not make the light role's statements predicted long. Catches:
    one history per query identifier and database, shared by every role (six calls,
    one mean)."""
    sql = "SELECT count(*) FROM generate_series(1, {n}) g WHERE g % 7 = 3"
    light, heavy = sql.format(n=300_000), sql.format(n=3_000_000)
    qid = query_id(s, light)
    assert query_id(s, heavy) == qid
    for _ in range(3):
        s.sql(light, user=APP)
        s.sql(heavy, user=OTHER)
    rows = s.sql("SELECT string_agg(calls::text, ',') || '|' || max(mean_cpu_ms) / min(mean_cpu_ms) "
                 f"FROM pg_stride.statements WHERE queryid = {qid}", user=STATS)
    calls, ratio = rows.split("|")
    print(f"    query {qid}: calls {calls}, heavy role's mean / light role's {float(ratio):.1f}")
    assert calls == "3,3" and float(ratio) > 4, rows
    # Each row names its role, as pg_stat_statements' userid does.
    roles = s.sql("SELECT string_agg(r.rolname || ':' || calls, ',' ORDER BY r.rolname) "
                  "FROM pg_stride.statements st JOIN pg_roles r ON r.oid = st.userid "
                  f"WHERE queryid = {qid}", user=STATS)
    assert roles == ",".join(sorted([f"{APP}:3", f"{OTHER}:3"])), roles


@check
def with_prediction_off_a_statement_starts_at_the_initial_priority(s):
    qid = query_id(s, LONG)
    before = history(s, qid)[0]
    s.sql(f"ALTER ROLE {APP} SET pg_stride.predict = off")
    try:
        priority, predicted, cls = while_running(s, LONG)
    finally:
        s.sql(f"ALTER ROLE {APP} RESET pg_stride.predict")
    assert priority == P0 and cls == "long" and predicted is not None, (priority, predicted, cls)
    assert history(s, qid)[0] == before + 1


@check
def a_new_fingerprint_is_predicted_from_its_plan_cost(s):
    qid = query_id(s, OTHER_SHAPE)
    assert history(s, qid) is None
    calibrations = int(s.sql("SELECT cost_calibrations FROM pg_stride.prediction_quality"))
    assert calibrations >= 3, calibrations
    per_cost = float(s.sql("SELECT cpu_us_per_cost FROM pg_stride.prediction_quality"))
    cost = float(s.sql(f"EXPLAIN (FORMAT JSON) {OTHER_SHAPE}", user=APP)
                 .split('"Total Cost":')[1].split(",")[0])
    priority, predicted, cls = while_running(s, OTHER_SHAPE)
    assert predicted is not None and abs(predicted - cost * per_cost / 1000) < 0.01 * predicted + 0.01, \
        (predicted, cost, per_cost)
    assert history(s, qid)[0] == 1
    print(f"    cost {cost:.0f} x {per_cost:.3f} µs: predicted {predicted:.1f} ms ({cls})")


@check
def a_plan_made_with_lowered_cpu_costs_is_predicted_as_at_the_defaults(s):
    # Catches: the shared cost model reading a plan's cost as the session made it. Any
    # role may lower the CPU cost settings: its plans would then look ten times cheaper,
    # be predicted short and start at the initial priority.
    lowered = "SET cpu_tuple_cost = 0.001; SET cpu_operator_cost = 0.00025; "
    sql = "SELECT sum(a % 11) FROM predict_big WHERE a > 2"
    qid = query_id(s, sql)
    assert history(s, qid) is None
    per_cost = float(s.sql("SELECT cpu_us_per_cost FROM pg_stride.prediction_quality"))
    cost = float(s.sql(f"{lowered}EXPLAIN (FORMAT JSON) {sql}", user=APP)
                 .split('"Total Cost":')[1].split(",")[0])
    _, predicted, cls = while_running(s, lowered + sql)
    # the lowest of the CPU costs' ratios to their defaults is 0.1
    expected = cost / 0.1 * per_cost / 1000
    assert predicted is not None and abs(predicted - expected) < 0.01 * expected + 0.01, \
        (predicted, expected, cost, per_cost)
    print(f"    cost {cost:.0f} with the CPU costs at a tenth: predicted {predicted:.1f} ms "
          f"({cls}), as a cost of {cost / 0.1:.0f}")


def recorded_executions(s):
    """Every execution pg_stride.prediction_quality counted since its last reset."""
    return int(s.sql("SELECT short_predicted_short + short_predicted_long + long_predicted_short "
                     "+ long_predicted_long + unpredicted FROM pg_stride.prediction_quality"))


@check
def a_statement_beside_an_open_cursor_is_recorded_under_no_fingerprint(s):
    # Catches: a statement run while a cursor of the same session is open shares the
    # cursor's CPU accounting; recorded at the cursor's close, the CPU of both would
    # enter the cursor's fingerprint's history.
    cursor = ["BEGIN;", "DECLARE c CURSOR FOR SELECT a FROM predict_big WHERE a % 7 = 1;",
              "FETCH 100 FROM c;", "FETCH 100 FROM c;", "CLOSE c;", "COMMIT;"]
    counted = []
    for beside in ([], [LONG + ";"]):
        script = "\n".join(cursor[:3] + beside + cursor[3:]) + "\n"
        s.sql("SELECT pg_stride.reset_stats()")
        out = subprocess.run(s.psql_args(None, user=APP), input=script, env=ENV, text=True,
                             capture_output=True)
        assert out.returncode == 0, out.stderr
        counted.append(recorded_executions(s))
    # alone, the cursor is recorded; with a statement beside it, neither is
    assert counted == [1, 0], counted


@check
def a_cancelled_statement_adds_nothing(s):
    qid = query_id(s, LONG)
    before = history(s, qid)[0]
    out = subprocess.run(s.psql_args(f"SET statement_timeout = '60ms'; {LONG}", user=APP),
                         env=ENV, capture_output=True, text=True)
    assert out.returncode != 0 and "statement timeout" in out.stderr, out
    assert history(s, qid)[0] == before


def grants(s, qid, since):
    """(workers_planned, processes) of each traced run of `qid` that arrived after `since`."""
    out = s.sql("SELECT workers_planned, processes FROM pg_stride.trace "
                f"WHERE query_id = {qid} AND arrival > '{since}' ORDER BY arrival")
    return [tuple(map(int, line.split("|"))) for line in out.splitlines()]


# Seconds of CPU: the load beside a statement (cancelled once that one ran), where
# LONG's quarter of a second could end before a statement started after it, on a busy
# machine, gets to its Gather.
BUSY = "SELECT count(*) FROM predict_big, generate_series(1, 20) g WHERE a % 3 <> g"


def beside_a_long_statement(s, sql):
    """Runs `sql` as APP while BUSY runs in another session of APP."""
    busy = subprocess.Popen(s.psql_args(BUSY, user=APP), env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        s.wait_until(f"SELECT count(*) FROM pg_stride.activity WHERE usename = '{APP}' "
                           "AND cpu_time_ms IS NOT NULL", "1", timeout=20)
        s.sql(sql, user=APP)
        assert busy.poll() is None, "the long statement ended before the one beside it ran"
    finally:
        s.sql(f"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE usename = '{APP}'")
        finish(busy, timeout=120)


@check
def a_statement_predicted_short_takes_no_workers_under_load(s):
    qid = query_id(s, SMALL, PARALLEL)
    s.sql(f"ALTER ROLE {APP} SET pg_stride.trace = on")
    try:
        since = s.sql("SELECT now()")
        run_app(s, PARALLEL + SMALL, 3)
        calls, mean, _, _, cls = history(s, qid)
        assert cls == "short", (calls, mean, cls)
        alone = grants(s, qid, since)
        since = s.sql("SELECT now()")
        beside_a_long_statement(s, PARALLEL + SMALL)
        loaded = grants(s, qid, since)
        s.sql(f"ALTER ROLE {APP} SET pg_stride.predict = off")
        since = s.sql("SELECT now()")
        beside_a_long_statement(s, PARALLEL + SMALL)
        unpredicted = grants(s, qid, since)
    finally:
        s.sql(f"ALTER ROLE {APP} RESET pg_stride.trace; ALTER ROLE {APP} RESET pg_stride.predict")
    # alone: the 2 planned workers, predicted short or not
    assert alone == [(2, 3)] * 3, alone
    assert loaded == [(2, 1)], loaded
    assert unpredicted == [(2, 3)], unpredicted
    print(f"    mean {mean:.1f} ms: workers alone {alone}, beside BUSY {loaded}, "
          f"with predict off {unpredicted}")


def traced_runs(s, qid, since):
    """How many runs of `qid` that arrived after `since` the trace recorded: the
    scheduled ones."""
    return int(s.sql(f"SELECT count(*) FROM pg_stride.trace WHERE query_id = {qid} "
                     f"AND arrival > '{since}'"))


@check
def a_repeated_statement_under_half_a_slice_skips_the_slots_until_it_grows(s):
    # Catches: a statement whose plan is above the tiny bound but whose history shows it
    # ends well inside one slice still taking a slot, where it would wait for one
    # behind long statements for longer than it runs; one that grew staying
    # unscheduled for the rest of that run (outside the slots' order, decay and
    # runaway-query rules), or for its next runs. With 50-ms slices the bound is 1,250
    # cost units and 25 ms of CPU: a count over MID costs more than the first and uses
    # a few ms. Runs 1-3 are scheduled (the trace records them) and make its history;
    # runs 4-6 are not, and are still recorded into it, as is a loop over it. Then MID
    # grows 31-fold: the first run after that starts unscheduled (its history said
    # short) and takes a slot once it has used a slice (traced), and the next is
    # scheduled from its start (traced). Both are recorded once each.
    sql = "SELECT count(*) FROM predict_mid WHERE a > 0"
    cost = float(s.sql(f"EXPLAIN (FORMAT JSON) {sql}", user=APP)
                 .split('"Total Cost":')[1].split(",")[0])
    assert cost > 25 * 50, f"the count costs {cost}: a tiny plan at 50-ms slices"
    qid = query_id(s, sql)
    s.sql(f"ALTER ROLE {APP} SET pg_stride.trace = on; ALTER ROLE {APP} SET pg_stride.slice = '50ms'")
    try:
        since = s.sql("SELECT now()")
        run_app(s, sql, 6)
        short = traced_runs(s, qid, since)
        calls, mean, p95, _, _ = history(s, qid)
        cls = s.sql(f"SET pg_stride.slice = '50ms'; SELECT class FROM pg_stride.statements "
                    f"WHERE queryid = {qid}")
        # The same statement as the query of a PL/pgSQL loop (the same identifier) whose
        # body runs LONG between the loop's fetches: it records the CPU of its own runs,
        # not LONG's quarter of a second.
        loop = (f"DO $$DECLARE r record; BEGIN FOR r IN {sql} LOOP "
                f"PERFORM * FROM ({LONG}) l; END LOOP; END$$")
        since = s.sql("SELECT now()")
        s.sql(loop, user=APP)
        beside = traced_runs(s, qid, since), history(s, qid)
        s.sql("INSERT INTO predict_mid SELECT g FROM generate_series(1, 3000000) g")
        since = s.sql("SELECT now()")
        run_app(s, sql, 2)
        grown = traced_runs(s, qid, since)
        after = history(s, qid)
        cls_after = s.sql(f"SET pg_stride.slice = '50ms'; SELECT class FROM pg_stride.statements "
                          f"WHERE queryid = {qid}")
    finally:
        s.sql(f"ALTER ROLE {APP} RESET pg_stride.trace; ALTER ROLE {APP} RESET pg_stride.slice")
        s.sql("TRUNCATE predict_mid; INSERT INTO predict_mid SELECT g FROM generate_series(1, 100000) g")
    assert (short, calls) == (3, 6) and p95 <= 25, (short, calls, mean, p95)
    assert cls == "tiny", cls
    # The loop's body is not tiny by its history: the query the two share is scheduled
    # from the body's first check-in as the body's (traced under LONG's identifier, not
    # the loop's); the loop's own runs are recorded into its history.
    (loop_traced, (loop_calls, _, _, loop_max, _)) = beside
    assert (loop_traced, loop_calls) == (0, 7) and loop_max <= 25, beside
    # both grown runs recorded, once each; both took slots, and are traced
    assert after[0] == 9 and cls_after != "tiny" and grown == 2, (after, cls_after, grown)
    assert after[3] > 50, after
    print(f"    cost {cost:.0f}, mean {mean:.2f} ms, p95 {p95:.2f} ms: 3 of 6 runs scheduled; "
          f"as a loop's query beside LONG, its largest run {loop_max:.2f} ms; "
          f"grown 31-fold, 2 of 2 (largest {after[3]:.0f} ms)")


@check
def quality_counts_each_scheduled_statement_once(s):
    s.sql("SELECT pg_stride.reset_stats()")
    # (a view of pg_stride's own and nothing else: never scheduled, so never counted)
    counts = ("SELECT short_predicted_short, short_predicted_long, long_predicted_short, "
              "long_predicted_long, unpredicted, from_history, log2_error "
              "FROM pg_stride.prediction_quality")

    def read():
        *classes, errors = s.sql(counts).split("|")
        errors = [int(e) for e in errors.strip("{}").split(",")]
        return tuple(map(int, classes)) + (sum(errors),), errors

    assert read()[0] == (0, 0, 0, 0, 0, 0, 0), read()
    run_app(s, LONG, 2)
    got, errors = read()
    assert got == (0, 0, 0, 2, 0, 2, 2), got
    # a stable statement is predicted within a factor of two: element 9 is log2 error 0
    assert sum(errors[7:10]) == 2, errors


@check
def an_ordinary_role_neither_reads_fingerprints_nor_sets_predict_or_slice(s):
    out = subprocess.run(s.psql_args("SELECT count(*) FROM pg_stride.statements", user=OTHER),
                         env=ENV, capture_output=True, text=True)
    assert out.returncode != 0 and "permission denied" in out.stderr, out
    direct = subprocess.run(s.psql_args("SELECT count(*) FROM pg_stride.statements_state()",
                                        user=OTHER), env=ENV, capture_output=True, text=True)
    assert direct.returncode != 0 and "permission denied" in direct.stderr, direct
    assert int(s.sql("SELECT count(*) FROM pg_stride.statements", user=STATS)) >= 2
    assert s.sql("SELECT fingerprints >= 2 FROM pg_stride.prediction_quality", user=OTHER) == "t"
    # Nor pg_stride.slice: half of it bounds the statements its history runs
    # unscheduled, so a role that raised it could run statements of up to half a
    # second outside CPU scheduling.
    for setting_sql in ("SET pg_stride.predict = off", "SET pg_stride.predict = on",
                        "SET pg_stride.slice = '1000ms'"):
        setting = subprocess.run(s.psql_args(setting_sql, user=OTHER),
                                 env=ENV, capture_output=True, text=True)
        assert setting.returncode != 0 and "permission denied to set parameter" in setting.stderr, \
            setting


@check
def under_compute_query_id_auto_identifiers_start_at_the_first_scheduled_statement(s):
    # Catches: prediction on at server start making every backend compute query
    # identifiers (PostgreSQL's walk of each parse tree costs a transaction's short
    # statements more than everything else pg_stride adds to them), or a backend that
    # runs scheduled statements never computing them (its statements would never be
    # predicted from their history). OTHER's sessions run with compute_query_id = auto,
    # the default.
    own = OWN_QUERY_ID_COMPUTED
    script = ("SELECT a FROM predict_small LIMIT 1;\n" + own
              + LONG + ";\n" + own + LONG + ";\n")
    qid = query_id(s, LONG)
    if history(s, qid, OTHER) is None:
        for _ in range(2):
            s.sql(LONG, user=OTHER)
    before = history(s, qid, OTHER)[0]
    s.sql("SELECT pg_stride.reset_stats()")
    s.sql(f"ALTER ROLE {OTHER} SET compute_query_id = auto")
    try:
        out = subprocess.run(s.psql_args(None, user=OTHER), input=script, env=ENV,
                             text=True, capture_output=True)
    finally:
        s.sql(f"ALTER ROLE {OTHER} RESET compute_query_id")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    # the lookup is tiny: no identifier yet; the first count is scheduled: from then on
    assert [ln for ln in lines if ln in ("t", "f")] == ["f", "t"], out.stdout
    # Both counts were predicted, the first from its plan's cost (no identifier), the
    # second from its history; only the second added to it.
    predicted, from_history = s.sql(
        "SELECT short_predicted_short + short_predicted_long + long_predicted_short "
        "+ long_predicted_long, from_history FROM pg_stride.prediction_quality").split("|")
    assert (int(predicted), int(from_history)) == (2, 1), (predicted, from_history)
    assert history(s, qid, OTHER)[0] == before + 1


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql(f"CREATE ROLE {APP} LOGIN; CREATE ROLE {OTHER} LOGIN; "
          f"CREATE ROLE {STATS} LOGIN IN ROLE pg_read_all_stats")
    s.sql("CREATE TABLE predict_big AS SELECT g AS a FROM generate_series(1, 3000000) g")
    s.sql("CREATE TABLE predict_small AS SELECT g AS a FROM generate_series(1, 20000) g")
    s.sql("CREATE TABLE predict_mid AS SELECT g AS a FROM generate_series(1, 100000) g")
    s.sql("VACUUM ANALYZE predict_big, predict_small, predict_mid")
    s.sql(f"GRANT SELECT ON predict_big, predict_small, predict_mid TO {APP}, {OTHER}")


def main():
    server = concurrency.Server(port=PORT, extra_conf=CONF)
    return concurrency.run_suite("prediction", server, CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
