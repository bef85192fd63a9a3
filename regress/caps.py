#!/usr/bin/env python3
"""Caps that hold (docs/design.md §4 rule 12): a group's max_concurrency is crossed only
to break a cycle of waits, and each crossing is counted in pg_stride.groups.

Every check runs real sessions of an ordinary login role assigned to a group with
max_concurrency = 1 (ALTER ROLE … SET pg_stride.resource_group), while a sampler
session counts, every 100 ms, the role's statements that run: admitted by pg_stride
(running or paused in pg_stride.activity), active in pg_stat_activity and not waiting on
a heavyweight lock.

- advisory locks: one session holds a lock while four others' statements need it; the
  holder's last statement needs the group's only admission, held by the first waiter
  (a wait cycle, so it is admitted beyond the limit and counted), and the four then
  run one at a time;
- row locks: the same with a row the holder locked FOR UPDATE in its transaction and the
  others want FOR SHARE (so that, once it commits, all of them could run at once);
- a lock wait that only a client can end (its holder idle in its transaction) lends
  its admission, counted, so that a statement queued behind it gets in;
- a cursor whose admission was lent while its client was idle comes back through the
  queue: its FETCH waits for the statement that took the admission, unless that
  statement waits on a lock the cursor's transaction holds (a cycle: it comes back at
  once, counted);
- a COPY whose admission was lent while its client did not read comes back at its next
  yield point, through the queue; the same COPY without yield points (its transaction
  wrote) keeps its admission while its client does not read.

Prints one line per check, then "caps: N passed, N failed".
"""

import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import ENV, Session, finish  # noqa: E402

PORT = int(os.environ.get("CAPS_PORT", "5514"))
APP = "regress_caps_app"
GROUP = "capped"
# Admitted statements only: pg_stride.activity lists a statement once it is registered,
# and queued ones as such; one between its start and its place in the queue (parsing,
# planning, arriving) is in neither, and is not running its plan yet.
RUNNING = f"""SELECT count(*) FROM pg_stat_activity a JOIN pg_stride.activity s USING (pid)
 WHERE a.usename = '{APP}' AND a.state = 'active' AND a.wait_event_type IS DISTINCT FROM 'Lock'
   AND s.state IN ('running', 'paused')"""
SAMPLE_EVERY = 0.1


class Sampler:
    """Counts the app role's running statements every SAMPLE_EVERY seconds, in a
    session of its own, until stopped; `most` is the largest count seen."""

    def __init__(self, s):
        self.session = Session(s)
        self.most = 0
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop)
        self.thread.start()

    def loop(self):
        while not self.stopping.is_set():
            n = int(self.session.run(RUNNING)[0])
            self.most = max(self.most, n)
            self.samples += 1
            time.sleep(SAMPLE_EVERY)

    def stop(self):
        self.stopping.set()
        self.thread.join()
        self.session.close()
        return self.most


def app_client(s, sql):
    """Starts, in the background, a session of the app role (group `capped`)."""
    return subprocess.Popen(s.psql_args(sql, user=APP), env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def first_pid(s, sql, never, timeout=10):
    """The pid `sql` returns, polled until it returns one; fails the check with `never`
    if it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (pid := s.sql(sql)):
        assert time.monotonic() < deadline, never
        time.sleep(0.05)
    return pid


def over_limit(s):
    return int(s.sql(f"SELECT over_limit_total FROM pg_stride.groups WHERE name = '{GROUP}'"))


def active_app_statements(s):
    return f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' AND state = 'active'"


def waiters_finish_one_at_a_time(s, holder_sql, holder_lines, lock_sql, hold_s, each_s, n=4):
    """An app session runs `holder_sql` (it takes a lock, works `hold_s` s, then needs
    another admission before it lets the lock go); after 0.5 s, `n` app clients each
    run `lock_sql` (which needs the lock, then works `each_s` s). The holder's
    statements print `holder_lines` lines. Checks that at most one statement ran at any
    sample, that the holder was not held up, and that the clients ended one after the
    other."""
    sampler = Sampler(s)
    holder = Session(s, user=APP)
    try:
        started = time.monotonic()
        holder.send(holder_sql)
        time.sleep(0.5)
        clients = [app_client(s, lock_sql) for _ in range(n)]
        out = holder.run("\\echo done", lines=holder_lines + 1, timeout=hold_s + n * each_s + 20)
        assert out[-1].startswith("done"), out
        holder_took = time.monotonic() - started
        ends = {}
        deadline = time.monotonic() + hold_s + n * each_s + 20
        while len(ends) < n:
            assert time.monotonic() < deadline, f"{n - len(ends)} clients still running"
            for i, c in enumerate(clients):
                if i not in ends and c.poll() is not None:
                    ends[i] = time.monotonic() - started
            time.sleep(0.02)
        for c in clients:
            rc, out, err = finish(c)
            assert rc == 0, (rc, out, err)
    finally:
        holder.close()
        most = sampler.stop()
    ends = sorted(ends.values())
    print(f"       most running at once {most}; the holder took {holder_took:.2f} s; "
          "waiters ended at " + ", ".join(f"{e:.1f}" for e in ends) + " s")
    assert most == 1, f"{most} statements of a group capped at 1 ran at once"
    # The holder's last statement needed the admission that the first waiter on its lock
    # held: a cycle, so it got in beyond the limit (counted), soon (the watchdog looks
    # every 100 ms). Left in the cycle, it would wait for every waiter: at least
    # hold_s + n * each_s, three seconds and more past hold_s in both uses.
    assert holder_took < hold_s + 2.0, f"the lock holder took {holder_took:.2f} s"
    # One at a time after the holder's time: the k-th ends by hold_s + k * each_s s,
    # each hand-off allowed half a second of a busy machine's delays.
    for k, end in enumerate(ends, start=1):
        assert end < hold_s + k * each_s + 1.0 + 0.5 * k, (k, end)


CHECKS = []
check = concurrency.collector(CHECKS)


@check
def a_group_cap_holds_while_statements_wait_on_an_advisory_lock(s):
    before = over_limit(s)
    waiters_finish_one_at_a_time(
        s, "SELECT pg_advisory_lock(1) IS NOT NULL; SELECT pg_sleep(3); "
        "SELECT pg_advisory_unlock(1)", 3,
        "SELECT pg_advisory_lock_shared(1) IS NOT NULL, pg_sleep(2)", hold_s=3, each_s=2)
    assert over_limit(s) - before == 1, over_limit(s) - before
    s.wait_until(f"SELECT active || ' ' || queued FROM pg_stride.groups WHERE name = '{GROUP}'", "0 0")


@check
def a_group_cap_holds_while_statements_wait_on_a_row_lock(s):
    # A row the holder locked FOR UPDATE, which the others want FOR SHARE: once it
    # commits, all of them could run at once.
    before = over_limit(s)
    waiters_finish_one_at_a_time(
        s, "BEGIN; SELECT n FROM caps_rows WHERE id = 1 FOR UPDATE; SELECT pg_sleep(2); "
        "SELECT 'last'; COMMIT", 3,
        "SELECT pg_sleep(1) IS NOT NULL FROM (SELECT id FROM caps_rows WHERE id = 1 FOR SHARE) locked",
        hold_s=2, each_s=1, n=3)
    assert over_limit(s) - before == 1, over_limit(s) - before


@check
def a_lock_wait_that_only_a_client_can_end_lends_its_admission(s):
    # The holder is idle in its transaction: its client may be waiting for a statement
    # queued behind the one waiting on its lock (as isolationtester does). That waiter
    # lends its admission, counted as a crossing.
    before = over_limit(s)
    holder = Session(s, user=APP)
    try:
        holder.run("BEGIN; SELECT n FROM caps_rows WHERE id = 1 FOR UPDATE")
        waiter = app_client(s, "UPDATE caps_rows SET n = n + 1 WHERE id = 1")
        s.wait_until(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' "
                     "AND wait_event_type = 'Lock'", "1")
        started = time.monotonic()
        rc, out, err = finish(app_client(s, "SELECT 'admitted'"), timeout=10)
        took = time.monotonic() - started
        assert (rc, out) == (0, "admitted"), (rc, out, err)
        assert waiter.poll() is None, "the waiter did not wait for the lock"
        holder.run("COMMIT; \\echo committed")
        assert finish(waiter)[0] == 0
    finally:
        holder.close()
    print(f"       the queued statement got in after {took:.2f} s")
    assert took < 2, f"the queued statement waited {took:.2f} s"
    assert over_limit(s) - before == 1, over_limit(s) - before


def fetch_after_lending(s, cursor, other_sql, other_waits):
    """`cursor` (an app session) has opened cursor c in its transaction (CURSOR) and
    fetched once; once its admission is lent (its client idle), another
    app client runs `other_sql`; once `other_waits` (a pg_stat_activity condition on it)
    holds, the cursor fetches again. Returns that client and the FETCH's time."""
    s.wait_until(f"SELECT count(*) FROM pg_stride.activity WHERE usename = '{APP}' AND admission_lent",
                 "1")
    other = app_client(s, other_sql)
    s.wait_until(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' AND {other_waits}", "1")
    started = time.monotonic()
    assert cursor.run("FETCH 1 FROM c", timeout=10) == ["2"]
    return other, time.monotonic() - started


CURSOR = "DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g; FETCH 1 FROM c"


@check
def a_lent_cursor_comes_back_through_the_queue(s):
    before = over_limit(s)
    cursor = Session(s, user=APP)
    try:
        cursor.run(f"BEGIN; {CURSOR}")
        other, waited = fetch_after_lending(s, cursor, "SELECT pg_sleep(2)", "wait_event = 'PgSleep'")
        assert finish(other)[0] == 0
        cursor.run("CLOSE c; COMMIT; \\echo closed")
    finally:
        cursor.close()
    print(f"       the FETCH waited {waited:.2f} s for the statement that had the admission")
    assert waited > 1.2, f"the cursor came back beyond the limit after {waited:.2f} s"
    assert over_limit(s) == before


@check
def a_lent_cursor_whose_lock_is_awaited_comes_back_at_once(s):
    before = over_limit(s)
    cursor = Session(s, user=APP)
    try:
        cursor.run(f"BEGIN; UPDATE caps_rows SET n = n + 1 WHERE id = 2; {CURSOR}")
        other, waited = fetch_after_lending(s, cursor, "UPDATE caps_rows SET n = n + 1 WHERE id = 2",
                                            "wait_event_type = 'Lock'")
        cursor.run("COMMIT; \\echo committed")
        assert finish(other)[0] == 0
    finally:
        cursor.close()
    print(f"       the FETCH waited {waited:.2f} s")
    assert waited < 1.5, f"the cursor waited {waited:.2f} s for a statement that waited for it"
    assert over_limit(s) - before == 1, over_limit(s) - before


@check
def a_statement_lent_while_its_client_does_not_read_comes_back_at_a_yield_point(s):
    # COPY of a large result to a client that stops reading: the backend waits to write
    # (ClientWrite) in the middle of its scan and its admission is lent; another
    # statement takes it. Once the client reads again the scan goes on to its next yield
    # point, where it queues until that statement ends.
    copy = subprocess.Popen(s.psql_args("COPY (SELECT id FROM caps_big) TO STDOUT", user=APP),
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid = first_pid(s, f"SELECT pid FROM pg_stride.activity WHERE usename = '{APP}' "
                        "AND admission_lent AND query LIKE 'COPY%'", "the COPY's admission was never lent")
        other = app_client(s, "SELECT pg_sleep(2)")
        s.wait_until(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' "
                     "AND wait_event = 'PgSleep'", "1")
        started = time.monotonic()
        drained = threading.Thread(target=copy.stdout.read)
        drained.start()
        s.wait_until(f"SELECT state FROM pg_stride.activity WHERE pid = {pid}", "queued", timeout=3)
        drained.join(timeout=20)
        assert copy.wait(timeout=20) == 0, copy.stderr.read()
        took = time.monotonic() - started
        assert finish(other)[0] == 0
    finally:
        copy.kill()
    print(f"       the COPY ended {took:.2f} s after its client read again")
    assert took > 1.2, f"the COPY came back beyond the limit ({took:.2f} s)"


@check
def a_statement_without_yield_points_keeps_its_admission_while_its_client_does_not_read(s):
    # The same COPY in a transaction that wrote has no yield points (rule 2): lent while
    # it waits to write, it would go on beyond the limit up to its end once its client
    # reads again. It keeps its admission, and the group's next statement waits for it.
    copy = subprocess.Popen(s.psql_args("BEGIN; UPDATE caps_rows SET n = n + 1 WHERE id = 2; "
                                        "COPY (SELECT id FROM caps_big) TO STDOUT; COMMIT", user=APP),
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    other = None
    try:
        pid = first_pid(s, f"SELECT pid FROM pg_stat_activity WHERE usename = '{APP}' "
                        "AND wait_event = 'ClientWrite' AND query LIKE '%COPY%'",
                        "the COPY never waited for its client")
        # The watchdog looks every 20 ms and lends at the second look.
        time.sleep(0.5)
        other = app_client(s, "SELECT 'ran'")
        s.wait_until(f"SELECT state FROM pg_stride.activity WHERE usename = '{APP}' "
                     "AND query = 'SELECT ''ran'''", "queued")
        time.sleep(0.5)
        assert s.sql(f"SELECT admission_lent FROM pg_stride.activity WHERE pid = {pid}") == "f"
        assert other.poll() is None, finish(other)
        drained = threading.Thread(target=copy.stdout.read)
        drained.start()
        assert copy.wait(timeout=30) == 0, copy.stderr.read()
        drained.join(timeout=20)
        rc, out, err = finish(other)
        assert rc == 0 and out == "ran", (rc, out, err)
    finally:
        copy.kill()
        if other is not None:
            other.kill()


def setup(s):
    s.sql(f"CREATE ROLE {APP} LOGIN; CREATE EXTENSION pg_stride; GRANT USAGE ON SCHEMA pg_stride TO {APP}")
    s.sql(f"SELECT pg_stride.create_group('{GROUP}', max_concurrency => 1)")
    s.sql(f"ALTER ROLE {APP} SET pg_stride.resource_group = '{GROUP}'")
    # Its CHECK constraint keeps its updates from being too small to admit: they are
    # admitted, and one waiting on a row lock holds an admission.
    s.sql("CREATE TABLE caps_rows (id int PRIMARY KEY, n int CHECK (n >= 0)); "
          "INSERT INTO caps_rows VALUES (1, 0), (2, 0)")
    s.sql("CREATE TABLE caps_big (id int); INSERT INTO caps_big SELECT generate_series(1, 1000000)")
    s.sql(f"GRANT SELECT, UPDATE ON caps_rows TO {APP}; GRANT SELECT ON caps_big TO {APP}")


def main():
    return concurrency.run_suite("caps", concurrency.Server(port=PORT), CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
