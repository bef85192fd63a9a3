#!/usr/bin/env python3
"""Admission control under real concurrent clients (psql and pgbench processes).

isolationtester cannot see a backend that waits on its latch (it only notices
heavyweight-lock waits), so the waits that another session has to end are tested
here: a statement over its group's limit runs when the slot frees; a heavier group's
waiter goes before a lighter one that came first; cancelling or terminating a queued
statement, and terminating an admitted one, leave the counters right; and 64 pgbench
clients against a group limit of 4 never have more than 4 statements running. The CPU
scheduler's checks follow: pausing at yield points with one slot, cancel and terminate
of paused queries, writes never paused, forced pausing in index scans and hash joins,
and Gather worker counts following the concurrency hint.

Starts its own temporary server (pg_stride preloaded) and prints one line per check,
then "concurrency: N passed, N failed". Run as root, the server runs as postgres.
"""

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

PGBIN = os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin")
PORT = int(os.environ.get("CONCURRENCY_PORT", "5497"))
AS_POSTGRES = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
ROLE = "regress_stride_user"

# Keep backtraces out of the server's error messages.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("RUST_")}


class Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pg_stride_concurrency_")
        if AS_POSTGRES:
            shutil.chown(self.dir, "postgres")
        self.data = os.path.join(self.dir, "data")

    def run(self, *args, **kw):
        return subprocess.run(AS_POSTGRES + list(args), env=ENV, **kw)

    def start(self):
        self.run(f"{PGBIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                 check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(f"""
listen_addresses = ''
unix_socket_directories = '{self.dir}'
port = {PORT}
max_connections = 100
shared_preload_libraries = 'pg_stride'
pg_stride.max_active_queries = 100
""")
        self.run(f"{PGBIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"),
                 "-w", "start", check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        self.run(f"{PGBIN}/pg_ctl", "-D", self.data, "-m", "immediate", "stop",
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def psql_args(self, sql, user="postgres"):
        return AS_POSTGRES + [f"{PGBIN}/psql", "-X", "-q", "-A", "-t", "-h", self.dir,
                              "-p", str(PORT), "-U", user, "-d", "postgres",
                              "-v", "ON_ERROR_STOP=1", "-c", sql]

    def sql(self, sql, user="postgres"):
        """Runs SQL (as the superuser, exempt from admission) and returns its output."""
        out = subprocess.run(self.psql_args(sql, user), env=ENV, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"{sql!r} failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def client(self, group, sql, settings=""):
        """Starts, in the background, a session of an ordinary role in `group`, after
        the superuser-only `settings` (SQL) are made."""
        script = f"SET pg_stride.\"group\" = '{group}'; {settings} SET ROLE {ROLE}; {sql}"
        return subprocess.Popen(self.psql_args(script), env=ENV, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_until(self, sql, expected, timeout=10.0):
        """Polls `sql` until it returns `expected`; fails the check if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.sql(sql)
            if value == expected:
                return value
            assert time.monotonic() < deadline, f"{sql!r} gave {value!r}, not {expected!r}, for {timeout} s"
            time.sleep(0.02)

    def group_state(self, group):
        return self.sql(f"SELECT active || ' ' || queued FROM pg_stride.groups WHERE name = '{group}'")


def finish(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.strip(), err.strip()


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def waits_then_runs_when_the_slot_frees(s):
    holder = s.client("pair", "SELECT pg_sleep(1.5)")
    s.wait_until("SELECT active FROM pg_stride.groups WHERE name = 'pair'", "1")
    waiter = s.client("pair", "SELECT 'admitted'")
    s.wait_until("SELECT state FROM pg_stride.activity WHERE \"group\" = 'pair' AND state = 'queued'", "queued")
    assert s.group_state("pair") == "1 1", s.group_state("pair")
    # Query text follows pg_stat_activity's rules: hidden from an unrelated role.
    texts = s.sql("SELECT DISTINCT query FROM pg_stride.activity WHERE \"group\" = 'pair'", user="regress_viewer")
    assert texts == "<insufficient privilege>", texts
    assert "pg_sleep" in s.sql("SELECT string_agg(query, ' ') FROM pg_stride.activity WHERE \"group\" = 'pair'")
    assert waiter.poll() is None, "the waiter finished while the slot was held"
    assert finish(holder)[0] == 0
    rc, out, err = finish(waiter)
    assert (rc, out) == (0, "admitted"), (rc, out, err)
    assert s.group_state("pair") == "0 0", s.group_state("pair")


@check
def heavier_group_goes_before_a_lighter_one_that_came_first(s):
    s.sql("ALTER SYSTEM SET pg_stride.max_active_queries = 2")
    s.sql("SELECT pg_reload_conf()")
    time.sleep(0.5)  # the scheduler worker applies the new limit on its next wake-up
    try:
        first = s.client("holder", "SELECT pg_sleep(1)")
        second = s.client("holder", "SELECT pg_sleep(2)")
        s.wait_until("SELECT active FROM pg_stride.groups WHERE name = 'holder'", "2")
        light = s.client("light", "SELECT clock_timestamp()")
        s.wait_until("SELECT queued FROM pg_stride.groups WHERE name = 'light'", "1")
        heavy = s.client("heavy", "SELECT clock_timestamp()")
        s.wait_until("SELECT queued FROM pg_stride.groups WHERE name = 'heavy'", "1")
        results = {name: finish(p) for name, p in
                   [("first", first), ("second", second), ("light", light), ("heavy", heavy)]}
        assert all(r[0] == 0 for r in results.values()), results
        assert results["heavy"][1] < results["light"][1], \
            f"heavy admitted at {results['heavy'][1]}, light at {results['light'][1]}"
    finally:
        s.sql("ALTER SYSTEM RESET pg_stride.max_active_queries")
        s.sql("SELECT pg_reload_conf()")
        time.sleep(0.5)


def queued_waiter(s):
    holder = s.client("pair", "SET application_name = 'holder'; SELECT pg_sleep(2)")
    s.wait_until("SELECT active FROM pg_stride.groups WHERE name = 'pair'", "1")
    waiter = s.client("pair", "SET application_name = 'waiter'; SELECT 'admitted'")
    s.wait_until("SELECT queued FROM pg_stride.groups WHERE name = 'pair'", "1")
    return holder, waiter


def end_a_queued_wait(s, how, message):
    """Ends a queued statement's wait with `how` (a function of its pid); it must fail
    with `message`, and the holder keep its admission."""
    holder, waiter = queued_waiter(s)
    s.sql(f"SELECT {how} FROM pg_stat_activity WHERE application_name = 'waiter'")
    rc, out, err = finish(waiter)
    assert rc != 0 and message in err, (rc, out, err)
    assert s.group_state("pair") == "1 0", s.group_state("pair")
    assert finish(holder)[0] == 0
    assert s.group_state("pair") == "0 0", s.group_state("pair")


@check
def cancelling_a_queued_statement_frees_nothing_it_did_not_hold(s):
    end_a_queued_wait(s, "pg_cancel_backend(pid)", "canceling statement due to user request")


@check
def terminating_a_queued_backend_leaves_the_counters_right(s):
    end_a_queued_wait(s, "pg_terminate_backend(pid, 10000)", "terminating connection")


@check
def terminating_an_admitted_backend_frees_its_admission(s):
    holder = s.client("pair", "SET application_name = 'holder'; SELECT pg_sleep(60)")
    s.wait_until("SELECT active FROM pg_stride.groups WHERE name = 'pair'", "1")
    s.sql("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE application_name = 'holder'")
    assert finish(holder)[0] != 0
    assert s.group_state("pair") == "0 0", s.group_state("pair")
    started = time.monotonic()
    rc, out, err = finish(s.client("pair", "SELECT 'admitted'"))
    assert (rc, out) == (0, "admitted") and time.monotonic() - started < 5, (rc, out, err)


class Session:
    """A psql session that stays connected between statements, reading from a pipe."""

    def __init__(self, s):
        args = s.psql_args("")
        args = args[:args.index("-c")]
        # psql buffers its output when it goes to a pipe; line-buffered, each result
        # arrives as soon as its statement ends.
        args.insert(len(AS_POSTGRES), "stdbuf")
        args.insert(len(AS_POSTGRES) + 1, "-oL")
        self.proc = subprocess.Popen(args, env=ENV, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.pending = b""

    def run(self, sql, lines=1, timeout=10.0):
        """Runs `sql` and returns the `lines` lines of output it gives."""
        self.proc.stdin.write(sql.encode() + b";\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while self.pending.count(b"\n") < lines:
            left = deadline - time.monotonic()
            ready = select.select([self.proc.stdout], [], [], max(left, 0))[0]
            assert ready, f"{sql!r} gave no result for {timeout} s (got {self.pending!r})"
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            assert chunk, f"the session ended: {self.proc.stderr.read().decode()}"
            self.pending += chunk
        *out, self.pending = self.pending.split(b"\n", lines)
        return [line.decode().strip() for line in out]

    def close(self):
        """Ends the session (psql reads the end of its input) and returns as finish()."""
        return finish(self.proc)


@check
def an_idle_session_keeps_no_statement_waiting(s):
    # A session keeps its admission between statements while nobody waits (its lease);
    # in a group with a limit of 1, an idle session must not keep a newcomer waiting,
    # and the statements it ran count in the group's statistics before it ends.
    s.sql("SELECT pg_stride.reset_stats()")
    idle = Session(s)
    try:
        out = idle.run(f"SET pg_stride.\"group\" = 'pair'; SET ROLE {ROLE}; SELECT 1; SELECT 2", lines=2)
        assert out == ["1", "2"], out
        assert s.group_state("pair") == "0 0", s.group_state("pair")
        assert s.sql("SELECT admitted_total FROM pg_stride.groups WHERE name = 'pair'") == "2"
        started = time.monotonic()
        rc, out, err = finish(s.client("pair", "SELECT 'admitted'", "SET pg_stride.queue_timeout = '5s';"))
        assert (rc, out) == (0, "admitted") and time.monotonic() - started < 3, (rc, out, err)
        # The idle session's next statement needs an admission again, and gets one.
        assert idle.run("SELECT 3") == ["3"]
        # Switching groups counts the earlier statements in the group they ran in.
        assert idle.run("RESET ROLE; SET pg_stride.\"group\" = 'holder'; "
                        f"SET ROLE {ROLE}; SELECT 4") == ["4"]
        totals = s.sql("SELECT string_agg(name || '=' || admitted_total, ' ' ORDER BY name) "
                       "FROM pg_stride.groups WHERE name IN ('pair', 'holder')")
        assert totals == "holder=1 pair=4", totals
    finally:
        rc, out, err = idle.close()
    assert rc == 0, (rc, out, err)
    assert s.group_state("pair") == "0 0", s.group_state("pair")


@check
def sixty_four_pgbench_clients_respect_a_group_limit_of_four(s):
    script = os.path.join(s.dir, "four.sql")
    with open(script, "w") as f:
        f.write("SELECT count(*) FROM generate_series(1, 20000);\n")
    if AS_POSTGRES:
        shutil.chown(script, "postgres")
    bench = subprocess.Popen(
        AS_POSTGRES + [f"{PGBIN}/pgbench", "-n", "-h", s.dir, "-p", str(PORT), "-U", "regress_four",
                       "-c", "64", "-j", "4", "-T", "6", "-f", script, "postgres"],
        env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    samples = []
    time.sleep(1)
    while bench.poll() is None:
        row = s.sql("SELECT count(*) FILTER (WHERE state IN ('running', 'paused')) || ' ' || count(*) FILTER (WHERE state = 'queued') "
                    "FROM pg_stride.activity WHERE \"group\" = 'four'")
        samples.append(tuple(int(v) for v in row.split()))
        time.sleep(0.2)
    out, err = bench.communicate()
    running = [r for r, _ in samples]
    print(f"    {len(samples)} samples of (running, queued) in group four: max running {max(running)}, "
          f"max queued {max(q for _, q in samples)}")
    summary = [l for l in out.splitlines() if l.startswith(("number of transactions actually", "number of failed", "tps"))]
    print("    pgbench: " + "; ".join(summary))
    assert bench.returncode == 0, err
    assert max(running) <= 4, samples
    assert max(q for _, q in samples) > 0, "the limit never made anyone wait"
    assert "number of failed transactions: 0" in out or "failed" not in out, out


def set_server(s, setting, value):
    """Changes a reload-level setting and waits until the scheduler worker applied it."""
    s.sql(f"ALTER SYSTEM SET {setting} = {value}")
    s.sql("SELECT pg_reload_conf()")
    time.sleep(0.5)


LONG = "SELECT count(*) FROM big a JOIN big b USING (id) WHERE a.v >= 0"


def sample_states(s, procs, interval=0.05):
    """(running, paused) counts of pg_stride.activity, sampled until `procs` finish."""
    samples = []
    while any(p.poll() is None for p in procs):
        row = s.sql("SELECT count(*) FILTER (WHERE state = 'running' AND query LIKE '%big a JOIN%') || ' ' || "
                    "count(*) FILTER (WHERE state = 'paused') || ' ' || "
                    "(SELECT slots_in_use FROM pg_stride.scheduler) FROM pg_stride.activity")
        samples.append(tuple(int(v) for v in row.split()))
        time.sleep(interval)
    return samples


@check
def one_cpu_slot_is_shared_by_pausing_at_yield_points(s):
    set_server(s, "pg_stride.cpu_slots", 1)
    try:
        alone = time.monotonic()
        rc, expected, err = finish(s.client("holder", LONG), timeout=120)
        alone = time.monotonic() - alone
        assert rc == 0, err
        procs = [s.client("holder", LONG) for _ in range(2)]
        samples = sample_states(s, procs)
        results = [finish(p, timeout=120) for p in procs]
        assert all(r == (0, expected, "") for r in results), results
        paused = max(p for _, p, _ in samples)
        print(f"    alone {alone:.2f} s; {len(samples)} samples of (running, paused, slots in use); "
              f"max paused {paused}")
        assert paused >= 1, f"nobody was ever paused with one slot: {samples}"
        # Nothing holds a slot now: the query reading the view is too short to join
        # (its scans end before a first chunk of tuples).
        state = s.sql("SELECT slots_in_use || ' ' || paused FROM pg_stride.scheduler")
        assert state == "0 0", state
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)


def paused_victim(s):
    procs = [s.client("holder", f"SET application_name = 'cpu{i}'; {LONG}") for i in range(2)]
    # The two take turns, so ask for a paused one and its name in one statement.
    deadline = time.monotonic() + 60
    while True:
        row = s.sql("SELECT a.pid || ' ' || substr(p.application_name, 4) FROM pg_stride.activity a "
                    "JOIN pg_stat_activity p USING (pid) WHERE a.state = 'paused' LIMIT 1")
        if row:
            pid, victim = row.split()
            return procs, pid, int(victim)
        assert time.monotonic() < deadline, "no query was ever paused with one slot"
        time.sleep(0.02)


def end_a_paused_query(s, how, message, then=lambda: None):
    """With one slot, ends a paused query with `how` (a function of its pid): it must
    fail with `message`, the other query finish, and no slot stay taken; `then` runs
    while there is still one slot."""
    set_server(s, "pg_stride.cpu_slots", 1)
    try:
        procs, pid, victim = paused_victim(s)
        s.sql(f"SELECT {how.format(pid=pid)}")
        rc, out, err = finish(procs[victim], timeout=120)
        assert rc != 0 and message in err, (rc, out, err)
        assert finish(procs[1 - victim], timeout=120)[0] == 0
        # Nothing holds a slot now: the query reading the view is too short to join
        # (its scans end before a first chunk of tuples).
        state = s.sql("SELECT slots_in_use || ' ' || paused FROM pg_stride.scheduler")
        assert state == "0 0", state
        then()
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)


@check
def cancelling_a_paused_query_gives_its_slot_back(s):
    end_a_paused_query(s, "pg_cancel_backend({pid})", "canceling statement due to user request")


@check
def a_terminated_paused_backend_leaves_no_slot_behind(s):
    def a_new_query_runs_at_once():
        started = time.monotonic()
        assert finish(s.client("holder", "SELECT count(*) FROM big"))[0] == 0
        assert time.monotonic() - started < 5

    end_a_paused_query(s, "pg_terminate_backend({pid}, 10000)", "terminating connection",
                       then=a_new_query_runs_at_once)


@check
def writes_are_never_paused(s):
    set_server(s, "pg_stride.cpu_slots", 1)
    try:
        readers = [s.client("holder", LONG) for _ in range(2)]
        s.wait_until("SELECT count(*) > 0 FROM pg_stride.activity WHERE state = 'paused'", "t", timeout=60)
        writers = [
            s.client("holder", "SET application_name = 'writer'; "
                               "INSERT INTO scratch SELECT g FROM generate_series(1, 300000) g"),
            # A read-only statement of a transaction that already wrote holds row locks.
            s.client("holder", "SET application_name = 'writer'; BEGIN; INSERT INTO scratch VALUES (0); "
                               f"{LONG}; COMMIT"),
            # So does a cursor opened before the transaction wrote, fetched after.
            s.client("holder", f"SET application_name = 'writer'; BEGIN; DECLARE c CURSOR FOR {LONG}; "
                               "INSERT INTO scratch VALUES (0); FETCH ALL FROM c; COMMIT"),
        ]
        seen = set()
        while any(w.poll() is None for w in writers):
            seen.add(s.sql("SELECT coalesce(string_agg(a.state, ','), 'gone') FROM pg_stride.activity a "
                           "JOIN pg_stat_activity p USING (pid) WHERE p.application_name = 'writer'"))
            time.sleep(0.02)
        assert all(finish(w, timeout=120)[0] == 0 for w in writers)
        assert all(finish(p, timeout=120)[0] == 0 for p in readers)
        assert not any("paused" in v for v in seen), seen
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)


@check
def forced_pausing_inside_index_scans_and_hash_joins_is_safe(s):
    """One slot and 0.1 ms slices: processes pause at nearly every yield point, inside
    index scans, bitmap scans and hash joins; a pause in an LWLock would trip the
    debug assertion (test builds are debug builds) and fail the statement."""
    set_server(s, "pg_stride.cpu_slots", 1)
    try:
        query = ("SET enable_seqscan = off; "
                 "SELECT sum(a.v) FROM big a JOIN big b ON b.id = a.id + 1 WHERE a.id < 200000 AND b.id % 3 = 0")
        rc, expected, err = finish(s.client("holder", query), timeout=120)
        assert rc == 0, err
        procs = [s.client("holder", query, settings="SET pg_stride.slice = '0.1ms';") for _ in range(3)]
        results = [finish(p, timeout=300) for p in procs]
        assert all(r == (0, expected, "") for r in results), results
    finally:
        set_server(s, "pg_stride.cpu_slots", 0)


def workers_planned(s, query):
    """The workers the Gather of `query` was planned with when it ran (EXPLAIN ANALYZE
    shows the plan that ran, after pg_stride's grant)."""
    plan = s.sql("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                 "SET min_parallel_table_scan_size = 0; SET max_parallel_workers_per_gather = 2; "
                 f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {query}")
    counts = [int(line.split(":")[1]) for line in plan.splitlines() if "Workers Planned:" in line]
    assert len(counts) == 1, plan
    return counts[0]


@check
def gather_workers_follow_the_concurrency_hint(s):
    """Two CPU slots: on a quiet server a Gather gets the two workers it planned; while
    two long serial scans hold both slots the hint falls to 0 and it gets none; when
    they end, the hint and the grant come back."""
    set_server(s, "pg_stride.cpu_slots", 2)
    set_server(s, "pg_stride.hint_interval", "'10ms'")
    query = "SELECT count(*) FROM big WHERE v >= 0"
    try:
        s.wait_until("SELECT hint FROM pg_stride.scheduler", "2")
        quiet = workers_planned(s, query)
        longs = [s.client("holder", LONG, settings="SET max_parallel_workers_per_gather = 0;") for _ in range(2)]
        s.wait_until("SELECT hint < 1 FROM pg_stride.scheduler", "t", timeout=60)
        busy = workers_planned(s, query)
        assert all(finish(p, timeout=120)[0] == 0 for p in longs)
        s.wait_until("SELECT hint FROM pg_stride.scheduler", "2")
        again = workers_planned(s, query)
        print(f"    workers planned: quiet {quiet}, both slots busy {busy}, quiet again {again}")
        assert (quiet, busy, again) == (2, 0, 2), (quiet, busy, again)
    finally:
        set_server(s, "pg_stride.hint_interval", "'50ms'")
        set_server(s, "pg_stride.cpu_slots", 0)


def setup(s):
    s.sql(f"CREATE ROLE {ROLE}; CREATE ROLE regress_four LOGIN; CREATE ROLE regress_viewer LOGIN")
    s.sql("CREATE EXTENSION pg_stride")
    s.sql(f"GRANT USAGE ON SCHEMA pg_stride TO {ROLE}")
    for name, weight, limit in [("pair", 100, 1), ("holder", 100, 0), ("light", 100, 0),
                                ("heavy", 300, 0), ("four", 100, 4)]:
        s.sql(f"SELECT pg_stride.create_group('{name}', weight => {weight}, max_concurrency => {limit})")
    s.sql("ALTER ROLE regress_four SET pg_stride.\"group\" = 'four'")
    s.sql("CREATE TABLE big (id int PRIMARY KEY, v int); "
          "INSERT INTO big SELECT g, g % 1000 FROM generate_series(1, 1000000) g; "
          "CREATE TABLE scratch (v int); ANALYZE big")
    s.sql(f"GRANT SELECT ON big TO {ROLE}; GRANT INSERT ON scratch TO {ROLE}")


def main():
    server = Server()
    passed = failed = 0
    try:
        server.start()
        setup(server)
        # Names on the command line run only those checks.
        for fn in [fn for fn in CHECKS if not sys.argv[1:] or fn.__name__ in sys.argv[1:]]:
            try:
                fn(server)
                passed += 1
                print(f"ok     {fn.__name__}")
            except Exception as e:  # noqa: BLE001 - report every failing check
                failed += 1
                print(f"FAILED {fn.__name__}: {e}")
    finally:
        server.stop()
    print(f"concurrency: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
