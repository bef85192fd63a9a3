#!/usr/bin/env python3
"""Runaway-query rules, with real sessions of an ordinary login role assigned to a group
through ALTER ROLE … SET, while other sessions run beside them.

- a `cpu_time` rule that cancels: the statement fails at its next yield point with
  SQLSTATE 57014 and the rule in the message; a statement of another group beside it
  runs on; the hit is in pg_stride.rule_hits and the server log;
- the same rule with rules_dry_run: the statement finishes, the hit says dry_run; a
  statement that met a rule in a dry run is acted on once the dry run is turned off;
- an `elapsed` rule that cancels a statement that reaches no yield point (pg_sleep):
  after its grace period it is cancelled as pg_cancel_backend would; a write, or a DO
  block's loop of writes, each shorter than that grace, is cancelled at once; an `elapsed` rule
  times each statement of a multi-statement query string from its own start;
- a `rows` rule that logs, and a `temp_bytes` rule that logs a sort that spills, in
  the statement's own process or only in its parallel workers, into the default
  tablespace or another; a `rows` rule counts a cursor's rows over all its fetches;
- a `move` rule: the moved statement shows its new group as its cpu_group in
  pg_stride.activity, and with one CPU slot, moved to a group of weight 1, it gets
  almost none of the CPU while another group's statement runs (half before the move);
- a move that could not be made before its statement ended (a parallel statement whose
  leader reached no check-in) leaves the target group free to drop;
- a statement run beside an open cursor is judged by its own CPU, not the cursor's; the
  statements of a DO block's loop are judged with the loop, beside a cursor too (from
  the loop's start);
- a rule fires once per statement, and again for the next statement; once for a cursor
  that queued to take its lent admission back; a cancel the statement raised itself
  is not sent again to the session's next statement; a statement paused for a CPU slot
  raises the rule's own error;
- a statement that its history calls tiny (it ran unscheduled) but that grew is
  cancelled by the `cpu_time` rule once it has used a slice: it runs unscheduled for
  that slice only.

Prints one line per check, then "rules: N passed, N failed".
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import finish, set_server  # noqa: E402
from memory import Server  # noqa: E402

PORT = int(os.environ.get("RULES_PORT", "5517"))
APP = "regress_rules_app"
OTHER = "regress_rules_other"
# Roles whose statements run in a group of a high weight and priority, and of the lowest.
HIGH = "regress_rules_high"
LOW = "regress_rules_low"
# Forty scans of rules_big: seconds of CPU, with yield points from the start (LONG
# builds a hash table first, without any).
HIGH_LONG = ("SELECT sum(x.n) FROM generate_series(1, 40) g, "
             "LATERAL (SELECT count(*) AS n FROM rules_big WHERE v >= g) x")
GROUP = "watched"
# A hash join of a million rows with itself (`+ 0`: PostgreSQL 18 would remove a join
# of a table with itself on its primary key).
LONG = "SELECT count(*) FROM rules_big a JOIN rules_big b ON b.id = a.id + 0 WHERE a.v >= 0"
# LONG uses about 0.3-0.6 s of CPU, depending on the machine, part of it building the
# hash table, where no yield point is: the cpu_time rules of the checks stop at 100 ms,
# so that a fast machine still reaches a yield point beyond them.
# About twice LONG's work, for the race of a_move_rule_gives_the_statement_its_new_groups_weight.
RACE = ("SELECT count(*) FROM rules_big a JOIN rules_big b ON b.id = a.id + 0 "
        "JOIN rules_big c ON c.id = b.id + 0 WHERE a.v >= 0")

CHECKS = []
check = concurrency.collector(CHECKS)


def set_rules(s, rules, dry_run=False):
    s.sql(f"SELECT pg_stride.alter_group('{GROUP}', rules => '{rules}', "
          f"rules_dry_run => {str(dry_run).lower()})")
    # The scheduler worker reads the directory at its next sweep.
    s.wait_until(f"SELECT rules FROM pg_stride.groups WHERE name = '{GROUP}'", rules)


def hits(s, since, group=GROUP):
    out = s.sql("SELECT rule || '|' || action || '|' || dry_run || '|' || pid FROM pg_stride.rule_hits "
                f"WHERE \"group\" = '{group}' AND at >= '{since}' ORDER BY at")
    return [line.split("|") for line in out.splitlines()] if out else []


def now(s):
    return s.sql("SELECT now()")


def log_text(s):
    with open(s.logfile) as f:
        return f.read()


def app_script(s, script, timeout=120):
    """Runs the psql `script` as the app; returns psql's result and its ERROR lines."""
    out = s.run(*s.psql_args(None, user=APP)[len(concurrency.AS_POSTGRES):],
                input=script, capture_output=True, text=True, timeout=timeout)
    return out, [line for line in out.stderr.splitlines() if "ERROR" in line]


@check
def a_cpu_time_rule_cancels_at_a_yield_point_and_others_run_on(s):
    set_rules(s, "cpu_time > 100ms: cancel")
    since = now(s)
    other = s.client_as(OTHER, LONG)
    started = time.monotonic()
    rc, out, err = finish(s.client_as(APP, LONG), timeout=60)
    took = time.monotonic() - started
    assert rc != 0 and 'canceling statement due to rule "cpu_time > 100ms: cancel" of resource group "watched"' in err, (rc, out, err)
    assert took < 5, f"cancelled after {took:.1f} s"
    rc, out, err = finish(other, timeout=120)
    assert rc == 0 and out == "1000000", (rc, out, err)
    h = hits(s, since)
    assert len(h) == 1 and h[0][:3] == ["cpu_time > 100ms: cancel", "cancel", "false"], h
    assert f"process {h[0][3]} in resource group \"watched\" met rule \"cpu_time > 100ms: cancel\"" in log_text(s)
    assert s.sql(f"SELECT rule_hits_total FROM pg_stride.groups WHERE name = '{GROUP}'") == "1"
    # The query id, as pg_stat_statements shows it: to the statement's role and to a
    # reader of all statistics, not to another ordinary role.
    query_id = f"SELECT coalesce(query_id::text, 'hidden') FROM pg_stride.rule_hits WHERE pid = {h[0][3]}"
    seen = {user: s.sql(query_id, user=user) for user in (APP, "postgres", OTHER)}
    assert seen[APP] == seen["postgres"] != "hidden" and seen[OTHER] == "hidden", seen
    # So are the CPU time it had used, when, in which group and by which rule, as
    # pg_stat_activity hides another role's times and state: the process stays.
    value = f"SELECT coalesce(value::text, 'hidden') FROM pg_stride.rule_hits WHERE pid = {h[0][3]}"
    values = {user: s.sql(value, user=user) for user in (APP, "postgres", OTHER)}
    assert values[APP] == values["postgres"] != "hidden" and values[OTHER] == "hidden", values
    assert int(values[APP]) > 100_000, values
    row = ("SELECT concat_ws('|', at IS NULL, \"group\", rule, action, dry_run) "
           f"FROM pg_stride.rule_hits WHERE pid = {h[0][3]}")
    rows = {user: s.sql(row, user=user) for user in (APP, OTHER)}
    assert rows == {APP: "f|watched|cpu_time > 100ms: cancel|cancel|f", OTHER: "t"}, rows
    explained = s.sql(f"EXPLAIN (VERBOSE, COSTS OFF) {LONG}", user=APP)
    assert f"Query Identifier: {seen[APP]}" in explained, (seen, explained)


@check
def a_rules_cancel_does_not_reach_the_sessions_next_statement(s):
    """A statement a rule cancels, in a transaction with an open cursor that goes on
    after a ROLLBACK TO: the cursor's MOVE that follows, longer than the worker's grace
    second and with yield points (a scan of rules_big), runs to its end. Twice: a
    cpu_time rule whose error the statement raises at its yield point; an elapsed rule
    on a scan that sleeps at its first row, which reaches no yield point and ends on its
    statement_timeout before the worker's query cancel; and one on pg_sleep, which has
    no yield points and gets the query cancel at once. Catches: the worker sending its
    query cancel a second after it asked though the statement had raised the rule's
    error, or had ended otherwise, or sending it again: it cancelled the MOVE."""
    sleeps_first = ("SELECT count(*) FROM rules_big "
                    "WHERE pg_sleep(CASE WHEN id = 1 THEN 3 ELSE 0 END) IS NOT NULL")
    cases = [("cpu_time > 100ms: cancel", LONG, "due to rule"),
             ("elapsed > 300ms: cancel",
              "SET LOCAL statement_timeout = '700ms';\n"
              f"SET LOCAL synchronize_seqscans = off;\n{sleeps_first}",
              "due to statement timeout"),
             ("elapsed > 300ms: cancel", "SELECT pg_sleep(3)", "due to user request")]
    try:
        for rules, sql, error in cases:
            set_rules(s, rules)
            script = ("\\set ON_ERROR_STOP 0\nBEGIN;\n"
                      "DECLARE c CURSOR FOR SELECT pg_sleep(0.01) FROM rules_big WHERE id <= 250;\n"
                      f"FETCH 1 FROM c;\nSAVEPOINT s;\n{sql};\nROLLBACK TO s;\n"
                      "MOVE ALL IN c;\nSELECT 'moved';\nCOMMIT;\n")
            since = now(s)
            out, errors = app_script(s, script)
            print(f"    {rules}: {errors}")
            assert len(errors) == 1 and error in errors[0], out.stderr
            assert out.stdout.split() == ["moved"], (out.stdout, out.stderr)
            assert [x[:2] for x in hits(s, since)] == [[rules, "cancel"]], hits(s, since)
    finally:
        set_rules(s, "")


@check
def a_paused_statement_raises_the_rules_own_error(s):
    """A statement of group rules_low (weight 1, priority 1) paused for a CPU slot that
    statements of rules_high (weight 10,000, priority 1,000,000) hold: an elapsed rule's cancel ends it
    with the rule's error while it waits, not with the query cancel that comes a second
    later. Catches: the pause loop, woken by the scheduler worker, waiting on for its
    slot without looking at the request."""
    rules = "elapsed > 1500ms: cancel"
    s.sql(f"SELECT pg_stride.alter_group('rules_low', rules => '{rules}')")
    s.wait_until("SELECT rules FROM pg_stride.groups WHERE name = 'rules_low'", rules)
    slots = int(s.sql("SELECT cpu_slots FROM pg_stride.scheduler"))
    highs = [s.client_as(HIGH, HIGH_LONG) for _ in range(slots)]
    state = ("SELECT coalesce(string_agg(a.state, ','), '') FROM pg_stride.activity a "
             f"JOIN pg_stat_activity p USING (pid) WHERE p.usename = '{LOW}'")
    try:
        s.wait_until("SELECT count(*) FROM pg_stride.activity a JOIN pg_stat_activity p "
                     f"USING (pid) WHERE p.usename = '{HIGH}' AND a.state = 'running'",
                     str(slots), timeout=30)
        since = now(s)
        low = s.client_as(LOW, HIGH_LONG)
        states = []
        while low.poll() is None:
            states.append(s.sql(state))
            time.sleep(0.05)
        rc, out, err = finish(low, timeout=60)
        print(f"    {(err.strip().splitlines() or [out])[0]}; states seen: {sorted(set(states))}")
        assert "paused" in states, states
        assert rc != 0 and f'canceling statement due to rule "{rules}"' in err, (rc, out, err)
        assert all(h.poll() is None for h in highs), "a high statement ended early: proved nothing"
        assert [x[:2] for x in hits(s, since, "rules_low")] == [[rules, "cancel"]]
    finally:
        for h in highs:
            h.kill()
            h.wait()
        s.sql("SELECT pg_stride.alter_group('rules_low', rules => '')")


@check
def a_rule_fires_once_for_a_cursor_that_took_its_admission_back(s):
    """A cursor of group watched (limit 1) that met an elapsed rule, idle between
    fetches, lends its admission to a statement of the group; its next FETCH queues to
    take it back until that statement ends. The rule does not fire again for it.
    Catches: the worker forgetting what fired for a statement while it was queued, so
    that the same rule logged and recorded a second hit once it ran again."""
    set_rules(s, "elapsed > 300ms: log")
    s.sql(f"SELECT pg_stride.alter_group('{GROUP}', max_concurrency => 1)")
    x = concurrency.Session(s, APP)
    try:
        since = now(s)
        x.run("BEGIN; DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 10) g", lines=0)
        assert x.run("FETCH 1 FROM c") == ["1"]
        pid = x.run("SELECT pg_backend_pid()")[0]
        s.wait_until(f"SELECT count(*) FROM pg_stride.rule_hits WHERE pid = {pid}", "1")
        other = s.client_as(APP, "SELECT pg_sleep(1.5)")
        s.wait_until(f"SELECT admission_lent FROM pg_stride.activity WHERE pid = {pid}", "t")
        assert x.run("FETCH 1 FROM c", timeout=30) == ["2"]
        rc, out, err = finish(other, timeout=30)
        assert rc == 0, (rc, out, err)
        # Well past the rule's threshold again, at several of the worker's sweeps.
        time.sleep(1.0)
        h = [r for r in hits(s, since) if r[3] == pid]
        print(f"    hits of the cursor: {len(h)}")
        assert len(h) == 1, h
        x.run("COMMIT", lines=0)
    finally:
        x.close()
        s.sql(f"SELECT pg_stride.alter_group('{GROUP}', max_concurrency => 0)")
        set_rules(s, "")


# Eight scans of rules_big (about 1 s of CPU) that write a row early in the first one,
# once they joined CPU scheduling.
WRITES_MIDWAY = ("SELECT count(*) FROM generate_series(1, 8) g, rules_big r "
                 "WHERE r.v >= 0 AND (g <> 1 OR r.id <> 50000 OR midway_note())")


@check
def a_statement_that_writes_midway_is_judged_by_its_cpu(s):
    # A statement that writes once its run has started keeps its slot at every slice
    # end from then on (rule 2), and each slice must still be charged to it, or a
    # cpu_time rule never sees it.
    s.sql("CREATE TABLE midway_notes (at timestamptz DEFAULT now()); "
          f"GRANT INSERT ON midway_notes TO {APP}; "
          "CREATE FUNCTION midway_note() RETURNS boolean LANGUAGE sql "
          "AS 'INSERT INTO midway_notes DEFAULT VALUES RETURNING true'")
    try:
        set_rules(s, "cpu_time > 300ms: cancel")
        since = now(s)
        rc, out, err = finish(s.client_as(APP, WRITES_MIDWAY), timeout=60)
        assert rc != 0 and 'canceling statement due to rule "cpu_time > 300ms: cancel"' in err, (rc, out, err)
        h = hits(s, since)
        assert len(h) == 1 and h[0][:2] == ["cpu_time > 300ms: cancel", "cancel"], h
    finally:
        s.sql("DROP FUNCTION midway_note(); DROP TABLE midway_notes")


@check
def a_statement_its_history_called_tiny_meets_the_rules_once_it_grew(s):
    # Catches: a statement whose fingerprint's history says it ends within half a
    # slice running unscheduled to its end however much it does this time, out of the
    # reach of cpu_time rules, which act at check-ins of scheduled statements. With
    # 20-ms slices for the role, SMALL (a few hundred index lookups, above the tiny
    # plan's bound of 500 cost units) uses a few ms: after three runs its class is tiny.
    # The same statement over every row (the same query identifier) uses LONG's CPU.
    small = LONG.replace("a.v >= 0", "a.id <= 300")
    grown = LONG.replace("a.v >= 0", "a.id <= 1000000")
    cost = float(s.sql(f"EXPLAIN (FORMAT JSON) {small}", user=APP)
                 .split('"Total Cost":')[1].split(",")[0])
    assert cost > 25 * 20, f"SMALL costs {cost}: a tiny plan at 20-ms slices"
    s.sql(f"ALTER ROLE {APP} SET pg_stride.slice = '20ms'")
    set_rules(s, "cpu_time > 100ms: cancel")
    try:
        for _ in range(3):
            rc, out, err = finish(s.client_as(APP, small), timeout=60)
            assert rc == 0 and out == "300", (rc, out, err)
        plan = s.sql(f"EXPLAIN (VERBOSE, COSTS OFF) {small}", user=APP)
        qid = plan.split("Query Identifier: ")[1].split()[0]
        cls = s.sql("SET pg_stride.slice = '20ms'; "
                    f"SELECT class FROM pg_stride.statements WHERE queryid = {qid}")
        since = now(s)
        rc, out, err = finish(s.client_as(APP, grown), timeout=120)
    finally:
        s.sql(f"ALTER ROLE {APP} RESET pg_stride.slice")
    assert cls == "tiny", cls
    assert rc != 0 and 'due to rule "cpu_time > 100ms: cancel"' in err, (rc, out, err)
    assert [h[0] for h in hits(s, since)] == ["cpu_time > 100ms: cancel"], hits(s, since)


@check
def a_dry_run_only_records_what_would_happen(s):
    set_rules(s, "cpu_time > 100ms: cancel", dry_run=True)
    since = now(s)
    rc, out, err = finish(s.client_as(APP, LONG), timeout=120)
    assert rc == 0 and out == "1000000", (rc, out, err)
    h = hits(s, since)
    assert len(h) == 1 and h[0][1:3] == ["cancel", "true"], h
    assert "would cancel it (rules_dry_run)" in log_text(s)


@check
def a_rule_met_in_a_dry_run_acts_once_the_dry_run_ends(s):
    # A DBA who saw "would cancel it" and turns the dry run off expects the statement
    # still running to be cancelled.
    set_rules(s, "elapsed > 300ms: cancel", dry_run=True)
    since = now(s)
    started = time.monotonic()
    sleeper = s.client_as(APP, "SELECT pg_sleep(20)")
    s.wait_until(f"SELECT count(*) FROM pg_stride.rule_hits WHERE \"group\" = '{GROUP}' "
                 f"AND at >= '{since}' AND dry_run", "1")
    s.sql(f"SELECT pg_stride.alter_group('{GROUP}', rules_dry_run => false)")
    rc, out, err = finish(sleeper, timeout=60)
    took = time.monotonic() - started
    assert rc != 0 and "canceling statement" in err, (rc, out, err)
    assert took < 10, f"cancelled after {took:.1f} s"
    assert [x[1:3] for x in hits(s, since)] == [["cancel", "true"], ["cancel", "false"]], \
        hits(s, since)


@check
def an_elapsed_rule_cancels_a_statement_that_reaches_no_yield_point(s):
    set_rules(s, "elapsed > 500ms: cancel")
    since = now(s)
    started = time.monotonic()
    rc, out, err = finish(s.client_as(APP, "SELECT pg_sleep(20)"), timeout=60)
    took = time.monotonic() - started
    assert rc != 0 and "57014" not in out and "canceling statement" in err, (rc, out, err)
    assert took < 5, f"cancelled after {took:.1f} s"
    assert [x[:2] for x in hits(s, since)] == [["elapsed > 500ms: cancel", "cancel"]]


def written_table(s):
    """rules_w: one row the app may update, its v back at 0."""
    s.sql("CREATE TABLE IF NOT EXISTS rules_w (id int PRIMARY KEY, v int); "
          "INSERT INTO rules_w VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET v = 0")
    s.sql(f"GRANT SELECT, UPDATE ON rules_w TO {APP}")


def cancelled_write(s, sql, rules="elapsed > 200ms: cancel"):
    """Runs `sql`, which writes rules_w, as the app under `rules`; checks that it was
    cancelled (the query cancel) by the rules' one hit, its writes undone, and returns
    its seconds."""
    written_table(s)
    set_rules(s, rules)
    try:
        since = now(s)
        started = time.monotonic()
        rc, out, err = finish(s.client_as(APP, sql), timeout=60)
        took = time.monotonic() - started
        print(f"       {took:.2f} s, {err.strip()}")
        assert rc != 0 and "canceling statement due to user request" in err, (rc, out, err, took)
        assert [x[:2] for x in hits(s, since)] == [[rules, "cancel"]], hits(s, since)
        assert s.sql("SELECT v FROM rules_w") == "0"
        return took
    finally:
        set_rules(s, "")


@check
def a_rule_cancels_a_cursors_fetch_after_a_write_beside_it_ended(s):
    """Fetch a batch, write, fetch on: the cursor's MOVE runs under the count of the
    UPDATE registered beside it, which has ended, and passes a rule. Twice: after an
    UPDATE that changes no row, a cpu_time rule (the MOVE keeps its yield points and
    raises the rule's error at one); after one that does, an elapsed rule (its
    transaction holds a row lock: the MOVE runs without yield points, which also keeps
    its CPU from the rules, and gets the query cancel after the grace second). Catches:
    the worker taking the UPDATE's end for the end of what it judged and withdrawing
    the cancel (the MOVE, seconds long, ran to its end)."""
    written_table(s)
    try:
        for rules, condition, error in [
                ("cpu_time > 100ms: cancel", "pg_sleep(0) IS NULL", 'due to rule "cpu_time > 100ms: cancel"'),
                ("elapsed > 300ms: cancel", "pg_sleep(0) IS NOT NULL", "due to user request")]:
            set_rules(s, rules)
            script = ("\\set ON_ERROR_STOP 0\nBEGIN;\n"
                      "DECLARE c CURSOR FOR SELECT g FROM rules_big, generate_series(1, 80) g "
                      "WHERE v >= 0;\nFETCH 1 FROM c;\n"
                      f"UPDATE rules_w SET v = v + 1 WHERE {condition};\n"
                      "\\timing on\nMOVE ALL IN c;\nROLLBACK;\n")
            since = now(s)
            out, errors = app_script(s, script, timeout=300)
            took = [float(t) for t in re.findall(r"Time: ([0-9.]+) ms", out.stdout)]
            print(f"    {rules}, UPDATE … WHERE {condition}: {errors}, MOVE {took[:1]} ms")
            assert len(errors) == 1 and error in errors[0], (out.stdout, out.stderr)
            assert took and took[0] < 4000, took
            assert [x[:2] for x in hits(s, since)] == [[rules, "cancel"]], hits(s, since)
    finally:
        set_rules(s, "")


@check
def closing_a_cursor_leaves_a_later_cursors_cancel_pending(s):
    """Two cursors; an elapsed rule meets the second while the session waits for its
    client (the query cancel sent then is ignored); the first is closed; the second's
    MOVE raises the rule's error at a yield point. Catches: closing the first cursor
    (the last statement of its DECLARE) forgetting the requests up to the latest count,
    the second cursor's included (the MOVE, seconds long, ran to its end)."""
    set_rules(s, "elapsed > 300ms: cancel")
    try:
        script = ("\\set ON_ERROR_STOP 0\nBEGIN;\n"
                  "DECLARE c1 CURSOR FOR SELECT id FROM rules_big;\n"
                  "DECLARE c2 CURSOR FOR SELECT g FROM rules_big, generate_series(1, 80) g "
                  "WHERE v >= 0;\nFETCH 1 FROM c2;\n\\! sleep 1.6\nCLOSE c1;\n"
                  "\\timing on\nMOVE ALL IN c2;\nROLLBACK;\n")
        since = now(s)
        out, errors = app_script(s, script, timeout=300)
        took = [float(t) for t in re.findall(r"Time: ([0-9.]+) ms", out.stdout)]
        print(f"    {errors}, MOVE {took[:1]} ms")
        assert len(errors) == 1 and 'due to rule "elapsed > 300ms: cancel"' in errors[0], \
            (out.stdout, out.stderr)
        assert took and took[0] < 4000, took
        assert [x[:2] for x in hits(s, since)] == [["elapsed > 300ms: cancel", "cancel"]], \
            hits(s, since)
    finally:
        set_rules(s, "")


@check
def an_elapsed_rule_cancels_a_write_that_ends_within_the_grace_second(s):
    """A write has no yield points: the rule's query cancel must not wait a second for
    one. Catches: an UPDATE of 0.8 s that met a 200 ms rule ran to its end, committed,
    with its hit recorded as a cancel."""
    took = cancelled_write(s, "UPDATE rules_w SET v = v + 1 WHERE pg_sleep(0.8) IS NOT NULL")
    assert took < 0.8, took


@check
def an_elapsed_rule_cancels_a_do_blocks_loop_of_short_writes(s):
    """Each UPDATE of the loop meets the rule and ends before the grace second, and the
    next one is a new statement. Catches: the loop ran its 8 UPDATEs to the end (about
    4 s), one hit recorded for each, none cancelled."""
    took = cancelled_write(s, "DO $$ BEGIN FOR i IN 1..8 LOOP UPDATE rules_w SET v = v + 1 "
                              "WHERE pg_sleep(0.5) IS NOT NULL; END LOOP; END $$")
    assert took < 1.5, took


@check
def an_elapsed_rule_times_each_statement_of_a_query_string_from_its_own_start(s):
    # Catches: a statement timed from the arrival of the client's message (PostgreSQL's
    # statement start), so that each statement, all well under 2.5 s, is charged with
    # the ones before it in the same query string.
    set_rules(s, "elapsed > 2500ms: log")
    since = now(s)
    sql = f"SELECT pg_sleep(1.5); SELECT pg_sleep(1.5); {LONG}"
    rc, out, err = finish(s.client_as(APP, sql), timeout=120)
    assert rc == 0 and out.splitlines()[-1] == "1000000", (rc, out, err)
    assert hits(s, since) == [], hits(s, since)


@check
def rows_and_temp_bytes_rules_log_once_per_statement(s):
    set_rules(s, "rows > 100000: log; temp_bytes > 1MB: log")
    since = now(s)
    # 1M rows to the client, then a sort that spills (work_mem 64 kB), twice.
    sql = ("SELECT id FROM rules_big WHERE v >= 0; SET work_mem = '64kB'; "
           "SELECT count(*) FROM (SELECT * FROM rules_big ORDER BY v DESC, id OFFSET 0) x; "
           "SELECT count(*) FROM (SELECT * FROM rules_big ORDER BY v DESC, id OFFSET 0) x")
    rc, out, err = finish(s.client_as(APP, sql), timeout=120)
    assert rc == 0 and out.splitlines()[-1] == "1000000", (rc, out[-200:], err)
    rules = [x[0] for x in hits(s, since)]
    assert rules.count("rows > 100000: log") == 1, rules
    assert rules.count("temp_bytes > 1MB: log") >= 2, rules


@check
def a_temp_bytes_rule_counts_files_in_other_tablespaces(s):
    """A sort that spills into a tablespace of temp_tablespaces (an in-place one, under
    pg_tblspc) meets a temp_bytes rule as one that spills into the default tablespace
    does. Catches: only base/pgsql_tmp read, so that the spills of a database whose
    default tablespace is another, or of temp_tablespaces, were never counted."""
    # Two commands of one session: CREATE TABLESPACE cannot run in the implicit
    # transaction of a multi-statement query string.
    out = s.run(*s.psql_args(None)[len(concurrency.AS_POSTGRES):], capture_output=True,
                text=True, input="SET allow_in_place_tablespaces = on;\n"
                                 "CREATE TABLESPACE rules_space LOCATION '';\n")
    assert out.returncode == 0, out.stderr
    try:
        s.sql(f"GRANT CREATE ON TABLESPACE rules_space TO {APP}")
        set_rules(s, "temp_bytes > 1MB: log")
        since = now(s)
        sql = ("SET temp_tablespaces = rules_space; SET work_mem = '64kB'; "
               "SELECT count(*) FROM (SELECT * FROM rules_big ORDER BY v DESC, id OFFSET 0) x")
        rc, out, err = finish(s.client_as(APP, sql), timeout=120)
        assert rc == 0 and out == "1000000", (rc, out, err)
        rules = [x[0] for x in hits(s, since)]
        print(f"    hits: {rules}")
        assert rules == ["temp_bytes > 1MB: log"], rules
    finally:
        set_rules(s, "")
        s.sql("DROP TABLESPACE IF EXISTS rules_space")


@check
def a_rows_rule_counts_every_fetch_of_a_cursor(s):
    # A driver's fetch size, or psql's FETCH_COUNT, reads a result through a cursor, one
    # ExecutorRun per batch: the rule counts the rows of all of them, not of the last.
    set_rules(s, "rows > 100000: log")
    since = now(s)
    session = concurrency.Session(s, user=APP)
    try:
        session.send("BEGIN; DECLARE c NO SCROLL CURSOR FOR SELECT id FROM rules_big "
                     "WHERE v >= 0; " + "MOVE 1000 IN c; " * 150)
        # The cursor stays open, its session idle in the transaction, with 150,000 rows
        # read in batches of 1,000.
        s.wait_until(f"SELECT count(*) FROM pg_stride.rule_hits WHERE \"group\" = '{GROUP}' "
                     f"AND at >= '{since}' AND rule = 'rows > 100000: log'", "1")
        pid = s.sql(f"SELECT pid FROM pg_stride.rule_hits WHERE at >= '{since}'")
        assert s.sql(f"SELECT usename FROM pg_stat_activity WHERE pid = {pid}") == APP
    finally:
        session.send("COMMIT")
        rc, out, err = session.close()
    assert rc == 0, (rc, out, err)


def worker_spills_kb(s):
    """Runs a sort that spills only in its two parallel workers (the leader takes no
    part), as the application role, under EXPLAIN ANALYZE; returns each worker's spill,
    kB, and when the run that had both workers began. The concurrency hint grants fewer
    workers for a while after a busy check: a run with one is done again, up to ten
    times, a second apart."""
    settings = ("SET max_parallel_workers_per_gather = 2; SET parallel_leader_participation = off; "
                "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET work_mem = '64kB'; ")
    sort = "SELECT count(*) FROM (SELECT * FROM rules_big ORDER BY v DESC, id OFFSET 0) x"
    for attempt in range(10):
        since = now(s)
        rc, out, err = finish(s.client_as(
            APP, settings + "EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF) " + sort), timeout=120)
        assert rc == 0 and "Gather Merge" in out, (rc, out, err)
        if "Workers Launched: 2" in out:
            break
        time.sleep(1)
    # One "Sort Method" line per worker; none for the leader, which ran no part.
    spills = [int(m) for m in re.findall(r"Sort Method: external merge\s+Disk: (\d+)kB", out)]
    assert len(spills) == 2 and "Workers Launched: 2" in out, out
    return spills, since


@check
def a_temp_bytes_rule_counts_the_parallel_workers_spills(s):
    """A sort that spills only in its two parallel workers: the rule's threshold lies
    between one worker's spill and both workers' together, and it hits the statement."""
    set_rules(s, "")
    one, other = sorted(worker_spills_kb(s)[0])
    threshold = other + one // 2
    threshold += threshold % 1024 == 0  # shown in kB, as written, not in MB
    set_rules(s, f"temp_bytes > {threshold}kB: log")
    # The hits of the run with both workers only: one that had one worker spills all.
    _, since = worker_spills_kb(s)
    rules = [x[0] for x in hits(s, since)]
    assert len(rules) == 1 and rules[0].startswith("temp_bytes > "), (rules, one, other)
    print(f"       workers spilled {one} and {other} kB; the rule at {threshold} kB hit")


def cpu_split(samples, first, until):
    """The share of the CPU charged to the watched statement's group (`first` of each
    sample's totals) against the other statement's (`default`), from the sample where
    `first` is the watched statement's group until the other statement ended (`until`,
    seconds after the race started), and the other's CPU in that window (ms).
    `samples`: (seconds after the race started, {group: cpu_time_ms}, the watched
    statement's group and CPU group)."""
    window = [(t, cpu) for t, cpu, where in samples if t < until]
    start = next((i for i, (_, _, where) in enumerate(samples) if where == first), None)
    window = window[start:] if start is not None else []
    if len(window) < 2:
        return None, 0.0
    watched = window[-1][1][first.split()[-1]] - window[0][1][first.split()[-1]]
    other = window[-1][1]["default"] - window[0][1]["default"]
    return watched / max(watched + other, 1e-9), other


@check
def a_move_rule_gives_the_statement_its_new_groups_weight(s):
    # With one slot, a statement moved to a group of weight 1 gets about 1 % of the CPU
    # beside the other statement's group of weight 100, where it had half before the
    # move: the share each gets after the move tells the two apart. (Finish times do
    # not: the CPU used before the move, and any wait for the first slot, weigh in
    # them.)
    set_server(s, "pg_stride.cpu_slots", 1)
    s.sql("SELECT pg_stride.create_group('slow', weight => 1)")
    cpu = ("SELECT string_agg(name || '=' || cpu_time_ms, ' ') FROM pg_stride.groups "
           f"WHERE name IN ('default', '{GROUP}', 'slow')")
    where = (f"SELECT \"group\" || ' ' || coalesce(cpu_group, '-') "
             f"FROM pg_stride.activity WHERE usename = '{APP}'")

    def sampled_race(on_sample=lambda _: None):
        samples = []
        started = time.monotonic()

        def watch():
            totals = {k: float(v) for k, v in (x.split("=") for x in s.sql(cpu).split())}
            samples.append((time.monotonic() - started, totals, s.sql(where)))
            on_sample(samples[-1][2])
        return race(s, watch), samples

    try:
        # Equal weights first, as the reference: they share the slot.
        set_rules(s, "")
        same, same_samples = sampled_race()
        same_share, _ = cpu_split(same_samples, "watched watched", same[1])
        set_rules(s, "cpu_time > 200ms: move slow")
        since = now(s)
        drops = []

        def drop_while_in_use(seen):
            # The group a statement was moved to is in use while it runs there.
            if seen == "watched slow" and not drops:
                try:
                    drops.append(s.sql("SELECT pg_stride.drop_group('slow')"))
                except RuntimeError as e:
                    drops.append(str(e))
        moved, samples = sampled_race(drop_while_in_use)
        assert any(x[2] == "watched slow" for x in samples), [x[2] for x in samples]
        # Each group's CPU total only grows (Prometheus reads a drop as a reset); the
        # CPU used before the move (over 200 ms, less what was charged before the first
        # sample) stays with the group the statement left.
        totals = [x[1] for x in samples]
        for before, after in zip(totals, totals[1:]):
            assert all(after[g] >= before[g] for g in before), (before, after)
        assert totals[-1][GROUP] - totals[0][GROUP] >= 150, totals
        assert totals[-1]["slow"] > totals[0]["slow"], totals
        assert len(drops) == 1 and 'resource group "slow" is in use' in drops[0], drops
        h = hits(s, since)
        assert [x[:2] for x in h] == [["cpu_time > 200ms: move slow", "move"]], h
        assert 'moves it to resource group "slow"' in log_text(s)
        share, other_ms = cpu_split(samples, "watched slow", moved[1])
        print(f"       the watched statement's share of the CPU while both ran: equal weights "
              f"{same_share:.0%}; moved to weight 1 {share:.0%} (the other used {other_ms:.0f} ms "
              f"meanwhile); finished at (watched, other): equal weights {same[0]:.1f} s, "
              f"{same[1]:.1f} s, moved {moved[0]:.1f} s, {moved[1]:.1f} s")
        # The reference only shows that the measure sees both statements run.
        assert same_share is not None and 0.1 <= same_share <= 0.9, (same_share, same)
        assert other_ms >= 100, (other_ms, moved)
        assert share <= 0.2, (share, moved)
    finally:
        set_rules(s, "")
        set_server(s, "pg_stride.cpu_slots", None)
        s.sql("SELECT pg_stride.drop_group('slow')")


@check
def a_move_that_never_took_place_does_not_hold_its_target_group(s):
    """A parallel statement whose leader takes no part in the scan never reaches a
    check-in of its own, so a move rule it met cannot move it. The move asked stays
    unserved when it ends; the next statement of the session must not count as being in
    the target group: dropping that group while it runs succeeds."""
    s.sql("SELECT pg_stride.create_group('batch')")
    settings = ("SET max_parallel_workers_per_gather = 2; SET parallel_leader_participation = off; "
                "SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; ")
    try:
        set_rules(s, "cpu_time > 100ms: move batch")
        # The concurrency hint grants fewer workers for a while after a busy check: a
        # run without both workers is done again, up to ten times, a second apart.
        batch_cpu = "SELECT cpu_time_ms FROM pg_stride.groups WHERE name = 'batch'"
        for attempt in range(10):
            since = now(s)
            batch_before = float(s.sql(batch_cpu))
            name = f"unmoved_{attempt}"
            client = s.client_as(APP, f"SET application_name = '{name}'; {settings}"
                                 f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {LONG}; "
                                 "SELECT pg_sleep(3)")
            concurrency.wait_until_sleeping(s, name)
            moves = [x for x in hits(s, since) if x[1] == "move"]
            # The move was asked and never made: no CPU was charged to the group.
            moves = moves if float(s.sql(batch_cpu)) == batch_before else []
            if moves:
                dropped = s.sql("SELECT pg_stride.drop_group('batch')")
            rc, out, err = finish(client, timeout=120)
            assert rc == 0, (rc, out, err)
            if "Workers Launched: 2" in out and moves:
                break
            if moves:
                s.sql("SELECT pg_stride.create_group('batch')")
            time.sleep(1)
        assert "Workers Launched: 2" in out and moves, (out, moves)
        assert dropped == "", dropped
    finally:
        set_rules(s, "")
        if s.sql("SELECT count(*) FROM pg_stride.resource_groups WHERE name = 'batch'") == "1":
            s.sql("SELECT pg_stride.drop_group('batch')")


def beside_a_cursor(s, sql, expected):
    """Runs `sql` (giving the `expected` lines) in a session while a cursor of it that
    met a cpu_time rule is open; returns the rule's hits while `sql` ran."""
    set_rules(s, "cpu_time > 100ms: log")
    x = concurrency.Session(s, APP)
    try:
        start = now(s)
        x.run(f"BEGIN; DECLARE c CURSOR FOR {LONG}", lines=0)
        assert x.run("FETCH c") == ["1000000"]
        # The scheduler worker sweeps every 100 ms: the cursor's hit is in by now.
        time.sleep(0.5)
        cursor = hits(s, start)
        assert [x[:2] for x in cursor] == [["cpu_time > 100ms: log", "log"]], cursor
        since = now(s)
        out = x.run(sql, lines=len(expected))
        assert out == expected, out
        beside = hits(s, since)
        x.run("COMMIT", lines=0)
        return beside
    finally:
        x.close()
        set_rules(s, "")


@check
def a_statement_beside_an_open_cursor_is_judged_by_its_own_cpu(s):
    """A statement run while a cursor of its session is open shares the cursor's query
    entry: a cpu_time rule must judge it by the CPU used since it began, not by the
    cursor's, which met the rule already."""
    beside = beside_a_cursor(s, "SELECT pg_sleep(1)", [""])
    assert beside == [], beside


def mid_table(s):
    """rules_mid: 20,000 rows the app may read."""
    s.sql("CREATE TABLE IF NOT EXISTS rules_mid AS SELECT g AS id, g % 100 AS v "
          "FROM generate_series(1, 20000) g")
    s.sql(f"GRANT SELECT ON rules_mid TO {APP}")


@check
def a_do_block_run_beside_an_open_cursor_is_judged_by_its_own_cpu(s):
    """A DO block's loop run while a cursor is open shares the cursor's query entry;
    its body statements are judged with the loop, from the loop's start: the cursor's
    CPU, past the rule already, does not count for them."""
    mid_table(s)
    # About 0.4 s, little CPU: the scheduler worker's sweeps see its statements.
    beside = beside_a_cursor(
        s, "DO $$ DECLARE r record; BEGIN "
        "FOR r IN SELECT id FROM rules_mid WHERE id <= 40 LOOP "
        "PERFORM 1 FROM rules_mid WHERE id = r.id LIMIT 1; PERFORM pg_sleep(0.01); "
        "END LOOP; END $$; SELECT 'done'", ["done"])
    assert beside == [], beside


@check
def a_do_blocks_loop_is_judged_by_the_cpu_of_its_whole_run(s):
    """The statements of a DO block's loop body share the process's query entry with
    the loop's query (a scan of a million rows, fetched ten rows at a time), each one
    short: a cpu_time rule judges them with the loop, whose whole run passes the
    threshold (judged each by its own CPU, none would)."""
    mid_table(s)
    set_rules(s, "cpu_time > 150ms: log")
    try:
        since = now(s)
        rc, out, err = finish(s.client_as(APP, """DO $$
            DECLARE r record; n bigint;
            BEGIN
              FOR r IN SELECT id FROM rules_big WHERE v = 7 LOOP
                SELECT count(*) INTO n FROM rules_mid WHERE v = r.id % 100;
              END LOOP;
            END $$"""), timeout=300)
        assert rc == 0, (rc, out, err)
        time.sleep(0.3)
        h = [x[:2] for x in hits(s, since)]
        # Each body statement that a sweep sees past the threshold is a statement
        # that met the rule.
        assert h and all(x == ["cpu_time > 150ms: log", "log"] for x in h), h
        print(f"       {len(h)} hits over the loop's body statements")
    finally:
        set_rules(s, "")


def race(s, watch=lambda: None):
    """Starts RACE in the app's group and in another together; returns when each
    finished, in seconds from the start."""
    started = time.monotonic()
    clients = [s.client_as(APP, RACE), s.client_as(OTHER, RACE)]
    ends = [None, None]
    while None in ends:
        watch()
        for i, c in enumerate(clients):
            if ends[i] is None and c.poll() is not None:
                ends[i] = time.monotonic() - started
                rc, out, err = finish(c)
                assert rc == 0 and out == "1000000", (rc, out, err)
        time.sleep(0.01)
    return ends


def setup(s):
    s.sql(f"CREATE ROLE {APP} LOGIN; CREATE ROLE {OTHER} LOGIN; CREATE EXTENSION pg_stride")
    s.sql(f"SELECT pg_stride.create_group('{GROUP}')")
    s.sql(f"ALTER ROLE {APP} SET pg_stride.resource_group = '{GROUP}'")
    s.sql(f"ALTER ROLE {APP} SET max_parallel_workers_per_gather = 0")
    s.sql(f"ALTER ROLE {APP} SET compute_query_id = on")
    s.sql(f"ALTER ROLE {OTHER} SET max_parallel_workers_per_gather = 0")
    s.sql(f"CREATE ROLE {HIGH} LOGIN")
    s.sql("SELECT pg_stride.create_group('rules_high', weight => 10000, "
          "priority_initial => 1000000, pinned => true)")
    s.sql(f"ALTER ROLE {HIGH} SET pg_stride.resource_group = 'rules_high'")
    s.sql(f"ALTER ROLE {HIGH} SET max_parallel_workers_per_gather = 0")
    s.sql(f"CREATE ROLE {LOW} LOGIN")
    s.sql("SELECT pg_stride.create_group('rules_low', weight => 1, priority_initial => 1, "
          "priority_min => 1, pinned => true)")
    s.sql(f"ALTER ROLE {LOW} SET pg_stride.resource_group = 'rules_low'")
    s.sql(f"ALTER ROLE {LOW} SET max_parallel_workers_per_gather = 0")
    s.sql("CREATE TABLE rules_big (id int PRIMARY KEY, v int); "
          "INSERT INTO rules_big SELECT g, g % 1000 FROM generate_series(1, 1000000) g; ANALYZE rules_big")
    s.sql(f"GRANT SELECT ON rules_big TO {APP}, {OTHER}, {HIGH}, {LOW}")


def main():
    return concurrency.run_suite("rules", Server(port=PORT), CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
