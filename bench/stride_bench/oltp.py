"""bench/run --oltp: an application's transactions beside analytic queries on one server.

pgbench's TPC-B-like transaction stands for the application; TPC-H clients in a closed
loop (the open loop's mix of both scales) stand for the reports run beside it.  Two
forms, each beside the same analytic clients (psaroudakis2013 §7.2):

- open: TPC-B at a fixed rate (pgbench -R), a share of what TPC-B alone sustains on
  stock; a transaction's latency counts from its scheduled start, so time it waited
  for a free client counts, and its p99 is what the form measures;
- closed: TPC-B clients back to back; transactions per second is what it measures.

Each round runs every configuration once in each form, the configurations' order
rotating between rounds, plus TPC-B alone at the same rate on stock (the isolated p99
that the open form's is compared with).  The report gives the median and the range over
the rounds: p99 latency on 2 CPUs moves a lot between runs.

Where a transaction's time goes (`breakdown`): in the open form, each server process's
/proc/PID/schedstat (time on a CPU, time runnable but waiting for one) is read a few
seconds after the start and a few before the end; TPC-B's backends (those of the OLTP
database) against the transactions completed in between give CPU and run-queue wait
per transaction, and the rest of a transaction's latency is time it slept (on the
client, a lock, the WAL writer, or pg_stride).  pg_stride's own waits for slots and
admission show in pg_stride.scheduler and pg_stride.groups, read before and after."""

import json
import os
import statistics
import threading
import time
from pathlib import Path

from . import analysis, workload
from .common import IS_ROOT, PG_BIN, log
from .pgserver import _proc_stat, process_tree_cpu
from .workload import OLTP_DB, TPCH_DB

ANALYTIC_CLIENTS = 2
CLOSED_CLIENTS = 4
# The open form's client connections: enough that the rate is kept up whenever the
# server keeps up (a transaction takes well under a millisecond alone).
OPEN_CLIENTS = 8
# The open form's rate, as a share of the transactions per second TPC-B alone sustains
# on stock with CLOSED_CLIENTS clients.
RATE_SHARE = 0.3
DEFAULT_CONFIGS = ["stock", "pgbouncer", "stock-serial", "stride-defaults"]
# schedstat is read this long after the start and before the end of the open form
MARGIN_S = 3.0


# ---- per-process CPU and run-queue time -------------------------------------------

def schedstat(pid: int) -> tuple | None:
    """(ns on a CPU, ns runnable and waiting for a CPU) of process `pid`, or None."""
    try:
        f = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(f[0]), int(f[1])
    except (OSError, IndexError, ValueError):
        return None


# What the kernel did to a process, from /proc/PID/sched and /proc/PID/stat: moves to
# another CPU, context switches it asked for (it slept: a lock, a latch, the client) and
# ones it did not (preempted), and the clock ticks it spent in the kernel. Extra CPU per
# transaction that the instructions it runs do not explain shows here first: a process
# that changes CPU or is preempted more often starts on colder caches.
KERNEL_COUNTERS = ("migrations", "voluntary_switches", "involuntary_switches", "system_ticks",
                   "user_ticks")
SCHED_FIELDS = {"se.nr_migrations": "migrations", "nr_voluntary_switches": "voluntary_switches",
                "nr_involuntary_switches": "involuntary_switches"}


def kernel_counters(pid: int) -> dict | None:
    """KERNEL_COUNTERS of process `pid` so far; None once it has exited, or where the
    kernel does not show them (/proc/PID/sched needs CONFIG_SCHED_DEBUG)."""
    try:
        sched = Path(f"/proc/{pid}/sched").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        out = {}
        for line in sched.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in SCHED_FIELDS:
                out[SCHED_FIELDS[key.strip()]] = int(float(value))
        rest = stat[stat.rindex(")") + 2:].split()
        out["user_ticks"], out["system_ticks"] = int(rest[11]), int(rest[12])
    except (OSError, ValueError, IndexError):
        return None
    return out if len(out) == len(KERNEL_COUNTERS) else None


def process_role(cmdline: str) -> str:
    """What a server process does, from the title PostgreSQL gives it
    ("postgres: user db [local] COMMAND", "postgres: parallel worker for PID 123")."""
    words = cmdline.replace("\0", " ").split()
    db = words[2] if len(words) > 2 else None
    if db == OLTP_DB:
        return "transactions"
    if db == TPCH_DB or "parallel worker" in cmdline:
        return "analytics"
    return "other"


def server_processes(postmaster: int) -> dict:
    """pid -> role of every child of the postmaster now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _proc_stat(int(entry))
        if not st or st[0] != postmaster:
            continue
        try:
            out[int(entry)] = process_role(Path(f"/proc/{entry}/cmdline").read_text())
        except OSError:
            continue
    return out


def snapshot(postmaster: int) -> tuple:
    """(pid -> (role, ns on a CPU, ns waiting for one, kernel_counters or None) of the
    postmaster's children, the CPU seconds of the whole server so far, exited processes
    included). The kernel's counters are extra: a process without them still counts."""
    procs = {}
    for pid, role in server_processes(postmaster).items():
        s = schedstat(pid)
        if s:
            procs[pid] = (role, *s, kernel_counters(pid))
    return procs, process_tree_cpu([postmaster])


def time_by_role(before: dict, after: dict) -> dict:
    """Per role, the CPU and run-queue seconds between two snapshots of the processes
    alive at both (a parallel worker lives for one query, so these miss the workers that
    started or ended in between; TPC-B's backends live throughout)."""
    out = {}
    for pid, (role, cpu1, wait1, kernel1) in after.items():
        if pid not in before or before[pid][0] != role:
            continue
        r = out.setdefault(role, {"cpu_s": 0.0, "runqueue_s": 0.0, "processes": 0,
                                  **{k: 0 for k in KERNEL_COUNTERS}})
        r["cpu_s"] += (cpu1 - before[pid][1]) / 1e9
        r["runqueue_s"] += (wait1 - before[pid][2]) / 1e9
        r["processes"] += 1
        kernel0 = before[pid][3]
        if kernel0 is None or kernel1 is None:
            r["without_kernel_counters"] = r.get("without_kernel_counters", 0) + 1
            continue
        for k in KERNEL_COUNTERS:
            r[k] += kernel1[k] - kernel0[k]
    return out


class Snapshots:
    """Snapshots of the server's processes at MARGIN_S after entering and MARGIN_S
    before `duration` has passed, in a thread of its own."""

    def __init__(self, postmaster: int, duration: float):
        self.postmaster, self.duration = postmaster, duration
        self.taken = []

    def _run(self):
        for at in (MARGIN_S, self.duration - MARGIN_S):
            delay = self.t0 + at - time.monotonic()
            if self.stop.wait(max(0.0, delay)):
                return
            self.taken.append((time.time(), *snapshot(self.postmaster)))

    def __enter__(self):
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


def breakdown(taken: list, txns: list) -> dict | None:
    """Where TPC-B's transactions spent their time between the two snapshots: CPU and
    run-queue wait of its backends per transaction completed in between, against the
    mean latency of those transactions; the rest is time asleep."""
    if len(taken) != 2:
        return None
    (t0, s0, tree0), (t1, s1, tree1) = taken
    done = [t for t in txns if not t.failed and t0 <= t.end_s < t1]
    if not done:
        return None
    roles = time_by_role(s0, s1)
    tx = roles.get("transactions", {"cpu_s": 0.0, "runqueue_s": 0.0, "processes": 0})
    n = len(done)
    mean_ms = sum(t.latency_s for t in done) / n * 1000
    cpu_ms = tx["cpu_s"] / n * 1000
    rq_ms = tx["runqueue_s"] / n * 1000
    lag_ms = sum(t.lag_s for t in done) / n * 1000
    an = roles.get("analytics", {"cpu_s": 0.0, "runqueue_s": 0.0, "processes": 0})
    other = roles.get("other", {"cpu_s": 0.0})["cpu_s"]
    span = t1 - t0
    # the analytic queries' CPU, their parallel workers' included: the whole server's
    # but for TPC-B's backends and the server's own processes
    an_cpu = tree1 - tree0 - tx["cpu_s"] - other
    # The kernel's counters only where every TPC-B backend had them (else NaN, which the
    # report leaves out).
    counted = tx["processes"] > 0 and not tx.get("without_kernel_counters")
    ticks = tx.get("user_ticks", 0) + tx.get("system_ticks", 0)
    kernel = {f"{k}_per_txn": tx[k] / n if counted else float("nan")
              for k in KERNEL_COUNTERS[:3]}
    kernel["system_share"] = tx["system_ticks"] / ticks if counted and ticks else float("nan")
    return {**kernel, "transactions": n, "span_s": span, "latency_mean_ms": mean_ms,
            "cpu_ms": cpu_ms, "runqueue_ms": rq_ms,
            "lag_ms": lag_ms, "asleep_ms": mean_ms - cpu_ms - rq_ms - lag_ms,
            "analytics_cpus": an_cpu / span,
            "analytics_backends_runqueue_cpus": an["runqueue_s"] / span,
            "transactions_cpus": tx["cpu_s"] / span, "server_cpus": (tree1 - tree0) / span,
            "roles": roles}


# ---- pg_stride's own counters --------------------------------------------------------

COUNTERS_SQL = ("select row_to_json(c) from (select (select sum(admitted_total) "
                "from pg_stride.groups) as admitted, (select sum(queue_time_total_ms) "
                "from pg_stride.groups) as queue_time_ms, s.decisions, s.switches, "
                "s.yield_requests from pg_stride.scheduler s) c")


def stride_counters(server) -> dict | None:
    """Admissions, time queued for admission and scheduling decisions so far, when
    pg_stride runs (None otherwise)."""
    db = server.psql("show pg_stride.database", check=False)
    if not db:
        return None
    out = server.psql(COUNTERS_SQL, db=db, check=False)
    return json.loads(out) if out else None


def counters_delta(before: dict | None, after: dict | None) -> dict | None:
    if not before or not after:
        return None
    return {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))}


# ---- the forms ----------------------------------------------------------------------

def tpcb_client_class():
    """What runs in TPC-B's pgbench before it starts: as root, it enters the real-time
    class, as the open loop's generator does (workload.GENERATOR_FIFO): an application's
    clients run on machines of their own, and one that waits for a CPU here behind the
    server would add that wait to every transaction's latency."""
    if not IS_ROOT:
        return None
    return lambda: os.sched_setscheduler(0, os.SCHED_FIFO,
                                         os.sched_param(workload.GENERATOR_FIFO))


def tpcb_args(clients: int, duration: int, seed: int, prefix: Path, rate: float | None) -> list:
    args = ["-M", "simple", "-b", "tpcb-like", "-c", clients, "-j", 1, "-T", duration,
            f"--random-seed={seed}", "-l", f"--log-prefix={prefix}"]
    if rate:
        args += ["-R", f"{rate:.2f}"]
    return args


def beside_analytics(server, wl, tpch_conn: list, oltp_conn: list, duration: int,
                     rate: float | None, clients: int, seed: int, outdir: Path,
                     name: str) -> dict:
    """TPC-B (at `rate`, or closed loop when None) beside ANALYTIC_CLIENTS closed-loop
    TPC-H clients (none when `wl` is None), both for `duration` s; the TPC-B backends'
    time breakdown."""
    outdir.mkdir(parents=True, exist_ok=True)
    prefix_b, prefix_h = outdir / f"{name}_tpcb", outdir / f"{name}_tpch"
    for p in (prefix_b, prefix_h):
        workload.clear_logs(p)
    cmds = [("tpcb", [str(PG_BIN / "pgbench"), "-n", *map(str, tpcb_args(
        clients, duration, seed, prefix_b, rate)), *oltp_conn], tpcb_client_class())]
    if wl is not None:
        cmds.append(("tpch", [str(PG_BIN / "pgbench"), "-n", "-M", "simple", "-c",
                              str(ANALYTIC_CLIENTS), "-j", "1", "-T", str(duration),
                              f"--random-seed={seed}", "-l", f"--log-prefix={prefix_h}",
                              *wl.pgbench_files(), *tpch_conn], None))
    counters0 = stride_counters(server)
    with Snapshots(server.postmaster_pid(), duration) as snaps:
        rcs = workload.run_together(cmds, outdir, name, duration * 4 + 120)
    txns = analysis.parse_logs(str(prefix_b))
    ok = [t for t in txns if not t.failed]
    lat = [t.latency_s * 1000 for t in ok]
    res = {"rc": rcs, "tps": len(ok) / duration, "failed": len(txns) - len(ok),
           "p99_ms": analysis.percentile(lat, 99), "p50_ms": analysis.percentile(lat, 50),
           "mean_ms": statistics.fmean(lat) if lat else float("nan"),
           "stride": counters_delta(counters0, stride_counters(server))}
    res["breakdown"] = breakdown(snaps.taken, txns)
    if wl is not None:
        res["tpch"] = {"prefix": str(prefix_h)}
    return res


def run(runner) -> None:
    """The rounds; results in runner.meta["oltp"]."""
    p = runner.plan
    duration = p.oltp_duration
    outdir = runner.run_dir / "oltp"
    meta = runner.meta.setdefault("oltp", {"rounds": [], "duration": duration,
                                           "analytic_clients": ANALYTIC_CLIENTS,
                                           "closed_clients": CLOSED_CLIENTS,
                                           "open_clients": OPEN_CLIENTS,
                                           "rate_share": RATE_SHARE})
    stock = runner.stock()
    runner.use(stock)
    alone = beside_analytics(runner.server, None, None, runner.conn(stock, OLTP_DB), duration,
                             None, CLOSED_CLIENTS, runner.seed, outdir, "alone_closed")
    rate = RATE_SHARE * alone["tps"]
    meta.update(alone_tps=alone["tps"], rate=rate)
    log(f"transactions: TPC-B alone on stock, {CLOSED_CLIENTS} clients: {alone['tps']:.0f} "
        f"tps; the open form's rate: {rate:.0f}/s ({RATE_SHARE:.0%})")
    cfgs = list(runner.configs)
    for rnd in range(p.reps):
        order = cfgs[rnd % len(cfgs):] + cfgs[:rnd % len(cfgs)]
        row = {}
        runner.use(stock)
        iso = beside_analytics(runner.server, None, None, runner.conn(stock, OLTP_DB),
                               duration, rate, OPEN_CLIENTS, runner.seed + rnd, outdir,
                               f"alone_open_r{rnd + 1}")
        log(f"round {rnd + 1}/{p.reps}: TPC-B alone at {rate:.0f}/s: p99 {iso['p99_ms']:.2f} ms")
        for cfg in order:
            if not runner.use(cfg):
                continue
            got = {}
            for form, r, clients in (("open", rate, OPEN_CLIENTS), ("closed", None, CLOSED_CLIENTS)):
                name = f"{form}_{cfg['name']}_r{rnd + 1}"
                res = beside_analytics(runner.server, runner.workload_for(cfg),
                                       runner.conn(cfg, TPCH_DB), runner.conn(cfg, OLTP_DB),
                                       duration, r, clients, runner.seed + rnd, outdir, name)
                tpch = analysis.closed_loop_stats(analysis.parse_logs(res["tpch"]["prefix"]),
                                                  duration, runner.wl.script_info, runner.iso)
                res["tpch"].update(work_per_s=tpch.get("work_per_s", 0.0), qps=tpch["tps"])
                got[form] = res
                b = res.get("breakdown") or {}
                log(f"  {form:6s} {cfg['name']}: TPC-B {res['tps']:.0f} tps, p99 "
                    f"{res['p99_ms']:.2f} ms" + (
                        f" (per transaction: CPU {b['cpu_ms']:.3f}, run queue "
                        f"{b['runqueue_ms']:.3f}, asleep {b['asleep_ms']:.3f} ms; analytics "
                        f"on {b['analytics_cpus']:.2f} CPUs)" if b else "") +
                    f"; analytics {res['tpch']['work_per_s']:.2f} isolated-s/s")
            row[cfg["name"]] = got
        meta["rounds"].append({"alone_open": iso, "configs": row})
        runner.save()


# ---- the report ---------------------------------------------------------------------

# the breakdown's columns, in the report's order: the open form's (where a transaction's
# time goes) and the closed form's (where the CPUs go)
BREAKDOWN = ("latency_mean_ms", "cpu_ms", "runqueue_ms", "lag_ms", "asleep_ms", "analytics_cpus")
CPU_BUDGET = ("transactions_cpus", "cpu_ms", "analytics_cpus", "work_per_analytics_cpu", "server_cpus")
# the kernel's part (closed form): what happens to a TPC-B backend per transaction
KERNEL = ("migrations_per_txn", "voluntary_switches_per_txn", "involuntary_switches_per_txn",
          "system_share")


def spread(values: list) -> str:
    xs = [v for v in values if v == v]
    if not xs:
        return "—"
    med = statistics.median(xs)
    fmt = (lambda v: f"{v:.0f}") if med >= 100 else (lambda v: f"{v:.2f}")
    return f"{fmt(med)} [{fmt(min(xs))}–{fmt(max(xs))}]"


def summary(meta: dict) -> dict:
    """Per configuration, per figure, the values over the rounds; analytic work relative
    to stock's in the same round and form."""
    rounds = meta["oltp"]["rounds"]
    out = {}
    for rnd in rounds:
        stock = rnd["configs"].get("stock", {})
        for name, forms in rnd["configs"].items():
            f = out.setdefault(name, {})
            for form, res in forms.items():
                base = stock.get(form, {}).get("tpch", {}).get("work_per_s")
                work = res["tpch"]["work_per_s"]
                f.setdefault(f"{form}_tps", []).append(res["tps"])
                f.setdefault(f"{form}_p99_ms", []).append(res["p99_ms"])
                f.setdefault(f"{form}_analytics_vs_stock", []).append(
                    work / base if base else float("nan"))
                b = res.get("breakdown") or {}
                for k, v in b.items():
                    if k in BREAKDOWN or k in CPU_BUDGET or k in KERNEL:
                        f.setdefault(f"{form}_{k}", []).append(v)
                if b.get("analytics_cpus"):
                    f.setdefault(f"{form}_work_per_analytics_cpu", []).append(
                        work / b["analytics_cpus"])
    alone = out["(TPC-B alone, stock)"] = {"open_p99_ms": [r["alone_open"]["p99_ms"]
                                                           for r in rounds]}
    for r in rounds:
        for k, v in (r["alone_open"].get("breakdown") or {}).items():
            if k in BREAKDOWN and k != "analytics_cpus":
                alone.setdefault(f"open_{k}", []).append(v)
    return out


def write_report(meta: dict, path: Path) -> None:
    s = summary(meta)
    m = meta["oltp"]
    alone = statistics.median(s["(TPC-B alone, stock)"]["open_p99_ms"])
    lines = [
        "# Transactions beside analytics", "",
        f"`bench/run --oltp`, {meta['started']}, {len(m['rounds'])} rounds of {m['duration']} s "
        f"per form and configuration, configurations rotating; {meta['machine'].get('ncpus')} "
        f"CPUs, {meta['machine'].get('postgres')}, pg_stride "
        f"{meta['machine'].get('pg_stride_so_build', '?')} build. Every query is sent by the "
        "application role. Median [range] over the rounds.", "",
        f"- open form: TPC-B at {m['rate']:.0f} transactions/s ({m['rate_share']:.0%} of the "
        f"{m['alone_tps']:.0f} TPC-B alone sustained on stock with {m['closed_clients']} clients), "
        f"{m['open_clients']} connections, beside {m['analytic_clients']} TPC-H clients in a "
        "closed loop; latency from each transaction's scheduled start; TPC-B's pgbench in the "
        "real-time class when the bench runs as root, as a client on a machine of its own;",
        f"- closed form: {m['closed_clients']} TPC-B clients back to back beside the same "
        "TPC-H clients;",
        "- analytics: isolated-seconds of TPC-H work completed per second, against stock's in "
        "the same round and form.", "",
        f"TPC-B alone at the open form's rate, on stock: p99 {spread(s['(TPC-B alone, stock)']['open_p99_ms'])} ms.", "",
        "| configuration | open: TPC-B p99 ms | open: p99 / alone | open: analytics vs stock "
        "| closed: TPC-B tps | closed: analytics vs stock |",
        "|---|---:|---:|---:|---:|---:|"]
    names = [n for n in s if not n.startswith("(")]
    for n in names:
        f = s[n]
        lines.append(f"| {n} | {spread(f.get('open_p99_ms', []))} | "
                     f"{statistics.median(f['open_p99_ms']) / alone:.2f} | "
                     f"{spread(f.get('open_analytics_vs_stock', []))} | "
                     f"{spread(f.get('closed_tps', []))} | "
                     f"{spread(f.get('closed_analytics_vs_stock', []))} |")
    lines += ["", "## Where a transaction's time goes (open form)", "",
              "Per transaction, from the TPC-B backends' /proc/PID/schedstat between 3 s after "
              "the start and 3 s before the end: time on a CPU, time runnable but waiting for "
              "one, pgbench's schedule lag (a transaction waiting for a free connection), and "
              "the rest of the mean latency (asleep: the client's round trips, locks, the WAL "
              "writer, pg_stride). Analytics: CPUs its processes used on average.", "",
              "| configuration | mean latency ms | CPU ms | run queue ms | schedule lag ms "
              "| asleep ms | analytics CPUs |", "|---|---:|---:|---:|---:|---:|---:|"]
    for n in names + ["(TPC-B alone, stock)"]:
        f = s[n]
        lines.append(f"| {n} | " + " | ".join(spread(f.get(f"open_{k}", []))
                                           for k in BREAKDOWN) + " |")
    lines += ["", "## Where the CPUs go (closed form)", "",
              "From the same snapshots, in the closed form: CPUs used on average by TPC-B's "
              "backends, their CPU per transaction, CPUs used by the analytic queries (their "
              "workers included), the analytic work done per analytics CPU-second "
              "(isolated-seconds of TPC-H work per CPU-second: how efficiently the analytics "
              "use their CPU), and the whole server's CPUs. pgbench's own processes are not "
              "counted.", "",
              "| configuration | TPC-B tps | TPC-B backends' CPUs | CPU ms per transaction "
              "| analytics CPUs | analytic work per analytics CPU | server CPUs |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        f = s[n]
        lines.append(f"| {n} | {spread(f.get('closed_tps', []))} | " + " | ".join(
            spread(f.get(f"closed_{k}", [])) for k in CPU_BUDGET) + " |")
    lines += ["", "## What the kernel does to a transaction (closed form)", "",
              "Per TPC-B transaction, from its backends' /proc/PID/sched and /proc/PID/stat "
              "between the same snapshots: moves to another CPU, context switches the backend "
              "asked for (it slept) and ones it did not (preempted), and the share of its CPU "
              "time spent in the kernel. A backend that moves or is preempted more often "
              "starts on colder caches, which costs CPU that its instructions do not show.", "",
              "| configuration | migrations per 1000 | voluntary switches | involuntary switches "
              "| kernel share of CPU |", "|---|---:|---:|---:|---:|"]
    for n in names:
        f = s[n]
        lines.append(f"| {n} | " + " | ".join(
            spread([v * (1000 if k == "migrations_per_txn" else 1) for v in f.get(f"closed_{k}", [])])
            for k in KERNEL) + " |")
    path.write_text("\n".join(lines) + "\n")
