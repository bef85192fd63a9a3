#!/usr/bin/env python3
"""pg_stride's metrics for Prometheus (contrib/prometheus): the queries file read by the
real prometheus-postgres-exporter, and the Grafana dashboard built on it.

A temporary server (pg_stride preloaded, bypass_monitoring on, the pool and the tuner
on) runs a workload as an ordinary role of group `metered` (max_concurrency 1,
max_queued 1): statements admitted at once, one admitted after waiting about 2 s,
one rejected at once by the full queue and one that times out in the queue; and a
Gather that falls back to PostgreSQL's own workers. Then the exporter, started with
the shipped queries file and its default flags, connects as a non-superuser role with
pg_monitor and is scraped over loopback. The checks:

- every metric of the queries file is in the scrape, with its HELP text and type;
- the group's counters are the workload's (admitted, rejected, timed out, queue time);
- the queue-time histogram is cumulative and non-decreasing, its +Inf bucket and
  _count are the group's admitted_total, the wait shows above the first bounds, and
  it matches pg_stride.queue_time_histogram();
- the scheduler, pool and tuner series have the server's values;
- the exporter reports no error for pg_stride's queries (pg_exporter_last_scrape_error,
  pg_exporter_user_queries_load_error and its log);
- every query of the file answers at once while the server's only admission is taken
  (they are monitoring queries, pg_stride.bypass_monitoring), where an ordinary
  statement queues; and a whole scrape does too, the exporter's own queries included
  (`SELECT version()`, the statistics views), with its role set up as
  docs/internals/metrics.md says;
- the dashboard is valid JSON, its datasource is ${DS_PROMETHEUS}, and every metric its
  expressions name is one the queries file makes and the scrape has.

Prints one line per check, then "metrics: N passed, N failed". Fails (does not skip)
when the exporter is missing: scripts/setup installs it. Run as root, the server runs
as postgres. Every process it starts is ended on exit, also on failure.
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import ENV, Session, finish  # noqa: E402

PORT = int(os.environ.get("METRICS_PORT", "5515"))
EXPORTER_PORT = int(os.environ.get("METRICS_EXPORTER_PORT", "9615"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUERIES = os.path.join(ROOT, "contrib", "prometheus", "queries.yaml")
DASHBOARD = os.path.join(ROOT, "contrib", "prometheus", "grafana-dashboard.json")

APP = "regress_metrics_app"
GROUP = "metered"
# The exporter's role, set up as docs/internals/metrics.md says (pg_monitor, pg_stride off for it).
MONITOR = "regress_metrics_monitor"
# A role like it but with pg_stride on: it runs the file's queries by hand.
READER = "regress_metrics_reader"
HOLD_S = 2.5
POOL_SIZE = 2
CONF = f"""
pg_stride.bypass_monitoring = on
pg_stride.parallel_mode = pool
pg_stride.pool_size = {POOL_SIZE}
max_worker_processes = 16
pg_stride.tuner = on
pg_stride.tuner_interval = 1s
pg_stride.tuner_window = 5s
"""

# Processes started here (clients and the exporter), ended on exit whatever happens.
STARTED = []


def start(args, **kw):
    proc = subprocess.Popen(args, **kw)
    STARTED.append(proc)
    return proc


def app_client(s, sql):
    """Starts, in the background, a session of the app role (group `metered`)."""
    return start(s.psql_args(sql, user=APP), env=ENV, text=True,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --- the queries file -------------------------------------------------------------

def read_queries(path=QUERIES):
    """The queries file's keys, each with its SQL and its columns' usages, read from the
    file's own layout (top-level keys, `query: |` blocks, `- column:` items followed by
    `usage:`); the exporter's pg_exporter_user_queries_load_error checks it is YAML."""
    keys = {}
    key = column = None
    in_query = False
    with open(path) as f:
        for line in f:
            if m := re.match(r"^([a-z_][a-z0-9_]*):\s*$", line):
                key = m.group(1)
                keys[key] = {"query": "", "columns": {}}
                in_query = False
            elif key is None or line.lstrip().startswith("#") or not line.strip():
                continue
            elif re.match(r"^  query: \|\s*$", line):
                in_query = True
            elif in_query and line.startswith("    "):
                keys[key]["query"] += line[4:]
            elif m := re.match(r"^    - ([a-z_][a-z0-9_]*):\s*$", line):
                in_query = False
                column = m.group(1)
            elif m := re.match(r'^        usage: "([A-Z]+)"\s*$', line):
                keys[key]["columns"][column] = m.group(1)
            else:
                in_query = False
    return keys


def expected_metrics(keys):
    """Metric name -> (type, label names) of what the exporter makes of `keys`."""
    out = {}
    for key, q in keys.items():
        labels = sorted(c for c, usage in q["columns"].items() if usage == "LABEL")
        for column, usage in q["columns"].items():
            if usage != "LABEL":
                out[f"{key}_{column}"] = (usage.lower(), labels)
    return out


# --- the exporter ------------------------------------------------------------------

def exporter_binary():
    for path in [os.environ.get("METRICS_EXPORTER"), shutil.which("prometheus-postgres-exporter"),
                 shutil.which("postgres_exporter"), "/usr/bin/prometheus-postgres-exporter"]:
        if path and os.access(path, os.X_OK):
            return path
    raise AssertionError("prometheus-postgres-exporter not found: install the Debian package "
                         "prometheus-postgres-exporter (scripts/setup does), or name the binary "
                         "in METRICS_EXPORTER")


class Exporter:
    """The real exporter, with the shipped queries file and default flags, connected
    through the server's socket as MONITOR; its log goes to a file."""

    def __init__(self):
        self.proc = None
        self.log_path = None

    def start(self, s):
        binary = exporter_binary()
        env = {k: v for k, v in ENV.items() if not k.startswith(("DATA_SOURCE_", "PG"))}
        env["DATA_SOURCE_NAME"] = (f"host={s.dir} port={s.port} user={MONITOR} "
                                   "dbname=postgres sslmode=disable")
        self.log_path = os.path.join(s.dir, "exporter.log")
        log = open(self.log_path, "w")
        # Its own session, so that it and anything it forks are ended together.
        self.proc = start([binary, f"--extend.query-path={QUERIES}",
                           f"--web.listen-address=127.0.0.1:{EXPORTER_PORT}"],
                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 15
        while True:
            assert self.proc.poll() is None, f"the exporter exited: {self.log()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/", timeout=2):
                    return
            except OSError:
                assert time.monotonic() < deadline, f"the exporter did not listen: {self.log()}"
                time.sleep(0.1)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def scrape(self, timeout=30):
        """The samples of one scrape of /metrics: a list of (name, labels, value), and
        the HELP and TYPE lines by metric name."""
        with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=timeout) as r:
            text = r.read().decode()
        return parse_exposition(text)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Scrape:
    def __init__(self, samples, help_, types):
        self.samples, self.help, self.types = samples, help_, types

    def series(self, name, **labels):
        """Samples of `name` whose labels include `labels` (the exporter adds `server`)."""
        return [(lab, v) for n, lab, v in self.samples
                if n == name and all(lab.get(k) == w for k, w in labels.items())]

    def value(self, name, **labels):
        found = self.series(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} series, not 1: {found}"
        return found[0][1]

    def names(self):
        return {n for n, _, _ in self.samples}


def parse_exposition(text):
    samples, help_, types = [], {}, {}
    for line in text.splitlines():
        if m := re.match(r"^# HELP (\S+) ?(.*)$", line):
            help_[m.group(1)] = m.group(2)
        elif m := re.match(r"^# TYPE (\S+) (\S+)$", line):
            types[m.group(1)] = m.group(2)
        elif line and not line.startswith("#"):
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
            assert m, f"unparsable line of the scrape: {line!r}"
            labels = {k: v for k, v in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                                  m.group(2) or "")}
            samples.append((m.group(1), labels, float(m.group(3))))
    return Scrape(samples, help_, types)


EXPORTER = Exporter()
SCRAPE = None


def scrape():
    """The scrape taken after the workload (one, so that the checks compare one moment)."""
    global SCRAPE
    if SCRAPE is None:
        SCRAPE = EXPORTER.scrape()
    return SCRAPE


def group_value(s, column):
    return s.sql(f"SELECT {column} FROM pg_stride.groups WHERE name = '{GROUP}'")


# --- the checks --------------------------------------------------------------------

CHECKS = []
check = concurrency.collector(CHECKS)


@check
def every_metric_of_the_queries_file_is_scraped_with_help_and_type(s):
    keys = read_queries()
    expected = expected_metrics(keys)
    assert len(keys) >= 8 and len(expected) >= 40, (len(keys), len(expected))
    got = scrape()
    missing, wrong = [], []
    for name, (usage, labels) in sorted(expected.items()):
        if usage == "histogram":
            present = {f"{name}_bucket", f"{name}_sum", f"{name}_count"} <= got.names()
        else:
            present = name in got.names()
        if not present:
            missing.append(name)
            continue
        if got.types.get(name) != usage:
            wrong.append(f"{name}: TYPE {got.types.get(name)}, not {usage}")
        if not got.help.get(name) or got.help[name].startswith("Unknown metric"):
            wrong.append(f"{name}: HELP {got.help.get(name)!r}")
        for labs, _ in got.series(f"{name}_count" if usage == "histogram" else name):
            if sorted(set(labs) - {"server"}) != labels:
                wrong.append(f"{name}: labels {sorted(labs)}, not {labels}")
    # Columns the file does not describe would come out as untyped "Unknown metric"s.
    extra = sorted(n for n in got.names() if n.startswith("pg_stride")
                   and got.types.get(n) == "untyped")
    assert not missing and not wrong and not extra, {"missing": missing, "wrong": wrong, "extra": extra}
    print(f"       {len(expected)} metrics of {len(keys)} queries, "
          f"{sum(1 for n, _, _ in got.samples if n.startswith('pg_stride'))} pg_stride samples")


@check
def group_counters_are_the_workload(s):
    got = scrape()
    g = {"group": GROUP}
    # holder, the waiter admitted after it, the second holder; the rejected and the
    # timed-out statements were never admitted.
    assert got.value("pg_stride_groups_admitted_total", **g) == 3, got.series("pg_stride_groups_admitted_total")
    assert got.value("pg_stride_groups_rejected_total", **g) == 1
    assert got.value("pg_stride_groups_timed_out_total", **g) == 1
    assert got.value("pg_stride_groups_over_limit_total", **g) == 0
    assert got.value("pg_stride_groups_active", **g) == 0
    assert got.value("pg_stride_groups_queued", **g) == 0
    assert got.value("pg_stride_groups_max_concurrency", **g) == 1
    waited = got.value("pg_stride_groups_queue_time_seconds_total", **g)
    assert 1.05 < waited < HOLD_S + 1, waited
    # The holders slept: CPU seconds are counted, but far fewer than they took.
    cpu = got.value("pg_stride_groups_cpu_seconds_total", **g)
    assert 0 <= cpu < 2 * HOLD_S, cpu
    # The view says the same.
    assert math.isclose(float(group_value(s, "queue_time_total_ms")) / 1000, waited, rel_tol=1e-12)
    assert int(group_value(s, "admitted_total")) == 3
    # Every group of the view, and no other, has its series.
    groups = {labs["group"] for labs, _ in got.series("pg_stride_groups_admitted_total")}
    assert groups == set(s.sql("SELECT name FROM pg_stride.groups").split()), groups
    print(f"       queued {waited:.3f} s in all; {cpu:.3f} CPU s")


@check
def queue_time_histogram_is_cumulative_and_counts_every_admission(s):
    got = scrape()
    for group in {labs["group"] for labs, _ in got.series("pg_stride_queue_time_seconds_count")}:
        buckets = sorted(((float(labs["le"]), v) for labs, v in
                          got.series("pg_stride_queue_time_seconds_bucket", group=group)))
        bounds = [b for b, _ in buckets]
        counts = [v for _, v in buckets]
        assert bounds[-1] == float("inf") and len(bounds) == 14, bounds
        assert all(a <= b for a, b in zip(counts, counts[1:])), (group, buckets)
        count = got.value("pg_stride_queue_time_seconds_count", group=group)
        assert counts[-1] == count, (group, counts[-1], count)
        admitted = got.value("pg_stride_groups_admitted_total", group=group)
        assert count == admitted, (group, count, admitted)
        # The same µs, divided by 10^6 here and by 10^3 twice there.
        waited = got.value("pg_stride_queue_time_seconds_sum", group=group)
        assert math.isclose(waited, got.value("pg_stride_groups_queue_time_seconds_total", group=group),
                            rel_tol=1e-12), (group, waited)
    le = {float(labs["le"]): v for labs, v in got.series("pg_stride_queue_time_seconds_bucket", group=GROUP)}
    # Two statements admitted at once (under 1 µs), one after ~2 s: above the bounds
    # up to 1.05 s, below 4.19 s.
    assert le[1e-06] == 2 and le[1.048576] == 2 and le[4.194304] == 3, le
    # The function behind it says the same, bound for bound.
    row = s.sql(f"SELECT array_to_string(le_seconds, ' ') || '|' || array_to_string(buckets, ' ') "
                f"|| '|' || count FROM pg_stride.queue_time_histogram() WHERE name = '{GROUP}'")
    bounds, counts, count = row.split("|")
    assert [float(b) for b in bounds.split()] == sorted(le)[:-1], bounds
    assert [float(c) for c in counts.split()] == [le[b] for b in sorted(le)[:-1]], counts
    assert float(count) == le[float("inf")], count
    print("       " + ", ".join(f"le={b:g}: {int(v)}" for b, v in sorted(le.items())))


@check
def scheduler_pool_and_tuner_series_have_the_servers_values(s):
    got = scrape()
    assert got.value("pg_stride_scheduler_cpu_slots") == float(s.sql("SELECT cpu_slots FROM pg_stride.scheduler"))
    assert got.value("pg_stride_scheduler_max_active_queries") == float(s.sql("SHOW pg_stride.max_active_queries"))
    assert got.value("pg_stride_scheduler_queued") == 0
    # The pool: its workers by state add up to its size; the pooled Gather ran a
    # fragment; the one in a transaction with an XID fell back, counted by reason.
    workers = {labs["state"]: v for labs, v in got.series("pg_stride_pool_workers")}
    assert set(workers) == {"starting", "idle", "busy", "retiring"}, workers
    # (started on demand, up to pg_stride.pool_size)
    assert 1 <= sum(workers.values()) <= POOL_SIZE, workers
    assert got.value("pg_stride_pool_gathers_pooled_total") >= 1
    assert got.value("pg_stride_pool_fragments_total", outcome="ok") >= 1
    assert got.value("pg_stride_pool_fragments_total", outcome="error") == 0
    assert got.value("pg_stride_pool_workers_started_total") >= sum(workers.values())
    assert got.value("pg_stride_pool_fallbacks_total", database="postgres",
                     reason="transaction has an xid") == 1
    # The tuner (on, refreshing every second) has refreshed.
    assert got.value("pg_stride_tuner_enabled") == 1
    last = got.value("pg_stride_tuner_last_refresh_timestamp_seconds")
    assert abs(last - time.time()) < 60, last
    assert 0 < got.value("pg_stride_tuner_decay_lambda") <= 1
    print(f"       pool workers {workers}; tuner refreshed {time.time() - last:.1f} s ago")


@check
def the_exporter_reports_no_error_for_pg_strides_queries(s):
    got = scrape()
    # Errors of its own collectors on a newer server than it knows (bgwriter on 17 and
    # later) are not pg_stride's.
    ours = [line for line in EXPORTER.log().splitlines()
            if "pg_stride" in line and re.search(r"level=(warn|error)|err=", line)]
    assert not ours, ours
    assert got.value("pg_exporter_last_scrape_error") == 0, "pg_exporter_last_scrape_error is set"
    assert got.value("pg_up") == 1, "pg_up is 0"
    loads = got.series("pg_exporter_user_queries_load_error")
    assert loads and all(v == 0 for _, v in loads), f"the queries file did not load: {loads}"


def with_the_only_admission_taken(s, fn):
    """Runs `fn` while an app statement holds the server's only admission
    (max_active_queries = 1), after checking that an ordinary statement queues."""
    concurrency.set_server(s, "pg_stride.max_active_queries", 1)
    holder = None
    try:
        holder = app_client(s, "SELECT pg_sleep(6)")
        s.wait_until(f"SELECT active FROM pg_stride.groups WHERE name = '{GROUP}'", "1")
        # The control: an ordinary statement of another role waits.
        control = start(s.psql_args("SELECT 'ran'", user=READER), env=ENV, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        s.wait_until("SELECT queued FROM pg_stride.groups WHERE name = 'default'", "1")
        fn()
        assert control.poll() is None, "the control statement did not wait"
        assert finish(holder)[0] == 0
        assert finish(control) == (0, "ran", ""), "the control statement failed"
    finally:
        if holder and holder.poll() is None:
            holder.kill()
        concurrency.set_server(s, "pg_stride.max_active_queries", None)


@check
def every_query_of_the_file_answers_while_the_only_admission_is_taken(s):
    took = {}

    def run_them():
        session = Session(s, user=READER)
        try:
            for key, q in read_queries().items():
                started = time.monotonic()
                # The query as the exporter sends it, its rows thrown away, then a line
                # to wait for: a queued query would hold it back.
                out = session.run(f"{q['query'].strip()}\n\\g /dev/null\n\\echo done", end="",
                                  timeout=5)
                took[key] = time.monotonic() - started
                assert out == ["done"], (key, out)
        finally:
            session.close()

    with_the_only_admission_taken(s, run_them)
    print("       answered in " + ", ".join(f"{k} {t * 1000:.0f} ms" for k, t in took.items()))
    assert max(took.values()) < 1, took


@check
def a_scrape_answers_while_the_only_admission_is_taken(s):
    took = []

    def scrape_now():
        started = time.monotonic()
        got = EXPORTER.scrape(timeout=5)
        took.append(time.monotonic() - started)
        assert got.value("pg_stride_scheduler_running") == 1, got.series("pg_stride_scheduler_running")
        assert got.value("pg_stride_groups_queued", group="default") == 1

    with_the_only_admission_taken(s, scrape_now)
    print(f"       the scrape took {took[0] * 1000:.0f} ms")
    assert took[0] < 2, took


@check
def the_dashboard_reads_only_metrics_the_file_makes(s):
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    made = set()
    for name, (usage, _) in expected_metrics(read_queries()).items():
        made |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if usage == "histogram" else {name}
    scraped = scrape().names()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource", variables
    exprs, unknown, titles = [], [], []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        titles.append(panel["title"])
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            exprs.append(target["expr"])
    for v in variables.values():
        if v["type"] == "query":
            exprs.append(v["definition"])
    for expr in exprs:
        names = re.findall(r"\bpg_stride_[a-z0-9_]+", expr)
        assert names, expr
        unknown += [n for n in names if n not in made or n not in scraped]
    assert not unknown, sorted(set(unknown))
    wanted = ["per group", "Queue time p50", "CPU time per group", "Pool workers", "Tuner"]
    assert all(any(w in t for t in titles) for w in wanted), titles
    print(f"       {len(titles)} panels, {len(exprs)} expressions")


# --- set-up ------------------------------------------------------------------------

def workload(s):
    """The statements of the app role that the checks count."""
    # Admitted at once; then one admitted after waiting for it, and one turned away by
    # the full queue (max_queued 1).
    holder = app_client(s, f"SELECT pg_sleep({HOLD_S})")
    s.wait_until(f"SELECT active FROM pg_stride.groups WHERE name = '{GROUP}'", "1")
    waiter = app_client(s, "SELECT 'admitted'")
    s.wait_until(f"SELECT queued FROM pg_stride.groups WHERE name = '{GROUP}'", "1")
    rc, out, err = finish(app_client(s, "SELECT 'rejected'"))
    assert rc != 0 and "too many statements waiting" in err, (rc, out, err)
    assert finish(holder)[0] == 0
    assert finish(waiter)[:2] == (0, "admitted")
    # Admitted at once; then one that gives up waiting after 200 ms.
    holder = app_client(s, "SELECT pg_sleep(1)")
    s.wait_until(f"SELECT active FROM pg_stride.groups WHERE name = '{GROUP}'", "1")
    rc, out, err = finish(app_client(s, "SET pg_stride.queue_timeout = 200; SELECT 'timed out'"))
    assert rc != 0 and "waiting 200 ms for admission" in err, (rc, out, err)
    assert finish(holder)[0] == 0
    s.wait_until(f"SELECT active || ' ' || queued FROM pg_stride.groups WHERE name = '{GROUP}'", "0 0")
    # A pooled Gather, and one in a transaction with an XID, which runs with
    # PostgreSQL's own workers (superuser statements, outside the group).
    parallel = ("SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                "SET min_parallel_table_scan_size = 0;")
    assert s.sql(f"{parallel} SELECT count(*) FROM metrics_rows") == "100000"
    out = s.sql(f"BEGIN; CREATE TEMP TABLE x (v int); {parallel} SELECT count(*) FROM metrics_rows; COMMIT")
    assert out.split() == ["100000"], out
    # The tuner refreshes every second.
    s.wait_until("SELECT count(*) > 0 FROM pg_stride.tuner", "t")


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")
    s.sql(f"CREATE ROLE {APP} LOGIN; CREATE ROLE {MONITOR} LOGIN; CREATE ROLE {READER} LOGIN")
    # As docs/internals/metrics.md sets up the exporter's role.
    s.sql(f"GRANT pg_monitor TO {MONITOR}")
    s.sql(f"GRANT pg_monitor TO {READER}")
    s.sql(f"SELECT pg_stride.create_group('{GROUP}', max_concurrency => 1, max_queued => 1)")
    s.sql(f"ALTER ROLE {APP} SET pg_stride.resource_group = '{GROUP}'")
    s.sql("CREATE TABLE metrics_rows AS SELECT g FROM generate_series(1, 100000) g; ANALYZE metrics_rows")
    workload(s)
    EXPORTER.start(s)


def stop_everything(*_):
    EXPORTER.stop()
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    # SIGTERM (a runner's timeout) ends the suite like an exception, through the
    # `finally` blocks that stop the server and the exporter.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    passed, failed = 0, 0
    try:
        passed, failed = concurrency.run_checks(concurrency.Server(port=PORT, extra_conf=CONF),
                                                CHECKS, setup)
    except Exception as e:  # noqa: BLE001 - a failed set-up fails the suite, counted
        failed += 1
        print(f"FAILED set-up: {e}")
    finally:
        stop_everything()
    print(f"metrics: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
