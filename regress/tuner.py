#!/usr/bin/env python3
"""The tuner worker on a real server under pgbench (wagner2021 §4; docs/internals/tuner.md).

A server with one CPU slot, pg_stride.tuner on, a 10 s window and a 5 s interval runs a
mix of short (50,000-row) and long (2,000,000-row) scans from 4 pgbench clients. The
checks: the tuner's searches see the statements pgbench ran (their number matches
pgbench's rate over the window, none lost), simulate candidates and say why they kept
or changed the parameters; the decay parameters in force are the last refresh's; a
reload that changes the decay settings replaces tuned parameters at once; and with the
tuner off the configured parameters are in force and no refresh runs.

Starts its own temporary server and prints one line per check, then
"tuner: N passed, N failed". Run as root, the server runs as postgres.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import AS_POSTGRES, ENV, PGBIN  # noqa: E402

# A search replays at least 20 finished statements (the tuner's own minimum; fewer give
# "too few queries"): the window holds that many even at the 3.7 statements/s a debug
# build ran on a busy machine, where a 5-s window held 18.
WINDOW_S, INTERVAL_S = 10, 5
MIN_QUERIES = 20
# Prediction off: every count is scheduled, so traced, whatever this machine's speed (a
# count over `s` of under a millisecond would run unscheduled by its history, and leave
# the trace and the window).
CONF = f"""
pg_stride.predict = off
pg_stride.cpu_slots = 1
pg_stride.tuner = on
pg_stride.tuner_window = {WINDOW_S}s
pg_stride.tuner_interval = {INTERVAL_S}s
max_parallel_workers_per_gather = 0
"""

CHECKS = []
check = concurrency.collector(CHECKS)


def reload(s, **settings):
    for name, value in settings.items():
        s.sql(f"ALTER SYSTEM SET pg_stride.{name} = {value}")
    s.sql("SELECT pg_reload_conf()")


def pgbench(s, seconds, clients=4):
    """Runs the short/long mix; returns transactions per second."""
    scripts = [s.script(f"{name}.sql", f"SELECT count(*) FROM {table};\n")
               for name, table in [("short", "s"), ("long", "b")]]
    out = subprocess.run(
        AS_POSTGRES + [f"{PGBIN}/pgbench", "-n", "-h", s.dir, "-p", str(s.port), "-U", "postgres",
                       "-c", str(clients), "-j", str(clients), "-T", str(seconds),
                       "-f", f"{scripts[0]}@3", "-f", f"{scripts[1]}@1", "postgres"],
        env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    tps = float(next(l for l in out.stdout.splitlines() if l.startswith("tps = ")).split()[2])
    print(f"    pgbench: {clients} clients, {seconds} s, {tps:.1f} statements/s")
    return tps


def searches(s):
    """The view's search rows over at least MIN_QUERIES finished statements, as dicts."""
    cols = ["statements", "finished", "records_lost", "simulations", "elapsed_ms", "cpu_ms",
            "best_lambda", "best_decay_start", "predicted_mean_before", "predicted_mean_after",
            "adopted", "reason"]
    rows = s.sql(f"SELECT {', '.join(cols)} FROM pg_stride.tuner "
                 f"WHERE action = 'search' AND finished >= {MIN_QUERIES} ORDER BY refreshed_at")
    return [dict(zip(cols, line.split("|"))) for line in rows.splitlines()]


def in_force_is_the_last_refresh(s):
    """Whether the decay in force is the last refresh's new parameters (read twice if a
    refresh landed between the two views' readings)."""
    sql = ("SELECT (SELECT new_lambda || ' ' || new_decay_start FROM pg_stride.tuner "
           "ORDER BY refreshed_at DESC LIMIT 1) || ' / ' || decay_lambda || ' ' || decay_start "
           "FROM pg_stride.scheduler")
    for _ in range(3):
        last, in_force = s.sql(sql).split(" / ")
        if last == in_force:
            return True
        time.sleep(0.1)
    return f"last refresh {last}, in force {in_force}"


@check
def the_tuner_searches_over_the_statements_pgbench_ran(s):
    seconds = 4 * INTERVAL_S
    tps = pgbench(s, seconds)
    rows = searches(s)
    print(f"    {len(rows)} searches over >= {MIN_QUERIES} statements: "
          + "; ".join(f"{r['statements']} statements, {r['simulations']} simulations, {r['cpu_ms']} ms CPU, "
                      f"{r['reason']}" for r in rows))
    assert len(rows) >= 2, f"expected a search every {INTERVAL_S} s of a {seconds} s run: {rows}"
    expected = tps * WINDOW_S
    most = max(int(r["statements"]) for r in rows)
    assert 0.5 * expected <= most <= 1.5 * expected + 4, \
        f"a window of {WINDOW_S} s at {tps:.1f}/s should hold about {expected:.0f} statements, the fullest held {most}"
    for r in rows:
        assert r["records_lost"] == "0", r
        assert int(r["simulations"]) >= 2, f"the incumbent and the best are always simulated: {r}"
        assert float(r["cpu_ms"]) > 0 and float(r["elapsed_ms"]) >= float(r["cpu_ms"]) * 0.5, r
        assert 0.5 <= float(r["best_lambda"]) <= 1.0, f"λ outside its bounds: {r}"
        assert float(r["predicted_mean_before"]) >= 1.0, f"a slowdown below 1: {r}"
        assert r["reason"] in ("adopted", "gain below margin", "replay mismatch"), r
        assert (r["adopted"] == "t") == (r["reason"] == "adopted"), r
    agree = in_force_is_the_last_refresh(s)
    assert agree is True, agree


@check
def a_changed_decay_setting_replaces_tuned_parameters(s):
    tuned = s.sql("SELECT decay_tuned FROM pg_stride.scheduler")
    # No further searches: a shift check can only go back to the configured values.
    reload(s, decay_lambda=0.8, decay_start=5, tuner_interval="'1h'")
    try:
        s.wait_until("SELECT decay_lambda || ' ' || decay_start || ' ' || decay_tuned "
                     "FROM pg_stride.scheduler", "0.8 5 false")
        print(f"    tuned parameters were in force before: {tuned}")
    finally:
        for name in ("decay_lambda", "decay_start", "tuner_interval"):
            s.sql(f"ALTER SYSTEM RESET pg_stride.{name}")
        reload(s)
    s.wait_until("SELECT decay_lambda || ' ' || decay_start FROM pg_stride.scheduler", "0.9 8")


@check
def with_the_tuner_off_the_configured_parameters_are_in_force(s):
    reload(s, tuner="off")
    try:
        s.wait_until("SELECT decay_lambda || ' ' || decay_start || ' ' || decay_tuned "
                     "FROM pg_stride.scheduler", "0.9 8 false")
        time.sleep(0.5)
        before = s.sql("SELECT count(*) FROM pg_stride.tuner")
        pgbench(s, 2 * INTERVAL_S)
        after = s.sql("SELECT count(*) FROM pg_stride.tuner")
        assert before == after, f"refreshes ran with the tuner off: {before} rows, then {after}"
        assert s.sql("SELECT decay_tuned FROM pg_stride.scheduler") == "f"
    finally:
        s.sql("ALTER SYSTEM RESET pg_stride.tuner")
        reload(s)


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql("CREATE TABLE s AS SELECT g AS a FROM generate_series(1, 50000) g; "
          "CREATE TABLE b AS SELECT g AS a FROM generate_series(1, 2000000) g")
    s.sql("VACUUM ANALYZE s")
    s.sql("VACUUM ANALYZE b")
    s.wait_until("SELECT tuner_pid IS NOT NULL FROM pg_stride.scheduler", "t")


def main():
    server = concurrency.Server(port=concurrency.PORT + 7, extra_conf=CONF)
    return concurrency.run_suite("tuner", server, CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
