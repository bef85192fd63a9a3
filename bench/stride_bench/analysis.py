"""Statistics over pgbench per-transaction logs.  Pure Python (no third-party imports)
so that the self-test runs anywhere in seconds.

pgbench's per-transaction log line (`-l`, PostgreSQL 15) is

    client_id transaction_no time script_no time_epoch time_us [schedule_lag]

where `time` is the latency in microseconds ("failed" or "skipped" instead of a number
for transactions that did not complete), time_epoch/time_us the completion time, and
schedule_lag (only with --rate) the time the transaction waited for a free client.  With
--rate, pgbench measures `time` from the transaction's *scheduled* start, so it is the
response time of an open-loop arrival: completion minus arrival.
"""

import glob
import math
import re
import zlib
from dataclasses import dataclass


@dataclass
class Txn:
    client: int
    script: int
    latency_s: float      # completion - scheduled arrival (nan when failed)
    end_s: float          # completion, Unix epoch seconds
    lag_s: float          # schedule lag (0 without --rate)
    failed: bool = False

    @property
    def arrival_s(self) -> float:
        return self.end_s - (0.0 if math.isnan(self.latency_s) else self.latency_s)


def parse_log_lines(lines) -> list:
    out = []
    for line in lines:
        f = line.split()
        if len(f) < 6:
            continue
        end = int(f[4]) + int(f[5]) / 1e6
        lag = int(f[6]) / 1e6 if len(f) > 6 else 0.0
        if f[2] in ("failed", "skipped", "serialization", "deadlock"):
            out.append(Txn(int(f[0]), int(f[3]), float("nan"), end, lag, failed=True))
        else:
            out.append(Txn(int(f[0]), int(f[3]), float(f[2]) / 1e6, end, lag))
    return out


def parse_logs(prefix: str) -> list:
    """All per-thread log files pgbench wrote for --log-prefix=prefix."""
    txns = []
    pat = re.compile(re.escape(prefix) + r"\.\d+(\.\d+)?$")
    for path in sorted(p for p in glob.glob(prefix + ".*") if pat.match(p)):
        with open(path) as fh:
            txns.extend(parse_log_lines(fh))
    txns.sort(key=lambda t: t.end_s)
    return txns


def percentile(values, p: float) -> float:
    """p-th percentile (0..100), linear interpolation between closest ranks (the
    default of numpy.percentile)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values) -> float:
    return percentile(values, 50)


def summarize(values) -> dict:
    xs = list(values)
    if not xs:
        return {"n": 0, "mean": float("nan"), "p50": float("nan"), "p95": float("nan"),
                "p99": float("nan"), "max": float("nan")}
    return {"n": len(xs), "mean": sum(xs) / len(xs), "p50": percentile(xs, 50),
            "p95": percentile(xs, 95), "p99": percentile(xs, 99), "max": max(xs)}


def geomean(values) -> float:
    xs = [v for v in values if v > 0]
    if not xs:
        return float("nan")
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


# Two-sided 95 % quantiles of Student's t by degrees of freedom (pairs - 1); between two
# entries the lower one's (the wider interval), 1.96 beyond the last.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
       11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09,
       20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00, 120: 1.98}


def t95(df: int) -> float:
    """Student's t two-sided 95 % quantile for `df` degrees of freedom (df >= 1)."""
    below = [k for k in T95 if k <= df]
    return T95[max(below)] if df <= 120 else 1.96


def ratio_interval(ratios) -> tuple:
    """Paired ratios (one per round, both sides measured in it): their geometric mean and
    its 95 % confidence interval, Student's t on the log ratios, as (mean, low, high).
    Rounds move together on a shared machine, so the ratio within a round is what is
    compared; the interval is NaN with fewer than two ratios."""
    logs = [math.log(r) for r in ratios]
    if not logs:
        return (float("nan"),) * 3
    mean = sum(logs) / len(logs)
    if len(logs) < 2:
        return (math.exp(mean), float("nan"), float("nan"))
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t95(len(logs) - 1) * sd / math.sqrt(len(logs))
    return (math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def isolated_latency(rounds, skip_first: int = 1) -> dict:
    """Isolated latency from single-client runs (`rounds`: one list of transactions per
    run, each on a connection of its own): median of the executions after each run's
    first `skip_first` (warm-up: a new connection's caches are cold)."""
    runs = []
    for txns in rounds:
        ok = [t.latency_s for t in sorted(txns, key=lambda t: t.end_s) if not t.failed]
        runs += ok[skip_first:] if len(ok) > skip_first else ok
    return latency_summary(runs)


def isolated_medians(isolated: dict) -> dict:
    """(query, class) -> isolated latency in seconds, from the run's "query|class" ->
    summary form (results.json's "isolated")."""
    return {tuple(k.split("|")): v["median_s"] for k, v in isolated.items()}


def latency_summary(runs: list) -> dict:
    """An isolated latency from its counted executions (seconds): their median, the
    denominator of the query's slowdowns, with the executions themselves."""
    return {"median_s": median(runs), "runs": len(runs), "min_s": min(runs) if runs else
            float("nan"), "max_s": max(runs) if runs else float("nan"), "runs_s": list(runs)}


def max_in_system(txns) -> int:
    """Largest number of arrivals that had arrived and not yet completed at once."""
    events = []
    for t in txns:
        if t.failed:
            continue
        events.append((t.arrival_s, 1))
        events.append((t.end_s, -1))
    events.sort(key=lambda e: (e[0], e[1]))   # completions before arrivals at a tie
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def open_loop_stats(txns, script_info, isolated, warmup_s: float = 0.0,
                    end_s: float | None = None) -> dict:
    """Slowdown statistics of one open-loop run, per class.

    script_info: script_no -> (query, class); isolated: (query, class) -> seconds.
    Only arrivals scheduled in [t0 + warmup_s, t0 + end_s) count, t0 being the first
    arrival: the system starts empty, and pgbench -T ends each run at a slightly
    different point after t0 (its clock starts before the clients have connected), so
    the measured window ends early enough to hold the same arrivals in every run.
    Slowdown = response time / isolated latency of the same query and scale.
    Throughput of a class = its completions / (last completion - first arrival of the
    measured window), in queries per second.
    """
    if not txns:
        return {"classes": {}, "failed": 0, "n": 0}
    t0 = min(t.arrival_s for t in txns)
    hi = float("inf") if end_s is None else t0 + end_s
    measured = [t for t in txns if t0 + warmup_s <= t.arrival_s < hi]
    failed = sum(1 for t in measured if t.failed)
    ok = [t for t in measured if not t.failed]
    classes = {}
    by_class = {}
    for t in ok:
        q, cls = script_info[t.script]
        by_class.setdefault(cls, []).append((t, q))
    for cls, items in sorted(by_class.items()):
        slow = [t.latency_s / isolated[(q, cls)] for t, q in items]
        lat = [t.latency_s for t, _ in items]
        first = min(t.arrival_s for t, _ in items)
        last = max(t.end_s for t, _ in items)
        span = last - first
        per_query = {}
        for (t, q), s in zip(items, slow):
            per_query.setdefault(q, []).append(s)
        classes[cls] = {
            "slowdown": summarize(slow),
            "slowdown_geomean": geomean(slow),
            "latency": summarize(lat),
            "throughput_qps": len(items) / span if span > 0 else float("nan"),
            "work_s": sum(isolated[(q, cls)] for _, q in items),
            "per_query_mean_slowdown": {q: sum(v) / len(v) for q, v in sorted(per_query.items())},
            "slowdowns": sorted(slow),
        }
    # Fingerprint of the arrival sequence (script per arrival, in arrival order): equal
    # fingerprints show that two runs saw the same arrivals.
    seq = ",".join(str(t.script) for t in sorted(measured, key=lambda t: t.arrival_s))
    return {
        "classes": classes,
        "arrival_fingerprint": f"{len(measured)}:{zlib.crc32(seq.encode()):08x}",
        "window_s": [warmup_s, end_s],
        "failed": failed,
        "n": len(ok),
        "max_in_system": max_in_system(ok),
        "max_lag_s": max((t.lag_s for t in ok), default=0.0),
        "first_arrival": t0,
        "last_completion": max(t.end_s for t in txns),
    }


# ---- the offered load of an arrival sequence (rate calibration) -------------------------
#
# pgbench (one thread, --rate) draws each arrival's script and its Poisson gap from two
# per-thread random streams, in arrival order: for a given seed, client count and -f list
# the scripts form one fixed sequence whatever the rate, and arrival k comes S_k / rate
# after the start, S_k a sum of standard exponential draws.  A "dry" run at any rate gives
# both; the functions below find the rate at which that sequence offers a given share of
# the machine's CPU.

def arrival_sequence(txns, rate: float) -> list:
    """[(s, script)] per arrival in arrival order, s = (arrival - first arrival) x rate:
    the arrival's position in units of the mean gap, the same at every rate.  A failed
    arrival has no logged latency and is placed at its completion."""
    arr = sorted((t.arrival_s, t.script) for t in txns)
    if not arr:
        return []
    t0 = arr[0][0]
    return [((a - t0) * rate, s) for a, s in arr]


def offered_share(seq: list, cost: dict, rate: float, window: tuple, cpus: int) -> float:
    """CPU the arrivals of `seq` (from arrival_sequence) that fall in `window` (seconds
    after the first arrival, [start, end)) need at `rate`, as a share of the machine's
    capacity over the window: sum of cost[script] / ((end - start) x cpus)."""
    lo, hi = window
    if hi <= lo or rate <= 0:
        return float("nan")
    need = sum(cost[sc] for s, sc in seq if lo <= s / rate < hi)
    return need / ((hi - lo) * cpus)


def calibrate_rate(seq: list, cost: dict, alpha: float, window: tuple, cpus: int,
                   guess: float, rel_tol: float = 1e-6) -> float | None:
    """The rate at which the arrivals of `seq` in `window` offer the share α of the
    machine (offered_share = α), found by bisection from `guess`.  The share is a step
    function of the rate (an arrival enters the window at each step; with a warm-up
    before the window an early one may also leave it, so it is not quite monotone):
    the bisection keeps share(lo) < α <= share(hi) and returns whichever end is nearer to
    α, so the share is α to within one arrival's CPU.  None when `seq` ends before the
    window does at the rate needed: the dry run was too short."""
    if not seq or alpha <= 0:
        return None
    cover = seq[-1][0] / window[1]       # highest rate whose window `seq` covers

    def share(r):
        return offered_share(seq, cost, r, window, cpus)

    hi = min(guess, cover)
    while share(hi) < alpha:
        if hi >= cover:
            return None
        hi = min(hi * 1.5, cover)
    lo = hi
    for _ in range(200):
        if share(lo) < alpha:
            break
        lo /= 1.5
    else:
        return lo
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        if share(mid) < alpha:
            lo = mid
        else:
            hi = mid
    return min((lo, hi), key=lambda r: abs(share(r) - alpha))


def speed_scale(first: dict, later: list) -> float | None:
    """How much longer the machine takes now than when `first` was measured: over the
    queries, the median of (median latency in the rounds `later` / median latency in
    `first`).  `first`: "query|class" -> isolated latency summary (with "runs_s");
    `later`: rounds, each "query|class" -> its executions (s).  None without a query
    measured in both.  The median over the queries keeps a spell that slowed one
    query's executions from moving it."""
    ratios = []
    for k, v in first.items():
        runs = [x for rnd in later for x in rnd.get(k, [])]
        then = median(v["runs_s"]) if v.get("runs_s") else 0.0
        if runs and then > 0:
            ratios.append(median(runs) / then)
    return median(ratios) if ratios else None


def compare_sequences(dry: list, real: list, rate: float, max_swap: int = 8) -> dict:
    """Does a run send the arrivals the dry run predicted?  `dry` and `real` are
    arrival_sequence()s (the real one at the rate it ran).  Compares the scripts of the
    first min(len) arrivals in order, allowing arrivals to trade places within groups of
    at most `max_swap`: the logs give a scheduled arrival only as completion - latency,
    and when pgbench handles a whole transaction in one pass of its state machine (SELECT
    1 answered before pgbench looks; 10-20 % of the dry run's) it measures the latency
    from a clock reading taken at the start, so that arrival shows up late by the
    transaction's time: usually 0.1 ms, a few ms when pgbench was preempted.  Two
    different sequences stop agreeing as multisets at once, so the groups grow past
    `max_swap` within a few arrivals.  Also the arrival times: median and max |dry -
    real| in seconds at `rate`."""
    n = min(len(dry), len(real))
    diff, start, largest, first_bad = {}, 0, 1, None
    for k in range(n):
        for sc, d in ((dry[k][1], 1), (real[k][1], -1)):
            diff[sc] = diff.get(sc, 0) + d
            if diff[sc] == 0:
                del diff[sc]
        if not diff:
            largest = max(largest, k - start + 1)
            start = k + 1
        elif k - start + 1 > max_swap:
            first_bad = start
            break
    err = sorted(abs(dry[k][0] - real[k][0]) / rate for k in range(n))
    return {"compared": n, "real_arrivals": len(real), "dry_arrivals": len(dry),
            "equal": first_bad is None and n == len(real), "first_mismatch": first_bad,
            "in_place": sum(1 for k in range(n) if dry[k][1] == real[k][1]),
            "largest_swap": largest,
            "median_time_error_s": median(err) if err else float("nan"),
            "max_time_error_s": err[-1] if err else float("nan")}


def closed_loop_stats(txns, duration_s: float, script_info=None, isolated=None) -> dict:
    """Throughput and latency of a closed-loop run (mixed workload, overhead runs)."""
    ok = [t for t in txns if not t.failed]
    lat = [t.latency_s for t in ok]
    res = {"n": len(ok), "failed": sum(1 for t in txns if t.failed),
           "tps": len(ok) / duration_s if duration_s > 0 else float("nan"),
           "latency": summarize(lat)}
    if script_info is not None and isolated is not None:
        per = {}
        for t in ok:
            q, cls = script_info[t.script]
            per.setdefault(cls, []).append((q, t.latency_s))
        res["classes"] = {
            cls: {"qps": len(v) / duration_s,
                  "work_per_s": sum(isolated[(q, cls)] for q, _ in v) / duration_s,
                  "slowdown": summarize([l / isolated[(q, cls)] for q, l in v])}
            for cls, v in sorted(per.items())}
        res["work_per_s"] = sum(c["work_per_s"] for c in res["classes"].values())
    return res


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# ---- the tuner phases run (bench/run --tuner-phases) ---------------------------------

def phase_isolated(isolated: dict, short_from: str) -> dict:
    """Isolated latencies keyed (query, class) for a phase whose "short" arrivals run the
    queries of class `short_from` ("short": the usual mix; "long": phase B, where the
    short slot draws from the large scale).  The long class is unchanged."""
    out = {}
    for (q, cls), v in isolated.items():
        if cls == "long":
            out[(q, "long")] = v
            out[(q, "short")] = isolated[(q, short_from)]
    return out


def pooled_summary(slowdown_lists) -> dict:
    """summarize() of several runs' slowdowns taken together (the repetitions of a
    point); `slowdown_lists` is an iterable of lists."""
    xs = [v for lst in slowdown_lists for v in lst]
    return summarize(xs)


def rolling_mean(txns, script_info, isolated, cls: str, bucket_s: float, t0: float,
                 end_s: float | None = None) -> list:
    """Mean slowdown of class `cls` per `bucket_s`-second bucket of *arrival* time after
    t0 (arrivals from end_s on are left out): [{"t": bucket start, "n", "mean"}], one
    entry per bucket up to the last one with an arrival, empty buckets with n 0."""
    buckets = {}
    for t in txns:
        if t.failed:
            continue
        q, c = script_info[t.script]
        rel = t.arrival_s - t0
        if c != cls or rel < 0 or (end_s is not None and rel >= end_s):
            continue
        buckets.setdefault(int(rel // bucket_s), []).append(t.latency_s / isolated[(q, c)])
    if not buckets:
        return []
    return [{"t": b * bucket_s, "n": len(buckets.get(b, [])),
             "mean": (sum(buckets[b]) / len(buckets[b])) if buckets.get(b) else float("nan")}
            for b in range(max(buckets) + 1)]


def proc_stat_cpu_s(text: str, clk_tck: int) -> float:
    """utime + stime, in seconds, from the text of /proc/<pid>/stat (the process's own
    CPU; the command name may hold spaces and parentheses)."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(rest[11]) + int(rest[12])) / clk_tck


def command_kind(name: str) -> str:
    """A process's command name with its digits folded (kworker/1:2 -> kworker/N:N), so
    that the threads and processes of one kind add up."""
    return re.sub(r"\d+", "N", name)


def busy_between(samples, lo: float, hi: float) -> float | None:
    """Share of the machine's CPU that was busy between epoch times lo and hi, from
    samples (epoch, busy jiffies, total jiffies) of the cumulative counters in time order,
    each end's counters interpolated between the samples around it; None when the samples
    do not cover [lo, hi]."""
    if not samples or hi <= lo or lo < samples[0][0] or hi > samples[-1][0]:
        return None

    def at(t):
        for (t0, b0, n0), (t1, b1, n1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                x = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return b0 + x * (b1 - b0), n0 + x * (n1 - n0)
        raise ValueError(t)

    (b0, n0), (b1, n1) = at(lo), at(hi)
    return (b1 - b0) / (n1 - n0) if n1 > n0 else None


def read_busy_samples(path) -> list:
    """The samples a MachineSampler wrote: [(epoch, busy, total)]."""
    with open(path) as f:
        next(f)
        return [(float(t), int(b), int(n)) for t, b, n in
                (line.strip().split(",") for line in f if line.strip())]


def cpu_share(cpu0_s: float, cpu1_s: float, wall_s: float) -> float:
    """CPU seconds used between two readings as a share of one CPU over wall_s."""
    return (cpu1_s - cpu0_s) / wall_s if wall_s > 0 else float("nan")


def merge_refreshes(rows: list, new: list) -> list:
    """Union of tuner-view readings (the view keeps the last 64 refreshes), one row per
    (refreshed_at, action), in time order."""
    seen = {(r["refreshed_at"], r["action"]): r for r in rows}
    for r in new:
        seen.setdefault((r["refreshed_at"], r["action"]), r)
    return sorted(seen.values(), key=lambda r: (r["refreshed_at"], r["action"]))


def phase_of(t: float, starts: list) -> int | None:
    """Index of the phase running at epoch time t, given the phases' start times in
    order (None before the first)."""
    idx = None
    for i, s in enumerate(starts):
        if t >= s:
            idx = i
    return idx


def prediction_counts(before: dict, after: dict) -> dict:
    """What pg_stride.prediction_quality counted between two readings: the class
    counts, and log2_error as a list of 17 counts (-8 .. 8)."""
    keys = ("short_predicted_short", "short_predicted_long", "long_predicted_short",
            "long_predicted_long", "unpredicted", "from_history")
    out = {k: after[k] - before[k] for k in keys}
    out["log2_error"] = [a - b for a, b in zip(after["log2_error"], before["log2_error"])]
    return out


def prediction_summary(counts: dict | None) -> str:
    """One log phrase: how many statements were predicted, short ones predicted short,
    long ones long, and predictions within a factor of 2 of the CPU used."""
    if not counts:
        return ""
    short = counts["short_predicted_short"] + counts["short_predicted_long"]
    long_ = counts["long_predicted_short"] + counts["long_predicted_long"]
    judged = short + long_
    close = sum(counts["log2_error"][7:10])

    def pct(n, d):
        return f"{100 * n / d:.0f}%" if d else "-"
    return (f"  predicted {judged} ({counts['from_history']} from history, "
            f"{counts['unpredicted']} not): short as short {pct(counts['short_predicted_short'], short)}, "
            f"long as long {pct(counts['long_predicted_long'], long_)}, within 2x {pct(close, judged)}")
