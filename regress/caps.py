#!/usr/bin/env python3
"""Caps that hold (docs/design.md §4 rule 12): a group's max_concurrency is crossed only
to break a cycle of waits, and each crossing is counted in pg_stride.groups.

Every check runs real sessions of an ordinary login role assigned to a group with
max_concurrency = 1 (ALTER ROLE … SET pg_stride.resource_group), while a sampler
session counts, every 100 ms, the role's statements that run: active in
pg_stat_activity, neither waiting on a heavyweight lock nor queued by pg_stride.

- advisory locks: one session holds a lock while four others' statements need it; the
  holder's next statements need the group's only admission (a wait cycle, so they are
  admitted beyond the limit and counted), and the four then run one at a time;
- row locks: the same with a row the holder locked FOR UPDATE in its transaction and the
  others want FOR SHARE (so that, once it commits, all of them could run at once);
- a cursor whose admission was lent while its client was idle comes back through the
  queue: its FETCH waits for the statement that took the admission, unless that
  statement waits on a lock the cursor's transaction holds (a cycle: it comes back at
  once, counted);
- a COPY whose admission was lent while its client did not read comes back at its next
  yield point, through the queue.

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
RUNNING = f"""SELECT count(*) FROM pg_stat_activity a LEFT JOIN pg_stride.activity s USING (pid)
 WHERE a.usename = '{APP}' AND a.state = 'active' AND a.wait_event_type IS DISTINCT FROM 'Lock'
   AND s.state IS DISTINCT FROM 'queued'"""
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


def over_limit(s):
    return int(s.sql(f"SELECT over_limit_total FROM pg_stride.groups WHERE name = '{GROUP}'"))


def active_app_statements(s):
    return f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' AND state = 'active'"


def waiters_finish_one_at_a_time(s, holder, lock_sql, holder_next, unlock_sql, hold_s, each_s, n=4):
    """`holder` (an app session) has taken a lock; `n` app clients each run
    `lock_sql` (which needs the lock, then works `each_s` s). The holder then runs
    `holder_next` (`hold_s` s) and `unlock_sql`. Returns the most statements seen
    running at once, the holder's wait for each of its statements, and each client's
    end (s after the holder's next statement was sent)."""
    sampler = Sampler(s)
    try:
        clients = [app_client(s, lock_sql) for _ in range(n)]
        s.wait_until(active_app_statements(s), str(n))
        time.sleep(0.3)  # past the watchdog rounds that decide whether to lend
        started = time.monotonic()
        holder.run(holder_next, timeout=hold_s + 10)
        next_took = time.monotonic() - started - hold_s
        t = time.monotonic()
        holder.run(unlock_sql, timeout=10)
        unlock_took = time.monotonic() - t
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
        most = sampler.stop()
    return most, (next_took, unlock_took), list(ends.values())


CHECKS = []
check = concurrency.collector(CHECKS)


@check
def a_group_cap_holds_while_statements_wait_on_an_advisory_lock(s):
    before = over_limit(s)
    holder = Session(s, user=APP)
    try:
        assert holder.run("SELECT pg_advisory_lock(1) IS NOT NULL") == ["t"]
        most, (next_took, unlock_took), ends = waiters_finish_one_at_a_time(
            s, holder, "SELECT pg_advisory_lock_shared(1) IS NOT NULL, pg_sleep(2)",
            "SELECT pg_sleep(3)", "SELECT pg_advisory_unlock(1)", hold_s=3, each_s=2)
    finally:
        holder.close()
    print(f"       most running at once {most}; holder's statements waited "
          f"{next_took:.2f} s and {unlock_took:.2f} s; waiters ended at "
          + ", ".join(f"{e:.1f}" for e in sorted(ends)) + " s")
    assert most == 1, f"{most} statements of a group capped at 1 ran at once"
    # The holder's two statements each needed the admission that a waiter on its lock
    # held: each was admitted beyond the limit, soon (the watchdog looks every 100 ms).
    assert next_took < 1.5 and unlock_took < 1.5, (next_took, unlock_took)
    assert over_limit(s) - before == 2, over_limit(s) - before
    # One at a time after the holder's 3 s: the k-th ends by 3 + 2k s, plus slack.
    for k, end in enumerate(sorted(ends), start=1):
        assert end < 3 + 2 * k + 1.5, (k, end)
    s.wait_until(f"SELECT active || ' ' || queued FROM pg_stride.groups WHERE name = '{GROUP}'", "0 0")


@check
def a_group_cap_holds_while_statements_wait_on_a_row_lock(s):
    before = over_limit(s)
    holder = Session(s, user=APP)
    try:
        holder.run("BEGIN; SELECT n FROM caps_rows WHERE id = 1 FOR UPDATE")
        most, _, ends = waiters_finish_one_at_a_time(
            s, holder, "SELECT pg_sleep(1) IS NOT NULL FROM "
            "(SELECT id FROM caps_rows WHERE id = 1 FOR SHARE) locked",
            # psql's \echo: a statement after COMMIT would queue behind the waiters.
            "SELECT pg_sleep(1)", "COMMIT; \\echo committed", hold_s=1, each_s=1, n=3)
    finally:
        holder.close()
    print(f"       most running at once {most}; waiters ended at "
          + ", ".join(f"{e:.1f}" for e in sorted(ends)) + " s")
    assert most == 1, f"{most} statements of a group capped at 1 ran at once"
    assert over_limit(s) - before == 1, over_limit(s) - before
    for k, end in enumerate(sorted(ends), start=1):
        assert end < 1 + k + 1.5, (k, end)


@check
def a_lent_cursor_comes_back_through_the_queue(s):
    before = over_limit(s)
    cursor = Session(s, user=APP)
    try:
        cursor.run("BEGIN; DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g; FETCH 1 FROM c")
        s.wait_until(f"SELECT count(*) FROM pg_stride.activity WHERE usename = '{APP}' AND admission_lent",
                     "1")
        other = app_client(s, "SELECT pg_sleep(2)")
        s.wait_until(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' "
                     "AND wait_event = 'PgSleep'", "1")
        started = time.monotonic()
        assert cursor.run("FETCH 1 FROM c", timeout=10) == ["2"]
        waited = time.monotonic() - started
        assert finish(other)[0] == 0
        cursor.run("CLOSE c; COMMIT; SELECT 'closed'")
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
        cursor.run("BEGIN; UPDATE caps_rows SET n = n + 1 WHERE id = 2; "
                   "DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g; FETCH 1 FROM c")
        s.wait_until(f"SELECT count(*) FROM pg_stride.activity WHERE usename = '{APP}' AND admission_lent",
                     "1")
        other = app_client(s, "UPDATE caps_rows SET n = n + 1 WHERE id = 2")
        s.wait_until(f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{APP}' "
                     "AND wait_event_type = 'Lock'", "1")
        started = time.monotonic()
        assert cursor.run("FETCH 1 FROM c", timeout=10) == ["2"]
        waited = time.monotonic() - started
        cursor.run("COMMIT; SELECT 'committed'")
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
        lent = (f"SELECT pid FROM pg_stride.activity WHERE usename = '{APP}' AND admission_lent "
                "AND query LIKE 'COPY%'")
        deadline = time.monotonic() + 10
        while not (pid := s.sql(lent)):
            assert time.monotonic() < deadline, "the COPY's admission was never lent"
            time.sleep(0.05)
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


def setup(s):
    s.sql(f"CREATE ROLE {APP} LOGIN; CREATE EXTENSION pg_stride; GRANT USAGE ON SCHEMA pg_stride TO {APP}")
    s.sql(f"SELECT pg_stride.create_group('{GROUP}', max_concurrency => 1)")
    s.sql(f"ALTER ROLE {APP} SET pg_stride.resource_group = '{GROUP}'")
    s.sql("CREATE TABLE caps_rows (id int PRIMARY KEY, n int); INSERT INTO caps_rows VALUES (1, 0), (2, 0)")
    s.sql("CREATE TABLE caps_big (id int); INSERT INTO caps_big SELECT generate_series(1, 1000000)")
    s.sql(f"GRANT SELECT, UPDATE ON caps_rows TO {APP}; GRANT SELECT ON caps_big TO {APP}")


def main():
    return concurrency.run_suite("caps", concurrency.Server(port=PORT), CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
