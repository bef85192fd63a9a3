"""Self-test of the benchmark's analysis code on synthetic pgbench logs.

Run with `bench/run --selftest` (or `cd bench && python3 -m tests.selftest`).  Needs no
server and no third-party module; ends with the line `N passed, N failed`.
"""

import math
import re
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

from stride_bench import analysis, queries
from stride_bench.common import BENCH


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


class StatsTest(unittest.TestCase):
    def test_percentile_linear_interpolation(self):
        xs = [4, 1, 3, 2]
        self.assertAlmostEqual(analysis.percentile(xs, 50), 2.5)
        self.assertAlmostEqual(analysis.percentile(xs, 99), 3.97)
        self.assertAlmostEqual(analysis.percentile(xs, 0), 1)
        self.assertAlmostEqual(analysis.percentile(xs, 100), 4)
        self.assertEqual(analysis.percentile([7], 95), 7)
        self.assertTrue(math.isnan(analysis.percentile([], 50)))

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
        res = analysis.isolated_latency(analysis.parse_log_lines(lines), skip_first=1)
        self.assertEqual(res["runs"], 5)
        self.assertAlmostEqual(res["median_s"], 0.011)
        self.assertAlmostEqual(res["max_s"], 0.013)

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
                       ("b", "long"): "w"}, ["a", "b"])
        iso = {("a", "short"): 0.01, ("b", "short"): 0.03, ("a", "long"): 1.0, ("b", "long"): 2.0}
        # 3/4 * mean(10, 30 ms) + 1/4 * mean(1, 2 s)
        self.assertAlmostEqual(wl.mean_isolated(iso), 0.75 * 0.02 + 0.25 * 1.5)
        files = wl.pgbench_files()
        self.assertEqual(files[1], "x@3")
        self.assertEqual(files[-1], "w@1")
        self.assertEqual(wl.script_info[2], ("a", "long"))

    def test_query_scripts_render(self):
        for q in queries.ALL:
            text = queries.render(q, "sf0_01", 0.01)
            self.assertNotIn("@", text, q)
            used = set(re.findall(r"(?<!:):([a-z][a-z0-9_]*)", text))
            defined = set(re.findall(r"^\\set (\w+)", text, re.M))
            self.assertTrue(used <= defined, f"{q}: undefined pgbench variables {used - defined}")

    def test_configs_table(self):
        with open(BENCH / "configs.toml", "rb") as fh:
            cfg = tomllib.load(fh)
        names = [c["name"] for c in cfg["config"]]
        self.assertEqual(names[:2], ["stock", "pgbouncer"])
        self.assertEqual(len(set(names)), len(names))
        for c in cfg["config"]:
            if c.get("library"):
                self.assertTrue(any("pg_stride" in s for s in c["settings"]), c["name"])


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
