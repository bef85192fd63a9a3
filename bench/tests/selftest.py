"""Self-test of the benchmark's analysis code on synthetic pgbench logs.

Run with `bench/run --selftest` (or `cd bench && python3 -m tests.selftest`).  Needs no
server and no third-party module; ends with the line `N passed, N failed`.
"""

import math
import os
import re
import struct
import sys
import tempfile
import types
import unittest
from pathlib import Path
from unittest import mock

from stride_bench import (analysis, cli, common, hugepages, oltp, pgserver, pool, queries,
                          report, simgap, workload)


def line(client, no, lat_us, script, end_s, lag_us=None):
    sec, usec = int(end_s), int(round((end_s - int(end_s)) * 1e6))
    s = f"{client} {no} {lat_us} {script} {sec} {usec}"
    return s + (f" {lag_us}" if lag_us is not None else "")


class ParseTest(unittest.TestCase):
    def test_fields_with_and_without_lag(self):
        t = analysis.parse_log_lines([line(3, 7, 25000, 1, 1000.5, 120),
                                      line(0, 1, 1500, 0, 1001.25)])
        self.assertEqual(len(t), 2)
        self.assertEqual((t[0].client, t[0].script), (3, 1))
        self.assertAlmostEqual(t[0].latency_s, 0.025)
        self.assertAlmostEqual(t[0].end_s, 1000.5)
        self.assertAlmostEqual(t[0].arrival_s, 1000.475)
        self.assertAlmostEqual(t[0].lag_s, 0.00012)
        self.assertEqual(t[1].lag_s, 0.0)

    def test_failed_and_short_lines(self):
        t = analysis.parse_log_lines(["0 1 failed 2 1000 5 0", "garbage", ""])
        self.assertEqual(len(t), 1)
        self.assertTrue(t[0].failed)
        self.assertTrue(math.isnan(t[0].latency_s))

    def test_parse_logs_reads_every_thread_file(self):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "ol.123").write_text(line(0, 0, 1000, 0, 5.0) + "\n")
            Path(d, "ol.123.1").write_text(line(1, 0, 1000, 0, 4.0) + "\n")
            Path(d, "ol.out").write_text("pgbench output, not a log\n")
            t = analysis.parse_logs(str(Path(d, "ol")))
            self.assertEqual([x.client for x in t], [1, 0])   # sorted by completion


class MachineLockTest(unittest.TestCase):
    def test_a_second_run_is_refused_while_the_first_holds_the_machine(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "out" / "bench.lock"
            first = common.claim_machine(path)
            with self.assertRaises(common.MachineBusy) as refused:
                common.claim_machine(path)
            self.assertEqual(str(refused.exception), str(os.getpid()))
            first.close()
            common.claim_machine(path).close()


class HugePagesTest(unittest.TestCase):
    SMAPS = ("7f00-7f80 rw-s 00000000 00:01 1 /dev/zero (deleted)\nSize: 2048 kB\n"
             "KernelPageSize:        4 kB\nMMUPageSize:           4 kB\n"
             "7f80-7fc0 rw-s 00000000 00:0f 2 /anon_hugepage (deleted)\nSize: 2199552 kB\n"
             "KernelPageSize:     2048 kB\nMMUPageSize:        2048 kB\n")

    def test_only_a_hugetlb_mapping_counts(self):
        self.assertTrue(hugepages.maps_huge_pages(self.SMAPS))
        # transparent huge pages still show the base page size
        self.assertFalse(hugepages.maps_huge_pages(self.SMAPS.replace("2048 kB\nMMU", "4 kB\nMMU")))
        self.assertFalse(hugepages.maps_huge_pages(""))

    def test_reserve_raises_the_count_and_release_sets_it_back(self):
        with tempfile.TemporaryDirectory() as d:
            nr = Path(d) / "nr_hugepages"
            nr.write_text("3\n")
            restore = Path(d) / "restore"
            with mock.patch.object(hugepages, "NR_HUGEPAGES", nr), \
                    mock.patch.object(hugepages, "RESTORE_FILE", restore), \
                    mock.patch.object(hugepages, "IS_ROOT", True):
                r = hugepages.Reservation()
                rec = r.reserve(1067)
                want = hugepages.with_margin(1067)
                self.assertGreater(want, 1067)
                self.assertEqual(int(nr.read_text()), want)
                self.assertEqual(rec, {"needed": 1067, "before": 3, "reserved": want,
                                       "status": "reserved for the run"})
                # bench/run's trap finds the value to set back while the run holds them
                self.assertEqual(restore.read_text().strip(), "3")
                r.release()
                self.assertEqual(nr.read_text().strip(), "3")
                self.assertFalse(restore.exists())
                # enough reserved already: nothing changes, nothing to set back
                nr.write_text(f"{want + 5}\n")
                r = hugepages.Reservation()
                self.assertEqual(r.reserve(1067)["status"], "reserved already")
                r.release()
                self.assertEqual(int(nr.read_text()), want + 5)
            with mock.patch.object(hugepages, "NR_HUGEPAGES", nr), \
                    mock.patch.object(hugepages, "IS_ROOT", False):
                nr.write_text("0\n")
                r = hugepages.Reservation()
                self.assertTrue(r.reserve(1067)["status"].startswith("not root"))
                self.assertEqual(nr.read_text().strip(), "0")

    def test_report_line_names_the_servers_without_them(self):
        meta = {"huge_pages": {"needed": 1067, "before": 0, "reserved": 1100,
                               "status": "reserved for the run"},
                "configs": {"stock": {"huge_pages": True}, "x": {"huge_pages": True}}}
        line_all = report.huge_pages_line(meta)
        self.assertIn("vm.nr_hugepages 0 → 1100", line_all)
        self.assertIn("every configuration's server", line_all)
        meta["configs"]["x"]["huge_pages"] = False
        self.assertIn("in 4-kB pages: x", report.huge_pages_line(meta))
        meta["configs"]["stock"]["huge_pages"] = False
        self.assertIn("**no** configuration", report.huge_pages_line(meta))
        self.assertIsNone(report.huge_pages_line({"configs": {}}))


class StatsTest(unittest.TestCase):
    def test_percentile_linear_interpolation(self):
        xs = [4, 1, 3, 2]
        self.assertAlmostEqual(analysis.percentile(xs, 50), 2.5)
        self.assertAlmostEqual(analysis.percentile(xs, 99), 3.97)
        self.assertAlmostEqual(analysis.percentile(xs, 0), 1)
        self.assertAlmostEqual(analysis.percentile(xs, 100), 4)
        self.assertEqual(analysis.percentile([7], 95), 7)
        self.assertTrue(math.isnan(analysis.percentile([], 50)))

    def test_ratio_interval(self):
        mean, low, high = analysis.ratio_interval([0.9, 1.0, 1.1, 1.0])
        self.assertAlmostEqual(mean, math.exp(sum(map(math.log, [0.9, 1.0, 1.1, 1.0])) / 4))
        # t with 3 degrees of freedom (3.18) on the log ratios' standard error
        logs = [math.log(x) for x in (0.9, 1.0, 1.1, 1.0)]
        m = sum(logs) / 4
        se = math.sqrt(sum((x - m) ** 2 for x in logs) / 3) / 2
        self.assertAlmostEqual(low, math.exp(m - 3.18 * se))
        self.assertAlmostEqual(high, math.exp(m + 3.18 * se))
        self.assertTrue(math.isnan(analysis.ratio_interval([1.2])[1]))
        # between two entries of the table, the lower one's; the normal's far out
        self.assertEqual((analysis.t95(22), analysis.t95(35), analysis.t95(500)), (2.09, 2.04, 1.96))
        self.assertTrue(math.isnan(analysis.ratio_interval([])[0]))

    def test_summarize_and_geomean(self):
        s = analysis.summarize(range(1, 101))
        self.assertEqual(s["n"], 100)
        self.assertAlmostEqual(s["mean"], 50.5)
        self.assertAlmostEqual(s["p50"], 50.5)
        self.assertAlmostEqual(s["p95"], 95.05)
        self.assertAlmostEqual(s["p99"], 99.01)
        self.assertEqual(s["max"], 100)
        self.assertAlmostEqual(analysis.geomean([1, 100]), 10)

    def test_isolated_latency_skips_warmup(self):
        lines = [line(0, i, lat, 0, 10 + i) for i, lat in
                 enumerate([900000, 12000, 10000, 11000, 13000, 10500])]
        res = analysis.isolated_latency([analysis.parse_log_lines(lines)], skip_first=1)
        self.assertEqual(res["runs"], 5)
        self.assertAlmostEqual(res["median_s"], 0.011)
        self.assertAlmostEqual(res["max_s"], 0.013)

    def test_isolated_latency_pools_rounds_skipping_each_warmup(self):
        # a slow first round (machine busy) and a fast later one: the median is over both
        first = [line(0, i, lat, 0, 10 + i) for i, lat in enumerate([900000, 20000, 21000, 22000])]
        later = [line(0, i, lat, 0, 50 + i) for i, lat in enumerate([800000, 10000, 11000])]
        res = analysis.isolated_latency([analysis.parse_log_lines(first),
                                         analysis.parse_log_lines(later)], skip_first=1)
        self.assertEqual(res["runs"], 5)
        self.assertAlmostEqual(res["median_s"], 0.020)
        self.assertAlmostEqual(res["min_s"], 0.010)
        self.assertAlmostEqual(res["max_s"], 0.022)

    def test_max_in_system(self):
        # arrivals/completions: [0,2] [1,3] [1.5,1.8] [3,4] -> three at once around 1.6
        t = analysis.parse_log_lines([line(0, 0, 2000000, 0, 2.0), line(1, 0, 2000000, 0, 3.0),
                                      line(2, 0, 300000, 0, 1.8), line(3, 0, 1000000, 0, 4.0)])
        self.assertEqual(analysis.max_in_system(t), 3)


class OpenLoopTest(unittest.TestCase):
    """Two classes, known isolated latencies, hand-computed slowdowns."""

    script_info = {0: ("q06", "short"), 1: ("q01", "short"), 2: ("q06", "long")}
    isolated = {("q06", "short"): 0.010, ("q01", "short"): 0.020, ("q06", "long"): 1.0}

    def make(self):
        rows = [
            # warm-up arrival at t=100 (excluded with warmup 1 s)
            line(0, 0, 50000, 0, 100.05),
            # short q06: latencies 10, 20, 40 ms -> slowdowns 1, 2, 4
            line(1, 0, 10000, 0, 101.01, 0), line(2, 0, 20000, 0, 102.02, 0),
            line(3, 0, 40000, 0, 103.04, 5000),
            # short q01: 20 ms and 160 ms -> slowdowns 1 and 8
            line(4, 0, 20000, 1, 104.02, 0), line(5, 0, 160000, 1, 105.16, 0),
            # long q06: 1.5 s and 3 s -> slowdowns 1.5 and 3
            line(6, 0, 1500000, 2, 103.0, 0), line(7, 0, 3000000, 2, 106.5, 0),
            "0 9 failed 0 107 0 0",
        ]
        return analysis.parse_log_lines(rows)

    def test_slowdowns_per_class(self):
        st = analysis.open_loop_stats(self.make(), self.script_info, self.isolated, warmup_s=1.0)
        self.assertEqual(st["n"], 7)
        self.assertEqual(st["failed"], 1)
        short = st["classes"]["short"]["slowdown"]
        self.assertEqual(short["n"], 5)
        self.assertAlmostEqual(short["mean"], (1 + 2 + 4 + 1 + 8) / 5)
        self.assertAlmostEqual(short["p50"], 2)
        self.assertAlmostEqual(short["max"], 8)
        self.assertAlmostEqual(short["p99"], 4 + (8 - 4) * 0.96)
        self.assertAlmostEqual(st["classes"]["short"]["per_query_mean_slowdown"]["q01"], 4.5)
        long_ = st["classes"]["long"]["slowdown"]
        self.assertAlmostEqual(long_["mean"], 2.25)
        self.assertAlmostEqual(st["classes"]["long"]["work_s"], 2.0)
        self.assertAlmostEqual(st["max_lag_s"], 0.005)

    def test_throughput_and_warmup(self):
        st = analysis.open_loop_stats(self.make(), self.script_info, self.isolated, warmup_s=0.0)
        self.assertEqual(st["classes"]["short"]["slowdown"]["n"], 6)
        # long: first arrival 101.5, last completion 106.5 -> 2 queries / 5 s
        self.assertAlmostEqual(st["classes"]["long"]["throughput_qps"], 0.4)

    def test_window_end_and_fingerprint(self):
        st = analysis.open_loop_stats(self.make(), self.script_info, self.isolated,
                                      warmup_s=1.0, end_s=4.5)
        short = st["classes"]["short"]["slowdown"]
        self.assertEqual(short["n"], 4)                  # q01 at 105.0 is past the window
        self.assertAlmostEqual(short["mean"], (1 + 2 + 4 + 1) / 4)
        self.assertEqual(st["failed"], 0)                # the failed one arrived at 107
        # the same arrivals with other latencies give the same fingerprint
        other = [analysis.Txn(t.client, t.script, t.latency_s * 2,
                              t.end_s + (0.0 if t.failed else t.latency_s),
                              0.0, t.failed) for t in self.make()]
        st2 = analysis.open_loop_stats(other, self.script_info, self.isolated,
                                       warmup_s=1.0, end_s=4.5)
        self.assertEqual(st["arrival_fingerprint"], st2["arrival_fingerprint"])
        self.assertTrue(st["arrival_fingerprint"].startswith("6:"))

    def test_closed_loop(self):
        txns = analysis.parse_log_lines([line(0, i, 5000, 0, 10 + i * 0.1) for i in range(50)])
        res = analysis.closed_loop_stats(txns, 10.0, self.script_info, self.isolated)
        self.assertAlmostEqual(res["tps"], 5.0)
        self.assertAlmostEqual(res["classes"]["short"]["work_per_s"], 50 * 0.010 / 10)
        self.assertAlmostEqual(res["classes"]["short"]["slowdown"]["mean"], 0.5)


class WorkloadTest(unittest.TestCase):
    def test_mean_isolated_weights_classes_3_to_1(self):
        from stride_bench.workload import Workload
        wl = Workload({("a", "short"): "x", ("b", "short"): "y", ("a", "long"): "z",
                       ("b", "long"): "w"})
        iso = {("a", "short"): 0.01, ("b", "short"): 0.03, ("a", "long"): 1.0, ("b", "long"): 2.0}
        # 3/4 * mean(10, 30 ms) + 1/4 * mean(1, 2 s)
        self.assertAlmostEqual(wl.mean_isolated(iso), 0.75 * 0.02 + 0.25 * 1.5)
        files = wl.pgbench_files()
        self.assertEqual(files[1], "x@3")
        self.assertEqual(files[-1], "w@1")
        self.assertEqual(wl.script_info[2], ("a", "long"))

    def test_arrival_rate_from_cpu_or_latency(self):
        from stride_bench.workload import arrival_rate
        # A parallel query: 100 ms alone, but 300 ms of CPU (leader and two workers).
        # α = 0.9 of 2 CPUs is 1.8 CPU-s per s: 6 arrivals/s; by latency, 9/s.
        self.assertAlmostEqual(arrival_rate(0.9, "cpu", 0.1, 0.3, 2), 6.0)
        self.assertAlmostEqual(arrival_rate(0.9, "latency", 0.1, 0.3, 2), 9.0)
        # cpu-mean: the same nominal rate, which `cpu` then calibrates
        self.assertAlmostEqual(arrival_rate(0.9, "cpu-mean", 0.1, 0.3, 2), 6.0)

    def test_synthetic_workload_is_two_classes_of_different_statements(self):
        from stride_bench import synthetic
        from stride_bench.workload import Workload
        short, long_ = synthetic.names("short"), synthetic.names("long")
        # as many of each, so that the 3:1 class weights give 3 short arrivals for 1 long
        self.assertEqual(len(short), len(long_))
        self.assertGreaterEqual(len(short), 4)
        # different statements, not one set at two scales
        texts = {synthetic.STATEMENTS[n][1] for n in short + long_}
        self.assertEqual(len(texts), len(short) + len(long_))
        with tempfile.TemporaryDirectory() as d:
            wl = Workload(synthetic.write_scripts(Path(d), comment_of=queries.group_tag))
            self.assertEqual(wl.order, [(n, "short") for n in short] +
                             [(n, "long") for n in long_])
            weights = [int(f.rsplit("@", 1)[1]) for f in wl.pgbench_files()[1::2]]
            self.assertAlmostEqual(sum(weights[:len(short)]) / sum(weights), 0.75)
            for (name, cls), path in wl.scripts.items():
                text = Path(path).read_text()
                # every variable a statement uses is set before it
                set_vars = set(re.findall(r"^\\set (\w+) ", text, re.M))
                statement = text.split(queries.group_tag(cls) + "\n")[1]
                used = set(re.findall(r":(\w+)", statement))
                self.assertLessEqual(used, set_vars, name)
                self.assertTrue(statement.rstrip().endswith(";"), name)

    def test_report_labels_of_either_workload(self):
        tpch = {"scales": {"short": 0.05, "long": 0.5},
                "queries": {"included": ["q01", "q06"], "excluded": {}}}
        self.assertEqual(report.class_label(tpch, "long"), "SF 0.5")
        self.assertEqual(report.queries_of(tpch, "short"), ["q01", "q06"])
        synth = {"workload": "synthetic", "queries": {"included": ["s01", "l01"]},
                 "synthetic": {"classes": {"s01": "short", "l01": "long"}}}
        self.assertEqual(report.class_label(synth, "short"), "synthetic short statements")
        self.assertEqual(report.queries_of(synth, "long"), ["l01"])

    def test_query_scripts_render(self):
        for q in queries.ALL:
            text = queries.render(q, "sf0_01", 0.01)
            self.assertNotIn("@", text, q)
            used = set(re.findall(r"(?<!:):([a-z][a-z0-9_]*)", text))
            defined = set(re.findall(r"^\\set (\w+)", text, re.M))
            self.assertTrue(used <= defined, f"{q}: undefined pgbench variables {used - defined}")

    def test_a_lead_statement_is_a_command_of_its_own(self):
        lead = queries.group_lead("short")
        for q in queries.ALL:
            text = queries.with_lead(queries.render(q, "sf0_01", 0.01), lead)
            sql = [ln for ln in text.splitlines() if queries.is_sql_line(ln)]
            # two pgbench commands: the lead, then the query up to its only `;` (no
            # compound `\;`, whose second result pgbench waits for, blocking)
            self.assertEqual(sql[0], f"{lead};", q)
            self.assertNotIn("\\;", text, q)
            self.assertEqual("\n".join(sql).count(";"), 2, q)
            self.assertTrue(sql[-1].rstrip().endswith(";"), q)
            # the meta-commands (\\set) stay before the command they feed
            lines = text.splitlines()
            metas = [i for i, ln in enumerate(lines) if ln.startswith("\\")]
            self.assertLess(max(metas, default=-1), lines.index(sql[0]), q)
        self.assertEqual(queries.group_lead("long"),
                         "SET pg_stride.resource_group = 'analytics'")

    def test_a_group_tag_stands_directly_before_the_statement(self):
        tag = queries.group_tag("short")
        self.assertEqual(tag, "/* pg_stride.resource_group=interactive */")
        for q in queries.ALL:
            plain = queries.render(q, "sf0_01", 0.01)
            text = queries.with_comment(plain, tag)
            sql = [ln for ln in text.splitlines() if queries.is_sql_line(ln)]
            # one pgbench command: the comment, then the statement's first line (only
            # whitespace and block comments may stand between a tag and the first word)
            self.assertEqual(sql[0], tag, q)
            self.assertEqual(sql[1:], [ln for ln in plain.splitlines()
                                       if queries.is_sql_line(ln)], q)
            self.assertEqual("\n".join(sql).count(";"), 1, q)

    def test_configs_table(self):
        cfg = common.load_configs()
        names = [c["name"] for c in cfg["config"]]
        self.assertEqual(names[:2], ["stock", "pgbouncer"])
        self.assertEqual(len(set(names)), len(names))
        # --full's set: configurations that exist, stock first (the ratios' base)
        self.assertEqual(cfg["full"]["configs"][0], "stock")
        self.assertLessEqual(set(cfg["full"]["configs"]), set(names))
        for c in cfg["config"]:
            if c.get("library"):
                self.assertTrue(any("pg_stride" in s for s in c["settings"]), c["name"])
            # every class has its group, and only the arguments create_group takes
            if "class_groups" in c:
                self.assertEqual(set(c["class_groups"]), set(queries.GROUP), c["name"])
                for args in c["class_groups"].values():
                    self.assertLessEqual(set(args), {
                        "weight", "max_concurrency", "max_parallel_workers",
                        "priority_initial", "priority_min", "decay_lambda",
                        "decay_start", "pinned"}, c["name"])
            self.assertIn(c.get("group_by", "tag"), ("tag", "set"), c["name"])
            if "group_by" in c:
                self.assertIn("class_groups", c, c["name"])
            # every placeholder a configuration uses is one common.expand knows
            for s in common.expand(c.get("settings", [])):
                self.assertNotIn("@", s, c["name"])

    def test_configs_run_in_the_order_given(self):
        configs = [{"name": n} for n in ("stock", "a", "b", "c")]
        pick = lambda only: [c["name"] for c in cli.select_configs(configs, only)]
        self.assertEqual(pick(None), ["stock", "a", "b", "c"])
        self.assertEqual(pick(["c", "a"]), ["c", "a"])
        self.assertEqual(pick(["b", "stock", "b"]), ["b", "stock"])
        with self.assertRaises(ValueError) as e:
            pick(["a", "nope"])
        self.assertIn("nope", str(e.exception))
        self.assertEqual(cli.configs_named(" c, a ,,"), ["c", "a"])
        self.assertIsNone(cli.configs_named(None))
        self.assertIsNone(cli.configs_named(" , "))

    def test_a_configuration_extends_another(self):
        base = {"name": "a", "label": "A", "library": True, "settings": ["x = 1", "y = 1"],
                "requires": ["x"], "class_groups": {"short": {}}}
        child = {"name": "b", "label": "B", "extends": "a", "settings": ["y = 2"],
                 "requires": ["y"], "library": False}
        grandchild = {"name": "c", "label": "C", "extends": "b", "settings": ["z = 3"]}
        a, b, c = common.resolve_extends([base, child, grandchild])
        self.assertEqual(a, base)
        self.assertEqual(b, {"name": "b", "label": "B", "library": False,
                             "settings": ["x = 1", "y = 1", "y = 2"], "requires": ["x", "y"],
                             "class_groups": {"short": {}}})
        self.assertEqual(c["settings"], ["x = 1", "y = 1", "y = 2", "z = 3"])
        self.assertEqual((c["name"], c["label"], c["requires"]), ("c", "C", ["x", "y"]))
        for broken in ([dict(child, extends="nowhere")],
                       [dict(base, extends="b"), child]):
            with self.assertRaises(SystemExit):
                common.resolve_extends(broken)

    def test_cpu_placeholders_in_settings(self):
        with mock.patch.object(common, "ncpus", return_value=4):
            self.assertEqual(common.expand(["a = @CPUS@", "b = @CPUS+1@", "c = @2xCPUS@", "d = 1"]),
                             ["a = 4", "b = 5", "c = 8", "d = 1"])


class ServerTest(unittest.TestCase):
    def test_settings_altered_by_alter_system_are_dropped(self):
        auto = ("# Do not edit this file manually!\n"
                "# It will be overwritten by the ALTER SYSTEM command.\n"
                "pg_stride.finish_before_handoff = 'off'\n"
                "work_mem = '64MB'\n")
        text, dropped = pgserver.without_altered_settings(auto)
        self.assertEqual(dropped, ["pg_stride.finish_before_handoff = 'off'", "work_mem = '64MB'"])
        self.assertEqual(text, "# Do not edit this file manually!\n"
                               "# It will be overwritten by the ALTER SYSTEM command.\n")
        self.assertEqual(pgserver.without_altered_settings(text), (text, []))

    def test_others_cpu_leaves_the_server_out_and_folds_digits(self):
        # pid -> (command name, ppid, CPU s): the postmaster 100 and its backend 101, a
        # kernel thread per CPU, pgbench, and a process that started in between (300).
        before = {100: ("postgres", 1, 5.0), 101: ("postgres", 100, 2.0),
                  20: ("kworker/0:1", 2, 1.0), 21: ("kworker/1:0", 2, 1.0),
                  30: ("kdamond.0", 2, 10.0), 40: ("pgbench", 50, 0.5)}
        after = {100: ("postgres", 1, 6.0), 101: ("postgres", 100, 9.0),
                 20: ("kworker/0:1", 2, 1.25), 21: ("kworker/1:0", 2, 1.5),
                 30: ("kdamond.0", 2, 13.0), 40: ("pgbench", 50, 0.75),
                 300: ("sh", 1, 0.25)}
        got = pgserver.others_cpu(before, after, {100})
        self.assertAlmostEqual(got["total_s"], 4.25)
        self.assertEqual(got["top"], [["kdamond.N", 3.0], ["kworker/N:N", 0.75],
                                      ["pgbench", 0.25], ["sh", 0.25]])
        # pgbench ended in between: its CPU comes as this process's children's.
        del after[40]
        got = pgserver.others_cpu(before, after, {100}, children_s=0.5)
        self.assertAlmostEqual(got["total_s"], 4.5)
        self.assertEqual(got["top"][:2], [["kdamond.N", 3.0], ["kworker/N:N", 0.75]])
        self.assertIn(["pgbench and psql (the bench's children)", 0.5], got["top"])


class LibraryBuildTest(unittest.TestCase):
    """A debug build of pg_stride.so is told from a release one by its .debug_info."""

    @staticmethod
    def elf(sections: list) -> bytes:
        """A minimal 64-bit little-endian ELF file with these named sections."""
        names = b"\0" + b"".join(n.encode() + b"\0" for n in sections + [".shstrtab"])
        shoff = 64 + len(names)
        header = bytearray(64)
        header[:6] = b"\x7fELF\x02\x01"
        struct.pack_into("<Q", header, 0x28, shoff)
        struct.pack_into("<HHH", header, 0x3A, 64, len(sections) + 2, len(sections) + 1)
        table = bytearray(64)                               # the null section
        offset = 1
        for n in sections + [".shstrtab"]:
            sh = bytearray(64)
            struct.pack_into("<I", sh, 0, offset)
            struct.pack_into("<Q", sh, 0x18, 64)            # the names follow the header
            table += sh
            offset += len(n) + 1
        return bytes(header) + names + bytes(table)

    def test_debug_info_section(self):
        with tempfile.TemporaryDirectory() as d:
            debug, release = Path(d) / "debug.so", Path(d) / "release.so"
            debug.write_bytes(self.elf([".text", ".debug_abbrev", ".debug_info"]))
            release.write_bytes(self.elf([".text", ".debug_infox", ".data"]))
            self.assertTrue(pgserver.has_debug_info(debug))
            self.assertFalse(pgserver.has_debug_info(release))
            (Path(d) / "text.so").write_text("not an ELF file")
            with self.assertRaises(ValueError):
                pgserver.has_debug_info(Path(d) / "text.so")


class SpeedProbeTest(unittest.TestCase):
    def test_execution_times_of_explain_json(self):
        one = ('[\n  {\n    "Plan": {\n      "Node Type": "Aggregate"\n    },\n'
               '    "Planning Time": 0.120,\n    "Triggers": [\n    ],\n'
               '    "Execution Time": {}\n  }\n]')
        out = "\n".join(one.replace("{}", t) for t in ("41.250", "39.9", "40.002"))
        self.assertEqual(workload.probe_times(out), [41.25, 39.9, 40.002])
        self.assertEqual(workload.probe_times("SET"), [])

    def test_speed_rows_at_the_highest_load(self):
        meta = {"plan": {"alphas": [0.5, 0.95]}, "probe_ms": 40.0,
                "configs": {"stock": {"status": "ran"}, "stride": {"status": "ran"}},
                "open_loop": {"stock": {"0.95": {"probe_ms": [40.0, 48.0]},
                                        "0.5": {"probe_ms": [1.0, 1.0]}},
                              "stride": {"0.95": {}}}}
        self.assertEqual(report.speed_rows(meta), [("stock", 40.0, 48.0)])
        self.assertEqual(report.speed_rows({**meta, "probe_ms": None}), [])

    def test_the_denominators_pool_every_round_of_the_run(self):
        before = {"q01|short": {**analysis.latency_summary([0.010, 0.011, 0.012]),
                                "cpu_s": 0.011}}
        after = {"q01|short": {**analysis.latency_summary([0.005, 0.006, 0.013]),
                               "cpu_s": 0.009}}
        between = [{"after": "p1", "runs_s": {"q01|short": [0.004, 0.0045]}},
                   {"after": "p2", "runs_s": {"q01|short": [0.005, 0.0048]}}]
        meta = {"probe_ms": 72.5, "isolated": before, "isolated_between": between}
        others = cli.pool_denominators(meta, after, 62.3, 61.9)
        iso = meta["isolated"]["q01|short"]
        # 3 + 2 + 2 + 3 executions; their median, not a median of the sets' medians
        self.assertEqual(iso["runs"], 10)
        self.assertAlmostEqual(iso["median_s"], 0.0055)
        # the rates' CPU stays the first set's
        self.assertEqual(iso["cpu_s"], 0.011)
        den = meta["denominators"]
        self.assertEqual((den["rounds"], den["between"]),
                         (2 * (workload.SPREAD_ROUNDS + 1) + 2, 2))
        self.assertEqual([s["probe_ms"] for s in den["sets"]], [72.5, 62.3])
        # each set alone, untouched by the pooling, for the report's table
        self.assertEqual(sorted(others), ["after the open loop", "before the open loop"])
        self.assertEqual(others["before the open loop"]["q01|short"]["median_s"], 0.011)
        self.assertEqual(others["after the open loop"]["q01|short"]["median_s"], 0.006)
        # without rounds between the points: both sets pooled
        meta = {"probe_ms": 60.0, "isolated": before}
        cli.pool_denominators(meta, after, 61.8, 70.0)
        self.assertEqual(meta["isolated"]["q01|short"]["runs"], 6)
        self.assertAlmostEqual(meta["isolated"]["q01|short"]["median_s"], 0.0105)
        meta = {"plan": {"alphas": [0.95]}, "configs": {"a": {"status": "ran"},
                                                        "b": {"status": "ran"}},
                "open_loop": {"a": {"0.95": {"other_denominators": {
                    "after": {"short": {"mean": 1.2, "p99": 3.1}}}}},
                    "b": {"0.95": {}}}}
        self.assertEqual(report.other_denominator_rows(meta),
                         [("a", {"after": {"short": {"mean": 1.2, "p99": 3.1}}})])


class CalibrationTest(unittest.TestCase):
    """The rate calibration: the offered CPU share of an arrival sequence, the bisection
    for the rate, the check that a run sent the dry run's arrivals."""

    cost = {0: 0.01, 1: 0.05, 2: 2.5}          # script -> CPU seconds

    def synthetic(self, n=4000, seed=7):
        """A pgbench-like sequence: standard exponential gaps, scripts 3:3:1 (cheap,
        medium, one expensive long query)."""
        import random
        rnd = random.Random(seed)
        s, seq = 0.0, []
        for _ in range(n):
            seq.append((s, rnd.choice((0, 0, 0, 1, 1, 1, 2))))
            s += rnd.expovariate(1.0)
        return seq

    def test_arrival_sequence_in_mean_gaps(self):
        # scheduled arrivals at 100.0, 100.5, 101.25 s at rate 2/s: s = 0, 1, 2.5
        txns = analysis.parse_log_lines([line(0, 0, 250000, 1, 101.5), line(1, 0, 100000, 0, 100.1),
                                         line(2, 0, 50000, 2, 100.55)])
        seq = analysis.arrival_sequence(txns, 2.0)
        self.assertEqual([sc for _, sc in seq], [0, 2, 1])
        for (s, _), want in zip(seq, (0.0, 1.0, 2.5)):
            self.assertAlmostEqual(s, want, places=5)
        self.assertEqual(analysis.arrival_sequence([], 2.0), [])

    def test_offered_share(self):
        seq = [(0.0, 0), (1.0, 2), (2.0, 1), (3.0, 2), (4.5, 0)]
        # rate 1/s, window [0, 4): 0.01 + 2.5 + 0.05 + 2.5 over 4 s of 2 CPUs
        self.assertAlmostEqual(analysis.offered_share(seq, self.cost, 1.0, (0, 4), 2),
                               5.06 / 8)
        # window [1, 3): the arrivals at 1 and 2 s only
        self.assertAlmostEqual(analysis.offered_share(seq, self.cost, 1.0, (1, 3), 2),
                               2.55 / 4)
        # twice the rate: every arrival comes at half the time, all five within [0, 4)
        self.assertAlmostEqual(analysis.offered_share(seq, self.cost, 2.0, (0, 4), 2),
                               5.07 / 8)
        self.assertTrue(math.isnan(analysis.offered_share(seq, self.cost, 1.0, (3, 3), 2)))

    def test_calibrate_rate_regular_sequence(self):
        # one arrival per mean gap, each 0.5 CPU-s, 2 CPUs, window 10 s: share = r / 4
        seq = [(float(k), 0) for k in range(200)]
        cost = {0: 0.5}
        r = analysis.calibrate_rate(seq, cost, 0.9, (0.0, 10.0), 2, guess=1.0)
        self.assertAlmostEqual(r, 3.6, delta=0.1)
        self.assertAlmostEqual(analysis.offered_share(seq, cost, r, (0.0, 10.0), 2), 0.9,
                               delta=0.5 / 20)

    def test_calibrate_rate_follows_the_drawn_sequence(self):
        seq = self.synthetic()
        mean_c = (3 * 0.01 + 3 * 0.05 + 2.5) / 7
        for window in ((0.0, 60.0), (6.0, 57.0)):      # [0, T) and the measured window
            for alpha in (0.5, 0.95):
                nominal = alpha * 2 / mean_c
                r = analysis.calibrate_rate(seq, self.cost, alpha, window, 2, nominal)
                share = analysis.offered_share(seq, self.cost, r, window, 2)
                # within one long query of α (a step of the share)
                self.assertLessEqual(abs(share - alpha), 2.5 / ((window[1] - window[0]) * 2),
                                     (window, alpha, r, share))
                # the nominal rate offers what this sequence happens to need, not α
                self.assertNotAlmostEqual(
                    analysis.offered_share(seq, self.cost, nominal, window, 2), alpha, places=3)
        # a sequence that ends before the window does at the rate needed
        self.assertIsNone(analysis.calibrate_rate(seq[:100], self.cost, 0.95, (0.0, 60.0), 2,
                                                  5.0))

    def test_speed_scale_is_the_median_ratio_over_the_queries(self):
        first = {"q1|short": {"runs_s": [0.010, 0.012, 0.011]},
                 "q2|short": {"runs_s": [0.100]},
                 "q3|long": {"runs_s": [1.0, 1.0]},
                 "q4|long": {"runs_s": [2.0]}}
        # q1 0.9x, q2 0.9x, q3 3x (a slow spell in its round), q4 not measured again
        later = [{"q1|short": [0.0099], "q2|short": [0.09], "q3|long": [3.0]},
                 {"q1|short": [0.0099], "q2|short": [0.09]}]
        self.assertAlmostEqual(analysis.speed_scale(first, later), 0.9)
        self.assertIsNone(analysis.speed_scale(first, []))
        # a machine twice as slow halves the rate that offers α
        seq = [(float(k), 0) for k in range(200)]
        r1 = analysis.calibrate_rate(seq, {0: 0.5}, 0.9, (0.0, 10.0), 2, guess=1.0)
        r2 = analysis.calibrate_rate(seq, {0: 0.5 * 2.0}, 0.9, (0.0, 10.0), 2, guess=1.0)
        self.assertAlmostEqual(r2 / r1, 0.5, delta=0.05)

    def test_compare_sequences(self):
        dry = [(float(k), k % 5) for k in range(40)]
        real = [(s * 1.0001, sc) for s, sc in dry[:30]]         # a shorter run, same arrivals
        c = analysis.compare_sequences(dry, real, 10.0)
        self.assertTrue(c["equal"])
        self.assertEqual((c["compared"], c["in_place"], c["largest_swap"]), (30, 30, 1))
        self.assertAlmostEqual(c["max_time_error_s"], 29 * 0.0001 / 10)
        # two near-simultaneous arrivals in the other order: still the same arrivals
        swapped = list(real)
        swapped[7], swapped[8] = real[8], real[7]
        c = analysis.compare_sequences(dry, swapped, 10.0)
        self.assertTrue(c["equal"])
        self.assertEqual((c["in_place"], c["largest_swap"]), (28, 2))
        # another script at arrival 12: not the same sequence
        other = list(real)
        other[12] = (other[12][0], 4 if other[12][1] != 4 else 3)
        c = analysis.compare_sequences(dry, other, 10.0)
        self.assertFalse(c["equal"])
        self.assertEqual(c["first_mismatch"], 12)
        # a run longer than the dry run is not verified
        c = analysis.compare_sequences(dry[:20], real, 10.0)
        self.assertFalse(c["equal"])
        self.assertIsNone(c["first_mismatch"])

    def test_dry_workload_keeps_order_and_weights(self):
        from stride_bench.workload import Workload, dry_workload
        wl = Workload({("a", "short"): "x", ("b", "short"): "y", ("a", "long"): "z",
                       ("b", "long"): "w"})
        with tempfile.TemporaryDirectory() as d:
            dry = dry_workload(wl, Path(d))
            self.assertEqual(dry.script_info, wl.script_info)
            weights = [f.rsplit("@", 1)[1] for f in wl.pgbench_files()[1::2]]
            self.assertEqual([f.rsplit("@", 1)[1] for f in dry.pgbench_files()[1::2]], weights)
            for f in dry.pgbench_files()[1::2]:
                self.assertEqual(Path(f.rsplit("@", 1)[0]).read_text(), "SELECT 1;\n")

    def test_cpu_waits_charge_a_wait_to_what_ran_on_its_cpu(self):
        import cpu_waits

        def switch(cpu, t, prev, prev_pid, state, nxt, next_pid):
            return (f"  {prev} {prev_pid} [{cpu:03d}] {t:.6f}: sched:sched_switch: "
                    f"prev_comm={prev} prev_pid={prev_pid} prev_prio=120 prev_state={state} "
                    f"==> next_comm={nxt} next_pid={next_pid} next_prio=120\n")
        text = "".join([
            switch(0, 10.000, "swapper/0", 0, "R", "postgres", 100),
            switch(1, 10.000, "swapper/1", 0, "R", "postgres", 200),
            # the holder on CPU 0 is preempted by a kernel thread for 40 ms
            switch(0, 10.010, "postgres", 100, "R", "kdamond.0", 77),
            switch(0, 10.050, "kdamond.0", 77, "I", "postgres", 100),
            # CPU 1's process sleeps; it is woken 5 ms later and runs 1 ms after that
            switch(1, 10.020, "postgres", 200, "S", "swapper/1", 0),
            "  postgres 100 [000] 10.025000: sched:sched_wakeup: comm=postgres pid=200 "
            "prio=120 target_cpu=001\n",
            switch(1, 10.026, "swapper/1", 0, "R", "postgres", 200),
            switch(0, 10.060, "postgres", 100, "S", "swapper/0", 0),
        ])
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "switches.txt"
            path.write_text(text)
            runs, waits, span = cpu_waits.read(path)
        self.assertEqual(span, (10.0, 10.06))
        got = sorted((c, cpu, round(hi - lo, 6)) for c, cpu, lo, hi in waits)
        self.assertEqual(got, [("postgres", 0, 0.04), ("postgres", 1, 0.001)])
        starts = [r[0] for r in runs[0]]
        ran = cpu_waits.on_cpu(runs[0], starts, 10.010, 10.050)
        self.assertEqual(set(ran), {"kdamond.N"})
        self.assertAlmostEqual(ran["kdamond.N"], 0.04)
        idle = cpu_waits.on_cpu(runs[1], [r[0] for r in runs[1]], 10.025, 10.026)
        self.assertEqual(set(idle), {"idle"})
        self.assertAlmostEqual(idle["idle"], 0.001)

    def test_busy_between_interpolates_the_counters_and_needs_the_span_covered(self):
        # 2 CPUs, 200 jiffies a second: 50 busy a second up to t = 10, 190 after
        samples = [(float(t), 50 * min(t, 10) + 190 * max(0, t - 10), 200 * t)
                   for t in range(0, 21, 2)]
        self.assertAlmostEqual(analysis.busy_between(samples, 11.0, 17.0), 0.95)
        self.assertAlmostEqual(analysis.busy_between(samples, 1.0, 3.0), 0.25)
        self.assertAlmostEqual(analysis.busy_between(samples, 9.0, 11.0), 0.6)
        self.assertIsNone(analysis.busy_between(samples, 15.0, 21.0))
        self.assertIsNone(analysis.busy_between(samples, 5.0, 5.0))
        self.assertIsNone(analysis.busy_between([], 1.0, 2.0))

    def test_point_analysis_and_load_table(self):
        """A point's offered share and dry-run check from its logs, and the load table."""
        seq = self.synthetic(n=300, seed=3)
        rate, t0 = 5.0, 1000.0
        meta = {"plan": {"ol_duration": 20, "warmup_frac": 0.1, "clients": 64},
                "machine": {"ncpus": 2}, "rates": {"0.95": rate},
                "nominal_rates": {"0.95": 4.0},
                "script_info": {"0": ["q01", "short"], "1": ["q06", "short"],
                                "2": ["q01", "long"]},
                "isolated": {"q01|short": {"median_s": 0.01, "cpu_s": 0.01},
                             "q06|short": {"median_s": 0.05, "cpu_s": 0.05},
                             "q01|long": {"median_s": 1.0, "cpu_s": 2.5}},
                "calibration": {"dry_rate": 200.0, "window": [2.0, 17.0],
                                "points": {"0.95": {"calibrated": rate}}}}
        with tempfile.TemporaryDirectory() as d:
            rd = Path(d)
            (rd / "open_loop").mkdir()
            (rd / "calibration").mkdir()
            sent = [(s, sc) for s, sc in seq if s / rate < 19.0]
            (rd / "open_loop" / "ol_stock_a0.95.42").write_text("".join(
                line(k % 64, k, 20000, sc, t0 + s / rate + 0.02) + " 0\n"
                for k, (s, sc) in enumerate(sent)))
            (rd / "calibration" / "dry.43").write_text("".join(
                line(k % 64, k, 100, sc, t0 + s / 200.0 + 0.0001) + " 0\n"
                for k, (s, sc) in enumerate(seq)))
            # the machine 95 % busy from 1 s after the first arrival to 18 s after it,
            # 30 % before and after: the window [2, 17) sees 95 % alone
            first = t0 + sent[0][0] / rate
            busy_from, busy_to = first + 1.0, first + 18.0

            def jiffies(t):
                high = max(0.0, min(t, busy_to) - busy_from)
                return round(200 * (0.3 * (t - t0 + 3) + 0.65 * high)), round(200 * (t - t0 + 3))
            (rd / "open_loop" / "ol_stock_a0.95.cpu.csv").write_text("epoch,busy,total\n" + "".join(
                f"{t:.3f},{jiffies(t)[0]},{jiffies(t)[1]}\n"
                for t in (t0 - 3 + 0.5 * k for k in range(50))))
            dry = cli.dry_sequence(meta, rd)
            st = cli.analyse_open_loop(meta, rd, "stock", 0.95, dry)
            slower = {k: 2 * v for k, v in analysis.isolated_medians(meta["isolated"]).items()}
            halved = cli.analyse_open_loop(meta, rd, "stock", 0.95, dry, iso=slower)
        for cls in ("short", "long"):
            self.assertAlmostEqual(halved["classes"][cls]["slowdown"]["mean"],
                                   st["classes"][cls]["slowdown"]["mean"] / 2, places=9)
        self.assertAlmostEqual(st["machine_busy_window"], 0.95, places=2)
        self.assertTrue(st["sequence_check"]["equal"])
        self.assertEqual(st["sequence_check"]["compared"], len(sent))
        self.assertLess(st["sequence_check"]["max_time_error_s"], 0.001)
        cost = self.cost
        self.assertAlmostEqual(st["offered"]["run"], sum(cost[sc] for _, sc in sent) / 40,
                               places=6)
        self.assertAlmostEqual(st["offered"]["window"], analysis.offered_share(
            seq, cost, rate, (2.0, 17.0), 2), places=4)
        st.update({"rate": rate, "nominal_rate": 4.0,
                   "cpu": {"server_cpu_util": 0.9, "machine_busy": 0.93}})
        meta.update(configs={"stock": {"status": "ran"}}, open_loop={"stock": {"0.95": st}})
        rows = report.load_rows(meta)
        self.assertEqual(len(rows), 1)
        self.assertAlmostEqual(rows[0]["machine_window"], 0.95, places=2)
        self.assertTrue(rows[0]["calibrated"])
        self.assertEqual(rows[0]["sequence"], f"same {len(sent)}")
        st["sequence_check"]["equal"] = False
        st["sequence_check"]["first_mismatch"] = 4
        self.assertIn("differs from arrival 5", report.sequence_note(st))


class RepetitionsTest(unittest.TestCase):
    """Open-loop points repeated (bench/run --reps): the order each repetition runs in,
    the names of their logs, and the median and range the report gives."""

    def test_each_configuration_runs_once_in_every_position(self):
        configs = ["a", "b", "c"]
        orders = [cli.rep_order(configs, 0, rep) for rep in range(3)]
        self.assertEqual(orders[0], configs)
        self.assertEqual(orders[1], ["b", "c", "a"])
        for name in configs:
            self.assertEqual(sorted(order.index(name) for order in orders), [0, 1, 2], name)
        # every other load point reversed, as before repetitions, then rotated the same way
        self.assertEqual(cli.rep_order(configs, 1, 0), ["c", "b", "a"])
        self.assertEqual(cli.rep_order(configs, 1, 1), ["b", "a", "c"])
        self.assertEqual(cli.rep_order([], 0, 2), [])

    def test_a_repetition_is_analysed_from_its_own_logs(self):
        meta = {"script_info": {}, "isolated": {}, "rates": {"0.95": 1.0},
                "plan": {"ol_duration": 20, "warmup_frac": 0.1, "clients": 64}}
        read = []
        with mock.patch.object(analysis, "parse_logs", side_effect=lambda p: read.append(p) or []), \
                mock.patch.object(analysis, "open_loop_stats", return_value={}):
            cli.analyse_open_loop(meta, Path("/nonexistent"), "stock", 0.95, rep=2)
            cli.analyse_open_loop(meta, Path("/nonexistent"), "stock", 0.95)
        self.assertEqual([Path(p).name for p in read], ["ol_stock_a0.95_r3", "ol_stock_a0.95"])

    def test_the_first_repetition_keeps_the_name_of_a_run_without(self):
        self.assertEqual(cli.point_name("stock", 0.95), "ol_stock_a0.95")
        self.assertEqual(cli.point_name("stock", 0.95, 2), "ol_stock_a0.95_r3")

    @staticmethod
    def point(short_mean, short_p99, long_qps, rc=0):
        return {"rc": rc, "classes": {
            "short": {"slowdown": {"mean": short_mean, "p99": short_p99}},
            "long": {"slowdown": {"mean": 2.0}, "throughput_qps": long_qps}}}

    def test_median_and_range_over_the_repetitions(self):
        p = self.point
        meta = {"plan": {"reps": 3}, "configs": {"stock": {"status": "ran"},
                                                 "s": {"status": "ran"}},
                "open_loop": {"stock": {"0.95": p(9.0, 30.0, 1.0)},
                              "s": {"0.95": p(1.5, 4.0, 1.0)}},
                "open_loop_reps": {"stock": {"0.95": [p(8.0, 20.0, 2.0), p(10.0, 40.0, 1.0)]},
                                   "s": {"0.95": [p(1.2, 9.0, 1.0), p(1.9, 3.0, 0.9, rc=1)]}}}
        self.assertEqual([st["classes"]["short"]["slowdown"]["mean"]
                          for st in report.repetitions(meta, "s", "0.95").values()],
                         [1.5, 1.2, 1.9])
        rows = {r["config"]: r for r in report.rep_rows(meta)}
        s = rows["s"]
        # the failed third repetition is counted, and left out of the figures
        self.assertEqual((s["n"], s["failed"]), (3, 1))
        self.assertEqual(s["short_mean"], {"median": 1.35, "low": 1.2, "high": 1.5, "n": 2})
        self.assertEqual(s["short_p99"]["median"], 6.5)
        # throughput against stock's in the same repetition: 1/1, 1/2
        self.assertEqual((s["long_tput_rel"]["median"], s["long_tput_rel"]["low"]), (0.75, 0.5))
        lines = report.repetitions_section(meta)
        self.assertIn("| 0.95 | s | 3, 1 failed, left out | 1.35 (1.20–1.50) | 6.50 (4.00–9.00) | "
                      "2.00 (2.00–2.00) | 75.0 (50.0–100.0) |", lines)
        # a repetition that did not run leaves the others paired with stock's of the same
        # number: here the first did not, the second and third did (stored out of order)
        meta["open_loop"]["s"] = {}
        meta["open_loop_reps"]["s"]["0.95"] = [dict(p(1.0, 2.0, 2.0), rep=2),
                                               dict(p(1.0, 2.0, 0.5), rep=1)]
        self.assertEqual(list(report.repetitions(meta, "s", "0.95")), [1, 2])
        row = {r["config"]: r for r in report.rep_rows(meta)}["s"]
        # 0.5 / stock's second 2.0, 2.0 / stock's third 1.0
        self.assertEqual((row["n"], row["long_tput_rel"]["low"], row["long_tput_rel"]["high"]),
                         (2, 0.25, 2.0))
        self.assertEqual(report.spread([None, float("nan")]), None)
        self.assertEqual(report.spread([3.0, 1.0])["median"], 2.0)
        del meta["open_loop_reps"]
        self.assertEqual(report.repetitions_section(meta), [])

    def test_every_point_names_its_repetition(self):
        meta = {"open_loop": {"a": {"0.95": {"x": 0}}},
                "open_loop_reps": {"a": {"0.95": [{"x": 1}, {"x": 2, "rep": 3}]}}}
        self.assertEqual([(c, al, rep, st["x"]) for c, al, rep, st in report.every_point(meta)],
                         [("a", "0.95", 0, 0), ("a", "0.95", 1, 1), ("a", "0.95", 3, 2)])


class SimGapTest(unittest.TestCase):
    """bench/sim_gap.py: matching pgbench transactions with trace records, and the parts
    of the real-minus-simulated response adding up."""

    @staticmethod
    def row(arrival, finished_ms, **kw):
        r = {"arrival_epoch": arrival, "finished_ms": finished_ms, "admitted_ms": 0.0,
             "processes": 1.0, "workers_planned": 0.0, "cpu_ms": finished_ms / 2,
             "cpu_total_ms": finished_ms / 2 + 1, "paused_ms": 3.0, "handoff_ms": 0.5,
             "handoffs": 2.0, "held_ms": finished_ms / 2 + 2, "held_runqueue_ms": 1.0,
             "runqueue_ms": 2.5, "runqueue_before_slot_ms": 0.25, "paused_runqueue_ms": 0.5,
             "long_slice_ms": 0.0, "failed": False}
        r.update(kw)
        r["finish_epoch"] = r["arrival_epoch"] + r["finished_ms"] / 1000
        return r

    def test_each_transaction_takes_the_record_finishing_nearest_its_completion(self):
        # two statements finishing 3 ms apart, listed in the other order
        rows = [self.row(100.010, 50.0), self.row(100.001, 56.0)]
        txns = [analysis.Txn(0, 0, 0.0600, 100.0601, 0.0),
                analysis.Txn(1, 1, 0.0571, 100.0571, 0.0)]
        pairs = simgap.match(txns, rows)
        self.assertEqual(pairs, {0: 0, 1: 1})
        # a record that arrived before pgbench scheduled the transaction is not it
        early = [self.row(99.9, 160.0)]
        self.assertEqual(simgap.match(txns[:1], early), {})

    def test_parts_add_up_to_the_difference(self):
        rows = [self.row(100.0, 40.0)]
        txns = [analysis.Txn(0, 0, 0.045, 100.045, 0.0)]
        sim = [{"latency_ms": 25.0, "isolated_ms": 20.0}]
        res = simgap.account(txns, rows, {0: 0}, sim, ["short"], {0: ("q01", "short")},
                             {("q01", "short"): 0.020}, (99.0, 101.0))
        c = res["short"]
        self.assertAlmostEqual(sum(c["parts_ms"].values()), 45.0 - 25.0)
        self.assertAlmostEqual(sum(c["parts_sd"].values()), c["sd_real"] - c["sd_sim"])
        # run delay: 1.0 holding, 0.5 paused, so 1.0 without a slot and not paused
        self.assertAlmostEqual(c["parts_ms"]["unslotted_before"], 0.25)
        self.assertAlmostEqual(c["parts_ms"]["unslotted_after"], 0.75)
        self.assertAlmostEqual(c["parts_ms"]["paused_runnable"], 0.5)
        self.assertAlmostEqual(c["parts_ms"]["pre_base"], 5.0)
        self.assertAlmostEqual(c["parts_ms"]["pre"], 0.0)
        self.assertAlmostEqual(c["parts_ms"]["runqueue"], 1.0)
        self.assertAlmostEqual(c["parts_ms"]["asleep"], 1.0)    # held 22 - cpu 20 - 1
        # paused 3 - hand-off 0.5 - paused but runnable 0.5 - simulated wait 5
        self.assertAlmostEqual(c["parts_ms"]["extra_wait"], 3.0 - 0.5 - 0.5 - 5.0)


    def test_time_before_the_executor_splits_into_unloaded_and_added_by_load(self):
        # the same query twice, 5 and 9 ms between pgbench and the executor
        rows = [self.row(100.0, 40.0), self.row(100.2, 40.0)]
        txns = [analysis.Txn(0, 0, 0.045, 100.045, 0.0),
                analysis.Txn(1, 0, 0.049, 100.249, 0.0)]
        sim = [{"latency_ms": 25.0, "isolated_ms": 20.0}] * 2
        res = simgap.account(txns, rows, {0: 0, 1: 1}, sim, ["short"] * 2,
                             {0: ("q01", "short")}, {("q01", "short"): 0.020}, (99.0, 101.0))
        c = res["short"]
        self.assertAlmostEqual(c["parts_ms"]["pre_base"], 5.0)
        self.assertAlmostEqual(c["parts_ms"]["pre"], 2.0)       # (0 + 4) / 2
        self.assertAlmostEqual(sum(c["parts_ms"].values()), (45.0 + 49.0) / 2 - 25.0)

    def test_the_short_tail_takes_each_part_out_of_every_statement(self):
        # Three runs of one short query (isolated 10 ms): 20, 30 and 60 ms, the first
        # with 2 ms before the executor, the others 4 and 12; a long one is left out.
        rows = [self.row(100.0, 18.0, first_slot_ms=0.5),
                self.row(100.2, 26.0, paused_ms=10.0, first_slot_ms=4.0),
                self.row(100.4, 48.0, paused_ms=30.0, first_slot_ms=25.0),
                self.row(100.6, 500.0, first_slot_ms=1.0)]
        txns = [analysis.Txn(0, 0, 0.020, 100.020, 0.0), analysis.Txn(1, 0, 0.030, 100.230, 0.0),
                analysis.Txn(2, 0, 0.060, 100.460, 0.0), analysis.Txn(3, 1, 0.5, 101.1, 0.0)]
        pt = types.SimpleNamespace(
            pairs={0: 0, 1: 1, 2: 2, 3: 3}, txns=txns, rows=rows, window=(99.0, 101.0),
            script_info={0: ("q01", "short"), 1: ("q01", "long")},
            iso={("q01", "short"): 0.010, ("q01", "long"): 0.5})
        stmts = simgap.short_statements(pt)
        self.assertEqual([round(s["pre"], 6) for s in stmts], [0.0, 2.0, 10.0])
        self.assertAlmostEqual(simgap.without_part(stmts, None)[0], (2 + 3 + 6) / 3)
        mean, p99 = simgap.without_part(stmts, "paused_ms")
        self.assertAlmostEqual(mean, ((20 - 3) + (30 - 10) + (60 - 30)) / 30)
        self.assertAlmostEqual(p99, 2.0 + 0.98 * (3.0 - 2.0))    # 1.7, 2.0, 3.0
        self.assertAlmostEqual(simgap.without_part(stmts, "pre")[0], (2 + 2.8 + 5) / 3)
        w = simgap.first_slot_times(stmts)
        self.assertEqual((w["n"], w["over_10ms"]), (3, 1))
        self.assertEqual(simgap.untraced_short(pt), [])
        # the second run was not traced (it ran unscheduled), nor a failed one after it
        pt.pairs = {0: 0, 2: 2, 3: 3}
        pt.txns = txns + [analysis.Txn(4, 0, 0.050, 100.8, 0.0, failed=True)]
        self.assertEqual([round(s["lat"], 6) for s in simgap.short_statements(pt)], [20.0, 60.0])
        self.assertEqual([(q, round(sd, 6)) for q, sd in simgap.untraced_short(pt)],
                         [("q01", 3.0)])


    def test_class_groups_are_replayed_as_groups_of_their_own(self):
        cfg = {"settings": ["pg_stride.priority_initial = 500"],
               "class_groups": {"short": {"weight": 1000, "pinned": True},
                                "long": {"weight": 100}}}
        settings = simgap.sim_settings(cfg)
        self.assertEqual(settings["group-weight"], ["1=1000", "2=100"])
        rows = [self.row(100.0, 10.0, query_id="-2006676224149487872"), self.row(100.1, 40.0),
                self.row(100.2, 4.0, query_id="")]
        calls = []

        def fake_sim(cmd, **kw):
            calls.append(cmd)
            res = Path(cmd[cmd.index("--results") + 1])
            res.write_text("arrival_ms,latency_ms\n" + "0,1\n" * len(rows))

        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(simgap.subprocess, "run", fake_sim):
            out = simgap.replay(rows, ["short", "long", "other"], 100.0, settings, Path(d),
                                cfg=cfg)
            wl = (Path(d) / "replay_workload.csv").read_text().splitlines()
        self.assertEqual(len(out), 3)
        # group and pinned priority: the short statement's group keeps p0; the query
        # identifier, exact, as the fingerprint (0 without one)
        self.assertEqual([ln.split(",")[2:] for ln in wl[1:]],
                         [["1", "short", "1", "500", "-2006676224149487872"],
                          ["2", "long", "1", "0", "0"], ["0", "other", "1", "0", "0"]])
        cmd = calls[0]
        self.assertEqual([cmd[i + 1] for i, a in enumerate(cmd) if a == "--group-weight"],
                         ["1=1000", "2=100"])
        # a configuration without groups: everything in group 0, no --group-weight
        self.assertEqual(simgap.sim_settings({"settings": []})["group-weight"], [])
        # priorities start as predicted, as the extension's default; not with it off
        self.assertEqual(settings["start"], "predicted")
        off = simgap.sim_settings({"settings": ["pg_stride.predict = off"]})
        self.assertEqual(off["start"], "decay")


class TunerPhasesTest(unittest.TestCase):
    """The analysis and report of bench/run --tuner-phases."""

    iso = {("q01", "short"): 0.1, ("q06", "short"): 0.01,
           ("q01", "long"): 1.0, ("q06", "long"): 0.2}
    script_info = {0: ("q01", "short"), 1: ("q06", "short"), 2: ("q01", "long"),
                   3: ("q06", "long")}

    def test_phase_isolated_short_slot_from_the_large_scale(self):
        a = analysis.phase_isolated(self.iso, "short")
        self.assertEqual(a, self.iso)
        b = analysis.phase_isolated(self.iso, "long")
        self.assertEqual(b[("q01", "short")], 1.0)
        self.assertEqual(b[("q06", "short")], 0.2)
        self.assertEqual(b[("q06", "long")], 0.2)

    def test_phase_workloads_and_rates(self):
        from stride_bench import phases
        from stride_bench.workload import Workload
        scripts = {("q01", "short"): "s1", ("q06", "short"): "s6", ("q01", "long"): "l1",
                   ("q06", "long"): "l6"}
        wl = Workload(scripts)
        wls = phases.phase_workloads(wl, self.iso)
        self.assertEqual([n for n, _, _ in phases.PHASES], ["A", "B", "C"])
        self.assertIs(wls["A"][0], wl)
        self.assertIs(wls["C"][0], wl)
        wl_b, iso_b = wls["B"]
        # B: every slot runs the large-scale scripts, weights still 3:1
        self.assertEqual(wl_b.pgbench_files(), ["-f", "l1@3", "-f", "l6@3", "-f", "l1@1",
                                                "-f", "l6@1"])
        self.assertAlmostEqual(wl.mean_isolated(self.iso), 0.75 * 0.055 + 0.25 * 0.6)
        self.assertAlmostEqual(wl_b.mean_isolated(iso_b), 0.6)
        # same alpha: the rate falls by the ratio of the mean isolated latencies
        self.assertEqual(phases.phase_window(180), (0.0, 171.0))
        self.assertEqual(phases.phase_window(20), (0.0, 17.0))

    def test_rolling_mean(self):
        rows = [line(0, 0, 10000, 1, 100.01), line(1, 0, 30000, 1, 103.03),   # 1, 3
                line(2, 0, 200000, 0, 125.2),                                  # 2 (bucket 2)
                line(3, 0, 5000000, 2, 106.0),                                 # long
                "0 9 failed 1 104 0 0",
                line(4, 0, 10000, 1, 131.01)]                                  # past end
        txns = analysis.parse_log_lines(rows)
        r = analysis.rolling_mean(txns, self.script_info, self.iso, "short", 10.0, 100.0,
                                  end_s=30.0)
        self.assertEqual([b["t"] for b in r], [0.0, 10.0, 20.0])
        self.assertEqual([b["n"] for b in r], [2, 0, 1])
        self.assertAlmostEqual(r[0]["mean"], 2.0)
        self.assertTrue(math.isnan(r[1]["mean"]))
        self.assertAlmostEqual(r[2]["mean"], 2.0)
        r = analysis.rolling_mean(txns, self.script_info, self.iso, "long", 10.0, 100.0)
        self.assertEqual(len(r), 1)
        self.assertAlmostEqual(r[0]["mean"], 5.0)
        self.assertEqual(analysis.rolling_mean([], self.script_info, self.iso, "short",
                                               10.0, 0.0), [])

    def test_pooled_summary(self):
        s = analysis.pooled_summary([[1.0, 3.0], [2.0], []])
        self.assertEqual(s["n"], 3)
        self.assertAlmostEqual(s["mean"], 2.0)
        self.assertAlmostEqual(s["p50"], 2.0)

    def test_proc_stat_cpu_and_share(self):
        # the command name may hold spaces and parentheses
        stat = "4242 (postgres: pg (x) tuner) S 1 4242 4242 0 -1 4194304 100 0 0 0 " \
               "150 50 7 3 30 10 1 0 123 0 0"
        self.assertAlmostEqual(analysis.proc_stat_cpu_s(stat, 100), 2.0)
        self.assertAlmostEqual(analysis.cpu_share(2.0, 3.5, 300.0), 0.005)
        self.assertTrue(math.isnan(analysis.cpu_share(0.0, 1.0, 0.0)))
        from stride_bench.phases import proc_cpu
        import os
        self.assertIsNone(proc_cpu(None))
        self.assertGreaterEqual(proc_cpu(os.getpid()), 0.0)

    def test_merge_refreshes_and_phase_of(self):
        a = [{"refreshed_at": 10.0, "action": "search", "x": 1},
             {"refreshed_at": 20.0, "action": "shift check", "x": 2}]
        b = [{"refreshed_at": 20.0, "action": "shift check", "x": 99},
             {"refreshed_at": 15.0, "action": "search", "x": 3}]
        m = analysis.merge_refreshes(a, b)
        self.assertEqual([r["x"] for r in m], [1, 3, 2])
        self.assertIsNone(analysis.phase_of(5.0, [10.0, 20.0, 30.0]))
        self.assertEqual(analysis.phase_of(10.0, [10.0, 20.0, 30.0]), 0)
        self.assertEqual(analysis.phase_of(25.0, [10.0, 20.0, 30.0]), 1)
        self.assertEqual(analysis.phase_of(99.0, [10.0, 20.0, 30.0]), 2)

    def synthetic_meta(self):
        def phase(slow_short, slow_long, roll):
            return {"classes": {"short": {"slowdown": analysis.summarize(slow_short),
                                          "slowdowns": sorted(slow_short)},
                                "long": {"slowdown": analysis.summarize(slow_long),
                                         "slowdowns": sorted(slow_long)}},
                    "arrival_fingerprint": "3:abcd", "max_in_system": 4, "failed": 0,
                    "rolling_short": roll}

        def run(config, rep, k, refreshes):
            steps = [{"name": "p", "phase": None, "started": 1000.0},
                     {"name": "a", "phase": "A", "started": 1060.0},
                     {"name": "b", "phase": "B", "started": 1240.0},
                     {"name": "c", "phase": "C", "started": 1420.0}]
            roll = [{"t": 0.0, "n": 2, "mean": 2.0 * k}, {"t": 10.0, "n": 0,
                                                            "mean": float("nan")}]
            return {"config": config, "rep": rep, "steps": steps,
                    "cpu": {"server_cpu_util": 0.5, "machine_busy": 0.6}, "wall_s": 600.0,
                    "tuner": {"pid": 7, "pid_end": 7, "cpu_s": 0.6 * (k - 1),
                              "share_of_one_cpu": 0.001 * (k - 1)},
                    "scheduler_start": {"decay_lambda": 0.9, "decay_start": 0},
                    "scheduler_end": {"decay_lambda": 0.9, "decay_start": 0},
                    "refreshes": refreshes, "decay_timeline": [],
                    "phases": {p: phase([1.0 * k, 3.0 * k], [2.0 * k], roll)
                               for p in "ABC"}}
        ref = [{"at": 1100.0, "action": "search", "statements": 100, "finished": 98,
                "simulations": 100, "cpu_ms": 50.0, "old_lambda": 0.9, "old_decay_start": 0,
                "best_lambda": 0.95, "best_decay_start": 2, "new_lambda": 0.9,
                "new_decay_start": 0, "predicted_mean_before": 1.2,
                "predicted_mean_after": 1.19, "adopted": False, "reason": "gain below margin"}]
        return {"plan": {"mode": "phases"}, "machine": {}, "scales": {"short": 0.05,
                                                                      "long": 0.5},
                "phases": {"alpha": 0.95, "duration": 180, "prime_s": 60, "reps": 2,
                           "rates": {"A": 6.0, "B": 2.0, "C": 6.0},
                           "mean_isolated_s": {"A": 0.15, "B": 0.45, "C": 0.15},
                           "phases": [{"name": "A", "short_from": "short", "seed": 1},
                                      {"name": "B", "short_from": "long", "seed": 3},
                                      {"name": "C", "short_from": "short", "seed": 1}],
                           "runs": [run("stride-tuner", 0, 2, ref), run("stride-defaults", 0, 1, []),
                                    run("stride-defaults", 1, 1, []), run("stride-tuner", 1, 2, ref)]}}

    def test_report_tables(self):
        from stride_bench import tuner_report
        meta = self.synthetic_meta()
        self.assertEqual(tuner_report.configs_of(meta), ["stride-defaults", "stride-tuner"])
        rows = tuner_report.phase_table(meta)
        self.assertEqual([(r["phase"], r["class"]) for r in rows][:2],
                         [("A", "short"), ("A", "long")])
        short_a = rows[0]
        # pooled over two repetitions: 4 slowdowns each
        self.assertEqual(short_a["configs"]["stride-defaults"]["n"], 4)
        self.assertAlmostEqual(short_a["configs"]["stride-defaults"]["mean"], 2.0)
        self.assertAlmostEqual(short_a["ratios"]["stride-tuner"]["mean"], 2.0)
        roll = tuner_report.pooled_rolling(meta, "B")
        self.assertEqual(roll["stride-tuner"][0], (0.0, 4, 4.0))
        self.assertEqual(roll["stride-defaults"][1][1], 0)
        self.assertTrue(tuner_report.publishable(meta))
        meta["phases"]["duration"] = 20
        self.assertFalse(tuner_report.publishable(meta))
        md = tuner_report.markdown(meta)
        self.assertIn("| A | short | 4/4 | 2.00 | 4.00 | 2.000 |", md)
        self.assertIn("| A+40s | search | 100 (98) |", md)
        self.assertIn("0.100 %", md)                 # the tuner's CPU share
        self.assertIn("| A | 3:abcd | 3:abcd | 3:abcd | 3:abcd | yes |", md)
        self.assertIn("stride-tuner", tuner_report.compact(meta))
        pairs = tuner_report.rep_ratios(meta)
        self.assertEqual([rep for rep, _ in pairs], [0, 1])
        self.assertAlmostEqual(pairs[0][1][("B", "long")]["mean"], 2.0)
        self.assertIn("| 1 | 2.000 / 2.000 |", md)

    def test_tuner_config_is_the_baseline_with_the_tuner_on(self):
        from stride_bench import tuner_report
        cfg = {c["name"]: c for c in common.load_configs()["config"]}
        baseline, tuner = cfg[tuner_report.BASELINE], cfg["stride-tuner"]
        self.assertEqual([s for s in tuner["settings"] if "pg_stride.tuner" not in s],
                         baseline["settings"])
        self.assertIn("pg_stride.tuner = on", tuner["settings"])
        self.assertGreater(tuner.get("prime_s", 0), 0)


class PredictionCountsTest(unittest.TestCase):
    def test_a_point_counts_what_its_readings_differ_by(self):
        before = {"short_predicted_short": 5, "short_predicted_long": 1,
                  "long_predicted_short": 0, "long_predicted_long": 2, "unpredicted": 9,
                  "from_history": 7, "log2_error": [0] * 8 + [8] + [0] * 8}
        after = {"short_predicted_short": 35, "short_predicted_long": 1,
                 "long_predicted_short": 10, "long_predicted_long": 42, "unpredicted": 9,
                 "from_history": 77, "log2_error": [0] * 7 + [10, 64, 10] + [4] + [0] * 6}
        c = analysis.prediction_counts(before, after)
        self.assertEqual((c["short_predicted_short"], c["long_predicted_short"],
                          c["long_predicted_long"], c["from_history"]), (30, 10, 40, 70))
        self.assertEqual(sum(c["log2_error"]), 80)
        line = analysis.prediction_summary(c)
        # 30 of 30 short ones, 40 of 50 long ones; 76 of the 80 judged within 2x
        self.assertIn("predicted 80 (70 from history, 0 not)", line)
        self.assertIn("short as short 100%", line)
        self.assertIn("long as long 80%", line)
        self.assertIn("within 2x 95%", line)
        self.assertEqual(analysis.prediction_summary(None), "")


class AppPoolTest(unittest.TestCase):
    def test_a_load_that_was_no_point_scales_the_highest_points_rate(self):
        runner = types.SimpleNamespace(meta={"rates": {"0.5": 9.0, "0.95": 19.0}})
        self.assertEqual(cli.Runner.rate_at(runner, 0.5), 9.0)
        self.assertAlmostEqual(cli.Runner.rate_at(runner, 0.8), 16.0)

    def test_a_round_is_one_phrase(self):
        st = {"classes": {"short": {"slowdown": {"mean": 1.5, "p99": 4.0}},
                          "long": {"throughput_qps": 0.5}}}
        self.assertEqual(report.app_pool_phrase(st), "short 1.50 / 4.00, long 0.500 q/s")


class PoolClientsTest(unittest.TestCase):
    def test_a_rounds_first_statements_are_left_out(self):
        # Arrivals 0.0, 0.2, ..., 1.8 s, each taking 0.1 s: with 0.5 s left out, the
        # seven from 0.6 s on count, over the 1.4 s from 0.5 s to the last end (1.9 s).
        txns = [analysis.Txn(client=0, script=0, latency_s=0.1, end_s=100.0 + 0.2 * i + 0.1,
                             lag_s=0.0) for i in range(10)]
        lats, tps = pool.steady(txns, 0.5)
        self.assertEqual(len(lats), 7)
        self.assertAlmostEqual(tps, 7 / 1.4)

    def test_ways_are_compared_round_by_round(self):
        # Rounds whose speed moves (the machine) with the pool 10 % ahead in each: the
        # paired ratio is 1.1 exactly, with a zero-width interval, where the medians of the
        # rounds' rates would compare different rounds.
        base = {"tps_rounds": [1000.0, 500.0, 2000.0]}
        way = {"tps_rounds": [1100.0, 550.0, 2200.0]}
        self.assertEqual(pool.paired_tps(way, base), "1.100 [1.100–1.100]")
        self.assertEqual(pool.paired_tps(base, base), "")
        self.assertEqual(pool.paired_tps({"p50": 1.0}, base), "")

    def test_a_round_shorter_than_its_warm_up_is_an_error(self):
        txns = [analysis.Txn(client=0, script=0, latency_s=0.1, end_s=100.1, lag_s=0.0)]
        with self.assertRaises(RuntimeError):
            pool.steady(txns, 0.5)


class OltpTest(unittest.TestCase):
    def test_the_oltp_run_has_its_own_plan(self):
        plan = cli.make_plan("oltp")
        self.assertEqual((plan.parts, plan.reps, plan.oltp_duration), (["oltp"], 3, 30))

    def test_processes_are_told_apart_by_their_title(self):
        self.assertEqual(oltp.process_role("postgres: stride_app oltp [local] UPDATE\0"),
                         "transactions")
        self.assertEqual(oltp.process_role("postgres: stride_app tpch [local] SELECT"),
                         "analytics")
        self.assertEqual(oltp.process_role("postgres: parallel worker for PID 12"), "analytics")
        self.assertEqual(oltp.process_role("postgres: checkpointer "), "other")
        # a database named like the role's command is not mistaken for it
        self.assertEqual(oltp.process_role("postgres: oltp_admin tpch [local] idle"),
                         "analytics")

    def test_only_processes_alive_at_both_snapshots_count(self):
        k0 = dict.fromkeys(oltp.KERNEL_COUNTERS, 0)
        before = {1: ("transactions", 1_000_000, 500_000, k0), 2: ("analytics", 0, 0, k0),
                  3: ("analytics", 5_000_000_000, 0, k0)}
        after = {1: ("transactions", 3_000_000, 1_500_000, {**k0, "migrations": 4}),
                 3: ("analytics", 7_000_000_000, 10**9, k0),
                 4: ("analytics", 9 * 10**9, 0, {**k0, "migrations": 50})}
        got = oltp.time_by_role(before, after)
        self.assertEqual(got["transactions"]["migrations"], 4)
        self.assertEqual(got["analytics"]["migrations"], 0)
        self.assertAlmostEqual(got["transactions"]["cpu_s"], 0.002)
        self.assertAlmostEqual(got["transactions"]["runqueue_s"], 0.001)
        self.assertAlmostEqual(got["analytics"]["cpu_s"], 2.0)
        self.assertEqual(got["analytics"]["processes"], 1)

    def test_the_breakdown_divides_by_the_transactions_between_the_snapshots(self):
        T = analysis.Txn
        txns = [T(0, 0, 0.004, 100.5, 0.001), T(0, 0, 0.002, 101.0, 0.0),
                T(0, 0, 0.1, 99.0, 0.0),     # before the first snapshot
                T(0, 0, float("nan"), 100.7, 0.0, failed=True)]
        k0 = dict.fromkeys(oltp.KERNEL_COUNTERS, 0)
        k1 = {"migrations": 3, "voluntary_switches": 10, "involuntary_switches": 1,
              "system_ticks": 1, "user_ticks": 3}
        taken = [(100.0, {7: ("transactions", 0, 0, k0), 8: ("analytics", 0, 0, k0)}, 10.0),
                 (102.0, {7: ("transactions", 2_000_000, 1_000_000, k1),
                          8: ("analytics", 2 * 10**9, 10**9, k0)}, 13.002)]
        b = oltp.breakdown(taken, txns)
        self.assertEqual(b["transactions"], 2)
        self.assertAlmostEqual(b["latency_mean_ms"], 3.0)
        self.assertAlmostEqual(b["cpu_ms"], 1.0)
        self.assertAlmostEqual(b["runqueue_ms"], 0.5)
        self.assertAlmostEqual(b["lag_ms"], 0.5)
        self.assertAlmostEqual(b["asleep_ms"], 1.0)
        # 3 s of server CPU, 2 ms TPC-B's: the rest is analytics', a worker's included
        self.assertAlmostEqual(b["analytics_cpus"], 1.5)
        self.assertAlmostEqual(b["server_cpus"], 1.501)
        # the kernel's counters of TPC-B's backends, per transaction
        self.assertAlmostEqual(b["migrations_per_txn"], 1.5)
        self.assertAlmostEqual(b["voluntary_switches_per_txn"], 5.0)
        self.assertAlmostEqual(b["involuntary_switches_per_txn"], 0.5)
        self.assertAlmostEqual(b["system_share"], 0.25)
        self.assertIsNone(oltp.breakdown(taken[:1], txns))

    def test_a_process_without_the_kernels_counters_still_counts(self):
        k0 = dict.fromkeys(oltp.KERNEL_COUNTERS, 0)
        before = {7: ("transactions", 0, 0, None), 8: ("transactions", 0, 0, k0)}
        after = {7: ("transactions", 1_000_000, 0, k0),
                 8: ("transactions", 1_000_000, 0, {**k0, "migrations": 2})}
        got = oltp.time_by_role(before, after)["transactions"]
        self.assertEqual(got["processes"], 2)
        self.assertAlmostEqual(got["cpu_s"], 0.002)
        self.assertEqual(got["without_kernel_counters"], 1)
        T = analysis.Txn
        taken = [(100.0, before, 1.0), (102.0, after, 1.002)]
        b = oltp.breakdown(taken, [T(0, 0, 0.001, 101.0, 0.0)])
        self.assertAlmostEqual(b["cpu_ms"], 2.0)
        # one backend's counters missing: no per-transaction figure rather than half of one
        self.assertTrue(math.isnan(b["migrations_per_txn"]))
        self.assertTrue(math.isnan(b["system_share"]))

    def test_the_kernels_counters_are_read_from_proc(self):
        if not os.path.exists("/proc/self/sched"):
            self.skipTest("this kernel has no /proc/PID/sched (CONFIG_SCHED_DEBUG)")
        got = oltp.kernel_counters(os.getpid())
        self.assertEqual(set(got), set(oltp.KERNEL_COUNTERS))
        self.assertTrue(all(v >= 0 for v in got.values()))
        self.assertIsNone(oltp.kernel_counters(2 ** 22 + 1))

    def test_analytic_work_is_relative_to_stocks_in_the_same_round_and_form(self):
        def res(tps, p99, work):
            return {"tps": tps, "p99_ms": p99, "tpch": {"work_per_s": work}}
        meta = {"oltp": {"rounds": [
            {"alone_open": {"p99_ms": 2.0},
             "configs": {"stock": {"closed": res(100, 9, 2.0)},
                         "x": {"closed": res(120, 5, 1.0)}}},
            {"alone_open": {"p99_ms": 4.0},
             "configs": {"stock": {"closed": res(100, 9, 1.0)},
                         "x": {"closed": res(90, 5, 1.5)}}}]}}
        s = oltp.summary(meta)
        self.assertEqual(s["x"]["closed_analytics_vs_stock"], [0.5, 1.5])
        self.assertEqual(s["x"]["closed_tps"], [120, 90])
        self.assertEqual(s["(TPC-B alone, stock)"]["open_p99_ms"], [2.0, 4.0])
        self.assertEqual(oltp.spread([120, 90, 100]), "100 [90–120]")
        self.assertEqual(oltp.spread([0.5, 1.5]), "1.00 [0.50–1.50]")

    def test_the_cpu_budget_is_kept_per_form(self):
        def res(work, analytics_cpus, cpu_ms):
            return {"tps": 100, "p99_ms": 5, "tpch": {"work_per_s": work},
                    "breakdown": {"analytics_cpus": analytics_cpus, "cpu_ms": cpu_ms,
                                  "transactions_cpus": 1.2, "server_cpus": 1.9}}
        meta = {"oltp": {"rounds": [
            {"alone_open": {"p99_ms": 2.0},
             "configs": {"x": {"open": res(1.0, 0.5, 0.7), "closed": res(0.6, 0.4, 0.8)}}}]}}
        x = oltp.summary(meta)["x"]
        self.assertEqual(x["open_cpu_ms"], [0.7])
        self.assertEqual(x["closed_cpu_ms"], [0.8])
        self.assertAlmostEqual(x["closed_work_per_analytics_cpu"][0], 1.5)
        self.assertAlmostEqual(x["open_work_per_analytics_cpu"][0], 2.0)
        self.assertEqual(x["closed_server_cpus"], [1.9])
        self.assertEqual(oltp.spread([]), "—")


class InstructionsTest(unittest.TestCase):
    def test_a_valgrind_files_totals_are_read_by_event_name(self):
        import instructions
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "12345")
            Path(path).write_text("desc: I1 cache: 32768 B, 64 B, 8-way associative\n"
                                  "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\n"
                                  "fl=x.c\nfn=f\n3 9 1 0 4 1 0 2 0 0\n"
                                  "summary: 900 17 0 400 15 2 200 8 0\n")
            got = instructions.event_totals(path)
            self.assertEqual((got["Ir"], got["I1mr"], got["D1mr"], got["D1mw"]), (900, 17, 15, 8))
            # callgrind's files name one event and give totals
            Path(path).write_text("events: Ir\nfn=f\n1 5\ntotals: 77\n")
            self.assertEqual(instructions.event_totals(path), {"Ir": 77})
            Path(path).write_text("events: Ir\n")
            self.assertEqual(instructions.event_totals(path), {})

    def test_the_misses_table_gives_both_variants_and_their_ratio(self):
        import instructions
        label = "w"
        results = {(label, "not loaded", "misses"): {"I1mr": 100.0, "D1mr": 50.0, "D1mw": 0.0},
                   (label, "loaded", "misses"): {"I1mr": 104.0, "D1mr": 55.0, "D1mw": 1.0}}
        lines = instructions.misses_table([(label, [], 1, 2)], results)
        self.assertEqual(lines[-1], "| w | 100 → 104 (1.040) | 50 → 55 (1.100) | 0 → 1 |")


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
