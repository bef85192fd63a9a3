"""The experiments: isolated latencies, the open-loop sweep, the mixed OLTP + analytics
workload and the overhead runs.  Each one drives pgbench and keeps its per-transaction
logs under the run directory."""

import contextlib
import math
import os
import re
import signal
import statistics
import subprocess
import time
from pathlib import Path

from . import analysis
from .common import IS_ROOT, PG_BIN, log
from .pgserver import CpuMeter, MachineSampler, Server

TPCH_DB = "tpch"
OLTP_DB = "oltp"

# Share of arrivals per class (wagner2021 §5.1: SF3 picked three times as often as SF30).
CLASS_WEIGHT = {"short": 3, "long": 1}


def clear_logs(prefix: Path):
    """Removes the per-thread logs (PREFIX.N, PREFIX.N.M) of an earlier pgbench run with
    --log-prefix=PREFIX, so that parse_logs reads this run's only."""
    for old in prefix.parent.glob(prefix.name + ".*"):
        if old.suffix.lstrip(".").isdigit():
            old.unlink()


# When the bench runs as root, the open-loop points' pgbench runs in the real-time class
# (SCHED_FIFO, priority 1). It shares the machine with the server under test: at nice 0,
# and as much at nice -10, its log's schedule lag (scheduled arrival to sending) had a
# p99 of 4 ms under pg_stride, one kernel tick (HZ 250), and up to 25 ms under stock.
# A woken pgbench waited for the running process's protected slice and the next tick.
# That latency counts in the slowdowns, and clients on machines of their own do not see
# it. pgbench needs little CPU, so the real-time class takes nothing from the server.
GENERATOR_FIFO = 1


def pgbench(args: list, conn: list, logfile: Path, timeout: float, cwd: Path,
            env: dict | None = None, fifo: int = 0):
    """Run pgbench (with `env` as its environment, if given, and with `fifo` > 0 in the
    SCHED_FIFO class at that priority); on timeout interrupt it and report `timed_out`."""
    cmd = [str(PG_BIN / "pgbench"), *[str(a) for a in args], *conn]
    with open(logfile, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                preexec_fn=(lambda: os.sched_setscheduler(
                                    0, os.SCHED_FIFO, os.sched_param(fifo))) if fifo else None)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                rc = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            timed_out = True
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    text = logfile.read_text()
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", text)
    return {"rc": rc, "timed_out": timed_out, "tps": float(m.group(1)) if m else float("nan")}


class Workload:
    """Scripts of the mix for one run: the TPC-H queries at two scales, or the synthetic
    event log's statements (synthetic.py)."""

    def __init__(self, scripts: dict):
        # scripts: (query, class) -> path, in the order pgbench gets them
        self.scripts = scripts
        self.order = list(scripts)
        # pgbench numbers the -f scripts from 0 in the order given
        self.script_info = {i: key for i, key in enumerate(self.order)}

    def pgbench_files(self) -> list:
        args = []
        for q, cls in self.order:
            args += ["-f", f"{self.scripts[(q, cls)]}@{CLASS_WEIGHT[cls]}"]
        return args

    def mean_isolated(self, iso: dict) -> float:
        """d of wagner2021 §5.1: mean isolated latency of an arrival of the mix.  With
        `iso` holding CPU seconds per execution instead, the mean CPU an arrival needs."""
        total_w = sum(CLASS_WEIGHT[cls] for _, cls in self.order)
        return sum(CLASS_WEIGHT[cls] * iso[(q, cls)] for q, cls in self.order) / total_w


def arrival_rate(alpha: float, load_from: str, mean_latency_s: float, mean_cpu_s: float,
                 cpus: int) -> float:
    """Nominal arrivals per second for load α.  `cpu` / `cpu-mean`: α is the share of the
    machine's CPU capacity the offered work needs, λ = α · CPUs / c with c the mean CPU
    seconds of an arrival of the mix (leader, parallel workers, planning, connection
    share); `cpu` then calibrates this to the arrivals pgbench actually sends (cli.py,
    analysis.calibrate_rate), because in 30-90 s the drawn sequence's mean CPU is far
    from c.  `latency`: wagner2021 §5.1's λ = α / d with d the mean isolated latency,
    which counts a parallel query's CPUs once and so offers less."""
    if load_from in ("cpu", "cpu-mean"):
        return alpha * cpus / mean_cpu_s
    return alpha / mean_latency_s


# Rate of the dry run: fast enough to take seconds (≈ 2000 arrivals in 10 s), slow
# enough that the log's error on an arrival time (µs, a few ms when pgbench is
# preempted; see analysis.compare_sequences) stays a small part of the mean gap.
DRY_RATE = 200.0


def dry_workload(wl: Workload, outdir: Path) -> Workload:
    """`wl`'s scripts in the same number, order and weights, each `SELECT 1;`.  pgbench
    chooses a script from the weights alone (chooseScript: a draw in [0, total weight)
    from the thread's own stream), so a run of these at the same seed and client count
    draws the same script numbers in the same order as the real workload, while the
    server does next to nothing."""
    outdir.mkdir(parents=True, exist_ok=True)
    scripts = {}
    for q, cls in wl.order:
        path = outdir / f"dry_{cls}_{q}.sql"
        path.write_text("SELECT 1;\n")
        scripts[(q, cls)] = path
    return Workload(scripts)


def dry_run(conn: list, wl: Workload, clients: int, seed: int, arrivals: int,
            outdir: Path, name: str = "dry", rate: float = DRY_RATE) -> dict:
    """The arrival sequence pgbench will send: open loop at `rate` with `wl`'s trivial
    twins (dry_workload), the same seed, clients and one thread as open_loop, for about
    `arrivals` arrivals.  Returns the log prefix and exit status; the log gives each
    arrival's script and scheduled time (analysis.arrival_sequence)."""
    outdir.mkdir(parents=True, exist_ok=True)
    prefix = outdir / name
    clear_logs(prefix)
    duration = max(2, math.ceil(arrivals / rate) + 1)   # + the clients' connecting
    dry = dry_workload(wl, outdir / "scripts")
    r = pgbench(["-n", "-M", "simple", "-c", clients, "-j", 1, "-T", duration,
                 "-R", f"{rate:.4f}", f"--random-seed={seed}", "-l", f"--log-prefix={prefix}",
                 *dry.pgbench_files()], conn, outdir / f"{name}.out",
                timeout=duration * 4 + 60, cwd=outdir)
    return {"rc": r["rc"], "timed_out": r["timed_out"], "log_prefix": str(prefix),
            "rate": float(f"{rate:.4f}"), "duration": duration}


# Rounds of isolated executions after the first, and executions per round (after its
# warm-up). The machine's speed moves in spells of a few seconds (bench/README.md, "How
# fast the machine ran"): the few executions of a small query back to back all fall in
# one spell, so its median, the denominator of every slowdown of that query, would be a
# fast or a slow spell's. Rounds spread over the whole measurement sample several, and
# the open loop adds one after each of its points (cli.Runner.isolated_between).
SPREAD_ROUNDS = 2
SPREAD_RUNS = 2


def isolated_round(server: Server, wl: Workload, runs: int, outdir: Path, seed: int,
                   suffix: str = "", measure_cpu: bool = False) -> dict:
    """One round through all the queries, each alone in a pgbench run of its own on a new
    connection: one warm-up execution, then `runs` counted ones, parameters drawn per
    execution.  (query, class) -> (its transactions, the server's CPU seconds per
    execution with `measure_cpu`, else None: every server process, parallel workers
    included, over the run, warm-up included)."""
    outdir.mkdir(parents=True, exist_ok=True)
    out = {}
    for q, cls in wl.order:
        name = f"iso_{cls}_{q}{suffix}"
        prefix = outdir / name
        # the meter waits for exited backends, so only rounds that need it measure
        with CpuMeter(server) if measure_cpu else contextlib.nullcontext() as cpu:
            res = pgbench(["-n", "-M", "simple", "-c", 1, "-j", 1, "-t", runs + 1,
                           f"--random-seed={seed}", "-l", f"--log-prefix={prefix}",
                           "-f", wl.scripts[(q, cls)]],
                          server.app_conn_args(TPCH_DB), outdir / f"{name}.out",
                          timeout=600, cwd=outdir)
        txns = analysis.parse_logs(str(prefix))
        if res["rc"] != 0 or len(txns) < runs + 1 or any(t.failed for t in txns):
            raise RuntimeError(f"isolated run of {q} ({cls}) failed; see "
                               f"{outdir / f'{name}.out'}")
        out[(q, cls)] = (txns, cpu.result()["server_cpu_s"] / (runs + 1) if measure_cpu
                         else None)
    return out


def measure_isolated(server: Server, wl: Workload, runs: int, outdir: Path, seed: int) -> dict:
    """Each query alone, one client, default parallelism: the median of its executions in
    SPREAD_ROUNDS + 1 rounds over all the queries (isolated_round; the first with `runs`
    executions, the others with SPREAD_RUNS); and the server's CPU seconds per execution
    (`cpu_s`) over the first round."""
    rounds = {key: [] for key in wl.order}
    cpu_s = {}
    for r in range(SPREAD_ROUNDS + 1):
        done = isolated_round(server, wl, runs if r == 0 else SPREAD_RUNS, outdir, seed + r,
                              f"_r{r}" if r else "", measure_cpu=r == 0)
        for key, (txns, cpu) in done.items():
            rounds[key].append(txns)
            if r == 0:
                cpu_s[key] = cpu
    iso = {}
    for q, cls in wl.order:
        res = analysis.isolated_latency(rounds[(q, cls)], skip_first=1)
        res["cpu_s"] = cpu_s[(q, cls)]
        iso[(q, cls)] = res
        log(f"  isolated {q} {cls:5s}: median {res['median_s'] * 1000:8.1f} ms "
            f"(min {res['min_s'] * 1000:.1f}, max {res['max_s'] * 1000:.1f}, "
            f"{res['runs']} runs), CPU {res['cpu_s'] * 1000:.1f} ms")
    return iso


# A serial, CPU-bound scan whose time on the idle server tracks how fast the machine runs
# at the moment: the host's other work slows it as much as it slows a run's statements.
# The TPC-H mix's, over the short scale's schema; the synthetic log has its own
# (synthetic.PROBE).
PROBE = "SELECT count(*), sum(l_extendedprice * (1 - l_discount)) FROM {schema}.lineitem"
PROBE_RUNS = 5


def speed_probe(server: Server, probe: str) -> float:
    """Median execution time, ms, of PROBE_RUNS serial executions of the query `probe`,
    one after the other on the otherwise idle server."""
    wait_idle(server)
    explain = f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {probe};"
    out = server.psql("SET max_parallel_workers_per_gather = 0; " + explain * PROBE_RUNS,
                      db=TPCH_DB)
    return statistics.median(probe_times(out))


def wait_idle(server: Server, timeout_s: float = 60.0):
    """Waits until no other client backend runs a statement, cancelling what still runs
    after `timeout_s`: when pgbench -T ends it closes its connections without waiting,
    and their statements run on until they are done."""
    busy = ("select count(*) from pg_stat_activity where backend_type = 'client backend' "
            "and state = 'active' and pid <> pg_backend_pid()")
    for cancelled in (False, True):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if server.psql(busy) == "0":
                return
            time.sleep(0.2)
        if cancelled:
            log(f"statements still running {timeout_s:.0f} s after a cancel; probing anyway")
            return
        server.cancel_all()


def probe_times(explain_json: str) -> list:
    """The execution times (ms) of EXPLAIN (ANALYZE, FORMAT JSON) outputs, in order."""
    return [float(x) for x in re.findall(r'"Execution Time": ([0-9.]+)', explain_json)]


def open_loop(server: Server, wl: Workload, conn: list, rate: float, duration: int,
              clients: int, seed: int, outdir: Path, name: str) -> dict:
    """One open-loop point: Poisson arrivals at `rate` per second for `duration` s."""
    outdir.mkdir(parents=True, exist_ok=True)
    prefix = outdir / name
    clear_logs(prefix)                            # logs of an earlier try of this point
    args = ["-n", "-M", "simple", "-c", clients, "-j", 1, "-T", duration,
            "-R", f"{rate:.4f}", f"--random-seed={seed}", "-l", f"--log-prefix={prefix}",
            *wl.pgbench_files()]
    logpos = server.log_size()
    fifo = GENERATOR_FIFO if IS_ROOT else 0
    with CpuMeter(server) as cpu, MachineSampler(outdir / f"{name}.cpu.csv"):
        r = pgbench(args, conn, outdir / f"{name}.out", timeout=duration * 4 + 120, cwd=outdir,
                    fifo=fifo)
    if r["timed_out"]:
        server.cancel_all()
    res = {"rc": r["rc"], "timed_out": r["timed_out"], "cpu": cpu.result(),
           "log_prefix": str(prefix), "server_crash": server.crashes_since(logpos),
           "pgbench_fifo": fifo}
    return res


def run_together(cmds: list, outdir: Path, name: str, timeout: float) -> dict:
    """Starts every (tag, command, preexec_fn) of `cmds` at once, each writing to
    outdir/NAME_TAG.out, and waits for all; one still running after `timeout` s is
    killed, and all are when this is interrupted. Returns tag -> exit status."""
    procs = []
    try:
        for tag, cmd, preexec in cmds:
            fh = open(outdir / f"{name}_{tag}.out", "w")
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                           cwd=outdir, preexec_fn=preexec), fh, tag))
        rcs = {}
        for p, fh, tag in procs:
            try:
                rcs[tag] = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                rcs[tag] = p.wait()
            fh.close()
        return rcs
    except BaseException:
        for p, _, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise


def mixed(server: Server, wl: Workload, tpch_conn: list, oltp_conn: list, duration: int,
          tpch_clients: int, oltp_clients: int, seed: int, outdir: Path, name: str) -> dict:
    """TPC-B clients beside TPC-H clients, both closed-loop, for `duration` s
    (psaroudakis2013 §7.2, with pgbench's TPC-B-like transaction in place of TPC-C)."""
    outdir.mkdir(parents=True, exist_ok=True)
    cmd_h = [str(PG_BIN / "pgbench"), "-n", "-M", "simple", "-c", str(tpch_clients), "-j", "1",
             "-T", str(duration), f"--random-seed={seed}", "-l",
             f"--log-prefix={outdir / (name + '_tpch')}", *wl.pgbench_files(), *tpch_conn]
    cmd_b = [str(PG_BIN / "pgbench"), "-M", "simple", "-b", "tpcb-like", "-c", str(oltp_clients),
             "-j", "1", "-T", str(duration), f"--random-seed={seed}", "-l",
             f"--log-prefix={outdir / (name + '_tpcb')}", *oltp_conn]
    with CpuMeter(server) as cpu:
        rcs = run_together([("tpcb", cmd_b, None), ("tpch", cmd_h, None)], outdir, name,
                           duration * 4 + 120)
    return {"rc": rcs, "cpu": cpu.result(), "duration": duration,
            "tpch_prefix": str(outdir / (name + "_tpch")),
            "tpcb_prefix": str(outdir / (name + "_tpcb"))}


def overhead_pair(server: Server, duration: int, clients: int, seed: int, outdir: Path,
                  name: str) -> dict:
    """pgbench TPC-B-like and select-only runs against the current server."""
    outdir.mkdir(parents=True, exist_ok=True)
    res = {}
    threads = min(clients, 2)
    for kind, extra, sampling in (("tpcb", ["-b", "tpcb-like"], "0.5"),
                                  ("select", ["-b", "select-only"], "0.1")):
        prefix = outdir / f"{name}_{kind}"
        cpu = CpuMeter(server)
        with cpu:
            r = pgbench(["-M", "prepared", *extra, "-c", clients, "-j", threads, "-T", duration,
                         f"--random-seed={seed}", "-l", f"--log-prefix={prefix}",
                         f"--sampling-rate={sampling}"],
                        server.app_conn_args(OLTP_DB), outdir / f"{name}_{kind}.out",
                        timeout=duration * 3 + 60, cwd=outdir)
        txns = analysis.parse_logs(str(prefix))
        lat = [t.latency_s for t in txns if not t.failed]
        res[kind] = {"tps": r["tps"], "rc": r["rc"],
                     "p99_ms": analysis.percentile(lat, 99) * 1000 if lat else float("nan"),
                     "mean_ms": sum(lat) / len(lat) * 1000 if lat else float("nan"),
                     # server CPU per transaction: robust to CPU taken by other processes
                     "cpu_us_per_txn": cpu.server_cpu_s / (r["tps"] * duration) * 1e6
                     if r["tps"] > 0 else float("nan"),
                     "machine_busy": cpu.machine_busy}
        time.sleep(1)
    return res


def phase_sequence(server: Server, conn: list, steps: list, clients: int, outdir: Path,
                   on_tick=None) -> dict:
    """Consecutive open-loop phases as one arrival sequence: the pgbench of step i is
    started when the steps before it have had their durations (so the next phase's
    arrivals begin as the previous phase's end, while its last queries still run).

    steps: [{"name", "wl" (a Workload), "rate", "duration", "seed"}].  `on_tick()` is
    called about every second while the sequence runs (e.g. to read the tuner view).
    Returns per step its log prefix, exit status and start time, and the server CPU over
    the whole sequence."""
    outdir.mkdir(parents=True, exist_ok=True)
    logpos = server.log_size()
    procs = []
    t_start = time.monotonic()

    def tick_until(deadline):
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if on_tick:
                on_tick()
            time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))

    res_steps = []
    with CpuMeter(server) as cpu:
        try:
            offset = 0.0
            for st in steps:
                tick_until(t_start + offset)
                name = st["name"]
                prefix = outdir / name
                clear_logs(prefix)                        # logs of an earlier try
                cmd = [str(PG_BIN / "pgbench"), "-n", "-M", "simple", "-c", str(clients),
                       "-j", "1", "-T", str(st["duration"]), "-R", f"{st['rate']:.4f}",
                       f"--random-seed={st['seed']}", "-l", f"--log-prefix={prefix}",
                       *st["wl"].pgbench_files(), *conn]
                fh = open(outdir / f"{name}.out", "w")
                fh.write("$ " + " ".join(cmd) + "\n")
                fh.flush()
                started = time.time()
                procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                               cwd=outdir), fh))
                res_steps.append({"name": name, "log_prefix": str(prefix), "started": started,
                                  "duration": st["duration"], "rate": st["rate"],
                                  "seed": st["seed"]})
                offset += st["duration"]
            # wait for the last pgbench runs to drain (bounded)
            deadline = t_start + offset + max(120.0, offset)
            for i, (p, fh) in enumerate(procs):
                while p.poll() is None and time.monotonic() < deadline:
                    if on_tick:
                        on_tick()
                    try:
                        p.wait(timeout=1.0)
                    except subprocess.TimeoutExpired:
                        pass
                timed_out = p.poll() is None
                if timed_out:
                    p.send_signal(signal.SIGINT)
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                fh.close()
                res_steps[i]["rc"] = p.returncode
                res_steps[i]["timed_out"] = timed_out
        except BaseException:
            for p, fh in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                fh.close()
            raise
    if any(s["timed_out"] for s in res_steps):
        server.cancel_all()
    return {"steps": res_steps, "cpu": cpu.result(), "wall_s": time.monotonic() - t_start,
            "server_crash": server.crashes_since(logpos)}
