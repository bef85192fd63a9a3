#!/usr/bin/env python3
"""Faults: processes killed, terminated and churned while pg_stride schedules them.

Uses concurrency.py's temporary server with one CPU slot. The workload runs as ordinary
roles, so that its statements are admitted and scheduled (pgbench's select-only
lookups are too small to admit: they run unregistered, beside the scans that are);
the checks read the views as
the superuser, whom pg_stride.exempt_superuser (on, the default) keeps out of the
limits (the reading statement itself shows as one running statement of group default).

1. kill -9, under pgbench load (select-only clients beside long read-only scans that
   contend for the slot), of a client backend holding the slot, of a parallel worker of
   a running parallel query, and of the "pg_stride scheduler" worker. Each makes the
   postmaster restart every process and reinitialise shared memory; afterwards no slot
   is held, nothing is queued, running or paused, a statement is admitted at once under
   a limit of 1, and two long queries with one slot are scheduled (one pauses). Also a
   SIGTERM (pg_terminate_backend) of each of pg_stride's workers (no crash restart):
   each comes back by itself after its restart time.
2. pg_terminate_backend of a backend queued for admission, paused at a yield point,
   running with the slot while another waits for it, idle holding a lease, and idle in a
   transaction with an open cursor: the scheduler's counters come back to what they
   were, the backend's row leaves pg_stride.activity, its group has nothing active, and
   a statement is admitted at once under a limit of 1.
3. Connection churn: pgbench -C with 100 clients (select-only and a short read-only
   scan; 8 admitted at once so that some queue) for --churn-seconds (120): afterwards
   nothing is left behind and a statement is admitted at once under a limit of 1.

    regress/faults.py [--churn-seconds N] [check names...]

Prints one line per check, then "faults: N passed, N failed". Run as root, the server
runs as postgres. The port is FAULTS_PORT (default 5522).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# concurrency.py reads its port when imported.
os.environ["CONCURRENCY_PORT"] = os.environ.get("FAULTS_PORT", "5522")
sys.path.insert(0, HERE)
import concurrency  # noqa: E402
from concurrency import (AS_POSTGRES, ENV, LONG, PGBIN, PORT, ROLE, Session,  # noqa: E402
                         finish, paused_victim, queued_waiter, set_server)

LOAD_ROLE = "fault_load"          # pgbench's select-only and short scans, group "load"
PARALLEL_ROLE = "fault_parallel"  # long parallel scans with as many workers as planned

SETTINGS = """
max_connections = 150
pg_stride.cpu_slots = 1
restart_after_crash = on
log_line_prefix = '%m [%p] %b: '
"""


class FaultServer(concurrency.Server):
    """concurrency.py's Server with SETTINGS in postgresql.conf."""

    def __init__(self):
        super().__init__(extra_conf=SETTINGS)

    def log_since(self, offset):
        with open(self.logfile, errors="replace") as f:
            f.seek(offset)
            return f.read()

    def try_sql(self, sql):
        try:
            return self.sql(sql)
        except RuntimeError:
            return None

    def pgbench(self, user, *args, options=""):
        env = dict(ENV, PGOPTIONS=options) if options else ENV
        return subprocess.Popen(
            AS_POSTGRES + [f"{PGBIN}/pgbench", "-n", "-h", self.dir, "-p", str(PORT), "-U", user]
            + list(args) + ["postgres"],
            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def poll(what, fn, timeout, interval=0.05):
    """Calls fn until it returns something true; fails the check after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(interval)


def counters(s):
    """pg_stride.scheduler's slots_in_use, running, queued, paused."""
    return s.sql("SELECT slots_in_use || ' ' || running || ' ' || queued || ' ' || paused FROM pg_stride.scheduler")


# The superuser reading the view is exempt from the limits but registered: it shows as
# one running statement of group default.
QUIET = "0 1 0 0"


def quiet_state(s, timeout=10):
    """Once the workload has ended: waits until no other client backend is left, then
    asserts that no slot is held, nothing but the reading statement runs, nothing is
    queued or paused, no other backend has a row in pg_stride.activity, and no group
    has an active or queued statement but the reader's."""
    poll("other client backends to end",
         lambda: s.sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                       "AND pid <> pg_backend_pid()") == "0", timeout)
    state = counters(s)
    assert state == QUIET, f"slots_in_use/running/queued/paused = {state}, not {QUIET}"
    rows = s.sql("SELECT string_agg(pid || ':' || state, ' ') FROM pg_stride.activity WHERE pid <> pg_backend_pid()")
    assert not rows, f"pg_stride.activity still has {rows}"
    groups = s.sql("SELECT string_agg(name || ' ' || active || '/' || queued, ', ') FROM pg_stride.groups "
                   "WHERE queued <> 0 OR active > (name = 'default')::int")
    assert not groups, f"groups with active/queued statements: {groups}"


def admitted_at_once(s):
    """Under a limit of 1 (server-wide, and group pair's own), an ordinary role's
    statement with queue_timeout = 2s is admitted at once: nothing leaked holds an
    admission (a leaked one would make it wait and fail with SQLSTATE 53000)."""
    set_server(s, "pg_stride.max_active_queries", 1)
    try:
        started = time.monotonic()
        rc, out, err = finish(s.client("pair", "SELECT 'admitted'", "SET pg_stride.queue_timeout = '2s';"))
        took = time.monotonic() - started
        assert (rc, out) == (0, "admitted"), f"not admitted under a limit of 1: {err}"
        assert took < 1.5, f"admitted only after {took:.1f} s under a limit of 1"
    finally:
        set_server(s, "pg_stride.max_active_queries", 100)


def scheduling_works(s):
    """Two long read-only queries with one CPU slot: both show in pg_stride.activity,
    one of them pauses, and the scheduler makes decisions."""
    before = int(s.sql("SELECT decisions FROM pg_stride.scheduler"))
    procs = [s.client("holder", f"SET application_name = 'sched{i}'; {LONG}") for i in range(2)]
    try:
        s.wait_until("SELECT count(*) FROM pg_stride.activity a JOIN pg_stat_activity p USING (pid) "
                     "WHERE p.application_name LIKE 'sched%' AND a.state = 'paused'", "1", timeout=60)
        after = int(s.sql("SELECT decisions FROM pg_stride.scheduler"))
        assert after > before, f"decisions {before} -> {after}"
    finally:
        s.sql("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'sched%'")
        for p in procs:
            finish(p, timeout=60)
    quiet_state(s)


# --- 1. kill -9 under load ----------------------------------------------------------

def start_load(s):
    """4 select-only clients, 2 long read-only scans with the slot contended, and 1
    client running parallel scans (with as many workers as planned)."""
    long_scan = s.script("long_scan.sql", f"{LONG};\n")
    par_scan = s.script("parallel_scan.sql", "SELECT count(*), sum(v) FROM big WHERE v >= 0;\n")
    return [s.pgbench(LOAD_ROLE, "-S", "-c", "4", "-j", "2", "-T", "120"),
            s.pgbench(LOAD_ROLE, "-f", long_scan, "-c", "2", "-T", "120"),
            s.pgbench(PARALLEL_ROLE, "-f", par_scan, "-c", "1", "-T", "120")]


def stop_load(load, timeout=30):
    """The load ends by itself when the crash restart breaks its connections."""
    deadline = time.monotonic() + timeout
    for p in load:
        try:
            p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def wait_for_crash_restart(s, offset, timeout=60):
    """Waits until the postmaster has reinitialised and accepts connections again;
    returns the log written meanwhile."""
    poll("the postmaster to reinitialise after the kill",
         lambda: "reinitializing" in s.log_since(offset), timeout, 0.1)
    poll("the server to accept connections after the crash restart",
         lambda: re.search(r"reinitializing(.|\n)*ready to accept connections", s.log_since(offset))
         and s.try_sql("SELECT 1") == "1", timeout, 0.1)
    return s.log_since(offset)


def kill_under_load(s, find_victim, what):
    """Starts the load, kills -9 the pid `find_victim` returns once the load runs, waits
    for the crash restart, and checks what is left. Returns the victim's pid."""
    load = start_load(s)
    try:
        s.wait_until("SELECT paused > 0 FROM pg_stride.scheduler", "t", timeout=60)
        pid = poll(f"a {what} to kill", lambda: s.try_sql(find_victim), 60)
        offset = os.path.getsize(s.logfile)
        os.kill(int(pid), signal.SIGKILL)
        log = wait_for_crash_restart(s, offset)
    finally:
        stop_load(load)
    # The kill is the only crash: no other process died of a signal or exited
    # abnormally during the restart (say, pg_stride's shared memory set-up).
    signals = re.findall(r"\(PID (\d+)\) was terminated by signal (\d+)", log)
    assert signals == [(pid, "9")], f"processes terminated by signals: {signals}"
    bad = [l for l in log.splitlines() if re.search(r"PANIC|TRAP:|exited with exit code [^01]|panicked", l)]
    assert not bad, bad
    quiet_state(s)
    admitted_at_once(s)
    scheduling_works(s)
    return pid


@concurrency.check
def kill_9_of_a_client_backend_holding_the_slot(s):
    # Catches: a dead backend's slot, admission, queue entry or activity row surviving
    # the crash restart (shared memory not reset), or pg_stride failing to start again.
    kill_under_load(s, "SELECT pid FROM pg_stride.activity a JOIN pg_stat_activity p USING (pid) "
                       f"WHERE p.usename = '{LOAD_ROLE}' AND a.state = 'running' LIMIT 1", "slot holder")


@concurrency.check
def kill_9_of_a_parallel_worker(s):
    # Catches: a worker's slot or its leader's scheduling state left behind, or the
    # restart failing, when a parallel worker of a scheduled query dies.
    kill_under_load(s, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'parallel worker' "
                       "AND state = 'active' LIMIT 1", "parallel worker")


@concurrency.check
def kill_9_of_the_scheduler_worker(s):
    # Catches: the scheduler worker not coming back after the crash restart, the view
    # naming a dead pid, or anything left behind as above.
    old = s.sql("SELECT scheduler_pid FROM pg_stride.scheduler")
    pid = kill_under_load(s, "SELECT scheduler_pid FROM pg_stride.scheduler", "scheduler worker")
    assert pid == old, (pid, old)
    new = poll("the pg_stride scheduler worker to come back",
               lambda: s.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_stride scheduler'"), 15)
    assert new != old, f"the worker's pid did not change: {new}"
    shown = s.sql("SELECT scheduler_pid FROM pg_stride.scheduler")
    assert shown == new, f"pg_stride.scheduler shows scheduler_pid {shown}, the worker is {new}"
    # pg_stride's other workers are back too.
    poll("all of pg_stride's workers to be back after the crash restart",
         lambda: workers(s) == WORKERS, 15)


def workers(s):
    """The backend types of pg_stride's background workers that run."""
    return s.sql("SELECT string_agg(backend_type, ',' ORDER BY backend_type) FROM pg_stat_activity "
                 "WHERE backend_type LIKE 'pg_stride %'")


WORKERS = None  # as they run once the server has started


@concurrency.check
def sigterm_of_each_other_pg_stride_worker_restarts_it(s):
    # Catches: a worker other than the scheduler (the groups loader) that exits for good
    # on SIGTERM (pg_terminate_backend) instead of being restarted by the postmaster.
    missing = []
    for kind in [w for w in WORKERS.split(",") if w != "pg_stride scheduler"]:
        old = s.sql(f"SELECT pid FROM pg_stat_activity WHERE backend_type = '{kind}'")
        s.sql(f"SELECT pg_terminate_backend({old})")
        started = time.monotonic()
        try:
            poll(f"{kind} to come back", lambda: s.sql(
                f"SELECT pid FROM pg_stat_activity WHERE backend_type = '{kind}' AND pid <> {old}"), 30, 0.2)
            print(f"    {kind} came back after {time.monotonic() - started:.1f} s")
        except AssertionError:
            missing.append(kind)
    assert not missing, f"not back 30 s after pg_terminate_backend: {', '.join(missing)}"


@concurrency.check
def sigterm_of_the_scheduler_worker_restarts_it_alone(s):
    # Catches: the worker not restarted after an ordinary exit (its restart time is
    # 5 s), a crash restart caused by its exit, or state left behind while it was gone.
    old = s.sql("SELECT scheduler_pid FROM pg_stride.scheduler")
    offset = os.path.getsize(s.logfile)
    load = start_load(s)
    try:
        s.wait_until("SELECT paused > 0 FROM pg_stride.scheduler", "t", timeout=60)
        s.sql(f"SELECT pg_terminate_backend({old})")
        started = time.monotonic()
        new = poll("the pg_stride scheduler worker to come back",
                   lambda: s.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_stride scheduler' "
                                 f"AND pid <> {old}"), 15)
        print(f"    the scheduler worker came back after {time.monotonic() - started:.1f} s")
        assert s.sql("SELECT scheduler_pid FROM pg_stride.scheduler") == new
        for p in load:
            assert p.poll() is None, "the load ended while the worker was restarted"
    finally:
        s.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN ('{LOAD_ROLE}', '{PARALLEL_ROLE}')")
        stop_load(load)
    assert "reinitializing" not in s.log_since(offset), "the worker's exit made the postmaster restart"
    quiet_state(s)
    admitted_at_once(s)
    scheduling_works(s)


@concurrency.check
def a_worker_that_exits_on_an_error_shows_no_pid_until_it_is_back(s):
    # Catches: a pid left in pg_stride.scheduler by a worker that exited on an ERROR
    # (pg_cancel_backend) rather than SIGTERM, naming a dead process (or one that took
    # its pid) until the worker is back 5 to 10 s later.
    for column, kind in [("scheduler_pid", "pg_stride scheduler"), ("tuner_pid", "pg_stride tuner")]:
        old = s.sql(f"SELECT {column} FROM pg_stride.scheduler")
        assert old, f"{column} is NULL before the check"
        offset = os.path.getsize(s.logfile)
        s.sql(f"SELECT pg_cancel_backend({old})")
        poll(f"{kind} {old} to exit", lambda: s.sql(
            f"SELECT count(*) FROM pg_stat_activity WHERE pid = {old}") == "0", 5)
        shown = s.sql(f"SELECT {column} FROM pg_stride.scheduler")
        back = s.sql(f"SELECT pid FROM pg_stat_activity WHERE backend_type = '{kind}'")
        assert shown == back, f"{column} {shown!r} after {kind} {old} exited; running: {back!r}"
        assert "canceling statement due to user request" in s.log_since(offset), s.log_since(offset)
        new = poll(f"{kind} to come back", lambda: s.sql(
            f"SELECT {column} FROM pg_stride.scheduler WHERE {column} <> {old}"), 30, 0.2)
        assert s.sql(f"SELECT backend_type FROM pg_stat_activity WHERE pid = {new}") == kind


# --- 2. pg_terminate_backend in every state -------------------------------------------

def terminate(s, pid):
    s.sql(f"SELECT pg_terminate_backend({pid}, 10000)")
    poll(f"backend {pid} to exit", lambda: s.sql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}") == "0", 10)
    # Its row must go with it (it clears it on exit; the scheduler worker reclaims the
    # entries of processes that are gone).
    poll(f"backend {pid}'s row to leave pg_stride.activity",
         lambda: s.sql(f"SELECT count(*) FROM pg_stride.activity WHERE pid = {pid}") == "0", 5)


def after_terminate(s, baseline):
    state = counters(s)
    assert state == baseline, f"slots_in_use/running/queued/paused = {state}, were {baseline}"
    quiet_state(s)
    admitted_at_once(s)


@concurrency.check
def terminate_a_queued_backend(s):
    # Catches: the waiter's queue entry or queued count left behind, or the holder's
    # admission disturbed, when a backend dies waiting for admission.
    baseline = counters(s)
    holder, waiter = queued_waiter(s)
    pid = s.sql("SELECT pid FROM pg_stat_activity WHERE application_name = 'waiter'")
    assert s.sql(f"SELECT state FROM pg_stride.activity WHERE pid = {pid}") == "queued"
    terminate(s, pid)
    assert finish(waiter)[0] != 0
    assert s.group_state("pair") == "1 0", s.group_state("pair")
    assert finish(holder)[0] == 0
    after_terminate(s, baseline)


@concurrency.check
def terminate_a_paused_backend(s):
    # Catches: a paused process's place in the slot queue or its paused count left
    # behind, so that the other query or later ones wait for a slot nobody gives back.
    baseline = counters(s)
    procs, pid, victim = paused_victim(s)
    terminate(s, pid)
    assert finish(procs[victim], timeout=60)[0] != 0
    rc, out, err = finish(procs[1 - victim], timeout=120)
    assert rc == 0, err
    after_terminate(s, baseline)


@concurrency.check
def terminate_the_running_slot_holder_while_another_waits(s):
    # Catches: the slot of a backend that dies running not handed to the paused query
    # (it would wait forever), or slots_in_use left at 1.
    baseline = counters(s)
    procs, _, paused = paused_victim(s)
    running = 1 - paused
    pid = poll("the other query to hold the slot",
               lambda: s.try_sql("SELECT a.pid FROM pg_stride.activity a JOIN pg_stat_activity p USING (pid) "
                                 f"WHERE a.state = 'running' AND p.application_name = 'cpu{running}'"), 30, 0.01)
    terminate(s, pid)
    assert finish(procs[running], timeout=60)[0] != 0
    rc, out, err = finish(procs[paused], timeout=120)
    assert rc == 0, err
    after_terminate(s, baseline)


def idle_session(s, sql, lines):
    """A session of the ordinary role in group pair that ran `sql` and is now idle."""
    session = Session(s)
    out = session.run(f"SET pg_stride.resource_group = 'pair'; SET ROLE {ROLE}; "
                      f"SELECT pg_backend_pid(); {sql}", lines=1 + lines)
    return session, out[0], out[1:]


@concurrency.check
def terminate_an_idle_backend_with_a_lease(s):
    # Catches: the lease of a backend that dies idle never given back, so that a limit
    # of 1 (group pair's, and the server's) keeps every later statement waiting.
    baseline = counters(s)
    session, pid, out = idle_session(s, "SELECT 'ran'", 1)
    assert out == ["ran"], out
    assert s.sql(f"SELECT count(*) FROM pg_stride.activity WHERE pid = {pid}") == "0"
    terminate(s, pid)
    session.close()
    after_terminate(s, baseline)


@concurrency.check
def terminate_a_backend_idle_with_an_open_cursor(s):
    # Catches: the admission a cursor holds between FETCHes never given back when its
    # backend dies idle in the transaction.
    baseline = counters(s)
    session, pid, out = idle_session(s, "BEGIN; DECLARE c CURSOR FOR SELECT id FROM big ORDER BY id; "
                                        "FETCH 1 FROM c", 1)
    assert out == ["1"], out
    state = s.sql(f"SELECT state || ' ' || statements FROM pg_stride.activity WHERE pid = {pid}")
    assert s.group_state("pair") == "1 0", f"group pair {s.group_state('pair')}, cursor's row: {state}"
    terminate(s, pid)
    session.close()
    after_terminate(s, baseline)


# --- 3. connection churn --------------------------------------------------------------

CHURN_SECONDS = 120


@concurrency.check
def connection_churn_leaves_nothing_behind(s):
    # Catches: entries, admissions or leases of backends that exit between (or during)
    # statements not reclaimed; after thousands of connections they would fill the
    # table or hold the admissions.
    short_scan = s.script("short_scan.sql", "\\set x random(1, 990000)\n"
                                            "SELECT sum(v) FROM big WHERE id BETWEEN :x AND :x + 20000;\n")
    set_server(s, "pg_stride.max_active_queries", 8)
    try:
        bench = s.pgbench(LOAD_ROLE, "-C", "-c", "100", "-j", "4", "-T", str(CHURN_SECONDS),
                          "-b", "select-only", "-f", short_scan)
        samples = []
        while bench.poll() is None:
            row = s.try_sql("SELECT running || ' ' || queued || ' ' || paused FROM pg_stride.scheduler")
            if row:
                samples.append(tuple(int(v) for v in row.split()))
            time.sleep(0.5)
        out, err = bench.communicate()
    finally:
        set_server(s, "pg_stride.max_active_queries", 100)
    summary = [l for l in out.splitlines() if l.startswith(("number of transactions actually", "number of failed", "tps"))]
    print(f"    {CHURN_SECONDS} s of pgbench -C -c 100: " + "; ".join(summary))
    if samples:
        print(f"    max running {max(r for r, _, _ in samples)}, queued {max(q for _, q, _ in samples)}, "
              f"paused {max(p for _, _, p in samples)} over {len(samples)} samples")
    assert bench.returncode == 0, err[-2000:]
    assert max(q for _, q, _ in samples) > 0, "nobody ever queued: the limit of 8 was never reached"
    quiet_state(s)
    admitted_at_once(s)


def setup(s):
    concurrency.setup(s)
    s.sql("SELECT pg_stride.create_group('load')")
    for role, settings in [(LOAD_ROLE, ["pg_stride.resource_group = 'load'"]),
                           (PARALLEL_ROLE, ["pg_stride.resource_group = 'load'", "pg_stride.parallel_mode = 'off'",
                                            "parallel_setup_cost = 0", "parallel_tuple_cost = 0",
                                            "min_parallel_table_scan_size = 0",
                                            "max_parallel_workers_per_gather = 2"])]:
        s.sql(f"CREATE ROLE {role} LOGIN")
        for setting in settings:
            s.sql(f"ALTER ROLE {role} SET {setting}")
    s.run(f"{PGBIN}/pgbench", "-i", "-q", "-s", "2", "-h", s.dir, "-p", str(PORT), "-U", "postgres", "postgres",
          check=True, capture_output=True)
    s.sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {LOAD_ROLE}, {PARALLEL_ROLE}")


def main():
    global CHURN_SECONDS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--churn-seconds", type=int, default=CHURN_SECONDS,
                    help="how long the connection churn runs (default 120)")
    ap.add_argument("checks", nargs="*", help="run only these checks")
    args = ap.parse_args()
    CHURN_SECONDS = args.churn_seconds
    server = FaultServer()
    passed = failed = 0
    print(f"faults: port {PORT}, connection churn for {CHURN_SECONDS} s (--churn-seconds)")
    try:
        server.start()
        setup(server)
        global WORKERS
        WORKERS = poll("pg_stride's workers to start", lambda: "pg_stride scheduler" in (workers(server) or "")
                       and workers(server), 15)
        print(f"faults: pg_stride's workers: {WORKERS}")
        for fn in [fn for fn in concurrency.CHECKS if fn.__module__ == __name__
                   and (not args.checks or fn.__name__ in args.checks)]:
            started = time.monotonic()
            try:
                fn(server)
                passed += 1
                print(f"ok     {fn.__name__} ({time.monotonic() - started:.1f} s)", flush=True)
            except Exception as e:  # noqa: BLE001 - report every failing check
                failed += 1
                print(f"FAILED {fn.__name__} ({time.monotonic() - started:.1f} s): {e}", flush=True)
                # A check that left the server down or busy must not fail the next ones.
                server.try_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()")
                if server.try_sql("SELECT string_agg(backend_type, ',' ORDER BY backend_type) FROM pg_stat_activity "
                                  "WHERE backend_type LIKE 'pg_stride %'") != WORKERS:
                    print("    (a pg_stride worker is missing: restarting the server for the next checks)")
                    server.run(f"{PGBIN}/pg_ctl", "-D", server.data, "-l", server.logfile, "-w", "-m", "fast",
                               "restart", stdout=subprocess.DEVNULL)
    finally:
        if failed:
            keep = os.path.join(os.path.dirname(HERE), "tmp", "faults.log")
            os.makedirs(os.path.dirname(keep), exist_ok=True)
            shutil.copy(server.logfile, keep)
            print(f"faults: the server log is in {keep}")
        server.stop()
    print(f"faults: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
