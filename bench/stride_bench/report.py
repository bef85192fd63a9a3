"""RESULTS.md, the plots and the compact table printed at the end of a run."""

import math
import statistics
from pathlib import Path

from .common import RESULTS_DIR, RESULTS_MD, log

CLASSES = ("short", "long")


def f(x, nd=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}"


def ms(x):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1000:.1f}"


def is_synthetic(meta) -> bool:
    """Whether the run's workload is the synthetic event log (synthetic.py), not TPC-H."""
    return meta.get("workload") == "synthetic"


def class_label(meta, cls: str) -> str:
    """What a class of the run's workload is: a TPC-H scale factor, or the synthetic log's
    statements of that class."""
    if is_synthetic(meta):
        return f"synthetic {cls} statements"
    return f"SF {meta['scales'][cls]:g}"


def queries_of(meta, cls: str) -> list:
    """The queries of class `cls`: every TPC-H query (each runs in both classes, at two
    scales), or the synthetic statements of that class."""
    inc = meta["queries"]["included"]
    if is_synthetic(meta):
        return [q for q in inc if meta["synthetic"]["classes"][q] == cls]
    return inc


def top_alpha(meta):
    alphas = meta["plan"]["alphas"]
    return str(max(alphas)) if alphas else None


def ran_configs(meta):
    return [n for n, c in meta["configs"].items() if c.get("status") == "ran"
            and n in meta.get("open_loop", {})]


# ---- tables ----------------------------------------------------------------------------

def cpu_share(st) -> float:
    """Server CPU share of a point; not defined when the server restarted during it."""
    v = st["cpu"]["server_cpu_util"]
    return v if v >= 0 else float("nan")


def offered_share(st, span: str = "run") -> float:
    """Share of the machine's CPU the arrivals a point really sent needed (their
    isolated CPU), over the whole run or the measured window; nan when not known."""
    return (st.get("offered") or {}).get(span, float("nan"))


def window_busy(st) -> float:
    """Share of the machine busy over a point's measured window (the span of `offered`'s
    "window"); nan for a run from before it was sampled."""
    v = st.get("machine_busy_window")
    return float("nan") if v is None else v


def sequence_note(st) -> str:
    """Whether a point sent the arrivals of the calibration's dry run, in a few words."""
    chk = st.get("sequence_check")
    if not chk:
        return "–"
    if chk["equal"]:
        return f"same {chk['compared']}"
    if chk["first_mismatch"] is not None:
        return f"**differs from arrival {chk['first_mismatch'] + 1}**"
    return f"**only {chk['compared']} of {chk['real_arrivals']} in the dry run**"


def load_rows(meta) -> list:
    """Per open-loop point, the load it was meant to offer and the load it offered:
    nominal and calibrated rate, the CPU share its arrivals needed (measured window,
    whole run) beside the server CPU and machine busy measured, and the check that it
    sent the dry run's arrivals."""
    ol = meta.get("open_loop", {})
    cal = (meta.get("calibration") or {}).get("points", {})
    rows = []
    for al in sorted({al for n in ran_configs(meta) for al in ol[n]}, key=float):
        for n in ran_configs(meta):
            st = ol[n].get(al)
            if not st:
                continue
            rows.append({"alpha": al, "config": n,
                         # a run from before the calibration used the nominal rate
                         "nominal": st.get("nominal_rate", st["rate"]),
                         "calibrated": cal.get(al, {}).get("calibrated") == st["rate"],
                         "rate": st["rate"],
                         "offered_window": offered_share(st, "window"),
                         "offered_run": offered_share(st, "run"),
                         "cpu": cpu_share(st), "machine": st["cpu"]["machine_busy"],
                         "machine_window": window_busy(st),
                         "sequence": sequence_note(st),
                         "time_error": (st.get("sequence_check") or {}).get("max_time_error_s")})
    return rows


def point_problem(st) -> str | None:
    """Why an open-loop point is not a clean measurement, or None."""
    if st.get("server_crash") and st.get("rc", 0) != 0:
        return "server crashed: " + st["server_crash"][0]
    if st.get("rc", 0) != 0:
        return (f"pgbench exited with status {st['rc']} (clients aborted, e.g. a server crash; "
                "see the point's .out file and the server log)")
    if st.get("timed_out"):
        return "pgbench did not finish in time and was stopped"
    return None


def huge_pages_line(meta: dict) -> str | None:
    """The report's line on the server's shared memory in huge pages (stride_bench/
    hugepages.py); None for runs from before the bench reserved them."""
    hp = meta.get("huge_pages")
    if hp is None:
        return None
    used = {n: c["huge_pages"] for n, c in meta["configs"].items() if "huge_pages" in c}
    without = sorted(n for n, u in used.items() if u is False)
    unknown = sorted(n for n, u in used.items() if u is None)
    if not used:
        servers = "no server started"
    elif not without and not unknown:
        servers = "every configuration's server mapped its shared memory in them"
    elif len(without) == len(used):
        servers = "**no** configuration's server used them (4-kB pages)"
    else:
        servers = "; ".join(part for part in (
            "in 4-kB pages: " + ", ".join(without) if without else "",
            "not known: " + ", ".join(unknown) if unknown else "") if part)
    if "needed" in hp:
        need = (f"the server needs {hp['needed']} of 2 MB" if hp["needed"] else
                "the server's need unknown")
        reserved = (f"vm.nr_hugepages {hp['before']} → {hp['reserved']} for the run"
                    if hp["reserved"] != hp["before"] else f"{hp['reserved']} reserved")
        how = f"{need}, {reserved} ({hp['status']})"
    else:
        how = hp.get("status", "")
    return f"- Huge pages for shared memory: {how}; {servers}."


def speed_rows(meta) -> list:
    """(configuration, speed probe before, after) at the highest load; runs before
    2026-11-26 had no probe."""
    if not meta.get("probe_ms"):
        return []
    a = top_alpha(meta)
    ol = meta.get("open_loop", {})
    return [(name, *ol[name][a]["probe_ms"]) for name in ran_configs(meta)
            if ol.get(name, {}).get(a, {}).get("probe_ms")]


def other_denominator_rows(meta) -> list:
    """(configuration, {set: per class mean and p99 slowdown}) at the highest load with each
    set of isolated latencies before and after the open loop, alone (cli.pool_denominators)."""
    a = top_alpha(meta)
    ol = meta.get("open_loop", {})
    return [(name, ol[name][a]["other_denominators"]) for name in ran_configs(meta)
            if ol.get(name, {}).get(a, {}).get("other_denominators")]


def headline_rows(meta):
    """Per configuration at the highest load: the figures the issue's targets name."""
    a = top_alpha(meta)
    ol = meta.get("open_loop", {})
    stock = ol.get("stock", {}).get(a, {}).get("classes", {})
    rows = []
    for name in ran_configs(meta):
        st = ol[name].get(a)
        if not st:
            continue
        c = st["classes"]
        s, l = c.get("short", {}), c.get("long", {})
        p99_stock = stock.get("short", {}).get("slowdown", {}).get("p99", float("nan"))
        p99 = s.get("slowdown", {}).get("p99", float("nan"))
        lt = l.get("throughput_qps", float("nan"))
        lt_stock = stock.get("long", {}).get("throughput_qps", float("nan"))
        mx = meta.get("mixed", {}).get(name, {}).get("tpch", {}).get("classes", {})
        mx_stock = meta.get("mixed", {}).get("stock", {}).get("tpch", {}).get("classes", {})
        mlt = mx.get("long", {}).get("work_per_s", float("nan"))
        mlt_stock = mx_stock.get("long", {}).get("work_per_s", float("nan"))
        bad = point_problem(st)
        rows.append({
            "config": name + (" (run failed)" if bad else ""),
            "problem": bad,
            "short_mean": s.get("slowdown", {}).get("mean"),
            "short_p99": p99,
            "p99_gain": p99_stock / p99 if p99 else float("nan"),
            "long_mean": l.get("slowdown", {}).get("mean"),
            "long_p99": l.get("slowdown", {}).get("p99"),
            "long_tput": lt,
            "long_tput_rel": lt / lt_stock if lt_stock else float("nan"),
            "mixed_long_rel": mlt / mlt_stock if mlt_stock else float("nan"),
            "offered": offered_share(st, "window"),
            "cpu": cpu_share(st),
            "machine": st["cpu"]["machine_busy"],
            "machine_window": window_busy(st),
            "max_in_system": st.get("max_in_system"),
            "clients": st.get("clients"),
        })
    return rows


def overhead_summary(meta):
    oh = meta.get("overhead") or {}
    rounds = oh.get("rounds") or []
    variants = oh.get("variants") or []
    if len(variants) < 2 or not rounds:
        return None
    base, other = variants[0], variants[1]
    out = {"base": base, "other": other, "note": oh.get("note"), "kinds": {}}
    from .analysis import median
    for kind in ("tpcb", "select"):
        b_tps = [r[base][kind]["tps"] for r in rounds if base in r]
        o_tps = [r[other][kind]["tps"] for r in rounds if other in r]
        b_p99 = [r[base][kind]["p99_ms"] for r in rounds if base in r]
        o_p99 = [r[other][kind]["p99_ms"] for r in rounds if other in r]
        b_cpu = [r[base][kind].get("cpu_us_per_txn", float("nan")) for r in rounds if base in r]
        o_cpu = [r[other][kind].get("cpu_us_per_txn", float("nan")) for r in rounds if other in r]
        out["kinds"][kind] = {
            "base_cpu": median(b_cpu), "other_cpu": median(o_cpu),
            "cpu_ratio": median(o_cpu) / median(b_cpu) if b_cpu and median(b_cpu) else float("nan"),
            "base_tps": median(b_tps), "other_tps": median(o_tps),
            "tps_ratio": median(o_tps) / median(b_tps) if b_tps and median(b_tps) else float("nan"),
            "base_p99": median(b_p99), "other_p99": median(o_p99),
            "p99_ratio": median(o_p99) / median(b_p99) if b_p99 and median(b_p99) else float("nan"),
            "rounds": len(rounds),
        }
    return out


def compact_table(meta) -> str:
    a = top_alpha(meta)
    rows = headline_rows(meta)
    width = max([18] + [len(r["config"]) for r in rows])
    lines = [f"pg_stride bench ({meta['plan']['mode']}): slowdown = latency / isolated latency, "
             f"load alpha = {a}, {class_label(meta, 'short')} (short) + "
             f"{class_label(meta, 'long')} (long), 3:1 arrivals",
             f"{'configuration':{width}s} {'short mean':>10s} {'short p99':>10s} {'long mean':>10s} "
             f"{'long p99':>9s} {'long q/s':>9s} {'vs stock':>8s} {'offered':>7s} {'busy':>5s} "
             f"{'CPU':>5s}"]
    for r in rows:
        lines.append(f"{r['config']:{width}s} {f(r['short_mean']):>10s} {f(r['short_p99']):>10s} "
                     f"{f(r['long_mean']):>10s} {f(r['long_p99']):>9s} {f(r['long_tput'], 3):>9s} "
                     f"{f(r['long_tput_rel'] * 100, 0) + '%':>8s} {f(r['offered'] * 100, 0) + '%':>7s} "
                     f"{f(r['machine_window'] * 100, 0) + '%':>5s} {f(r['cpu'] * 100, 0) + '%':>5s}")
    for name, c in meta["configs"].items():
        if c.get("status") == "skipped":
            lines.append(f"{name:{width}s} skipped: {c.get('reason')}")
    mx = meta.get("mixed") or {}
    if mx:
        lines.append("mixed OLTP + analytics: " + "; ".join(
            f"{n}: TPC-B {m['tpcb']['tps']:.0f} tps p99 {m['tpcb']['latency']['p99'] * 1000:.1f} ms, "
            f"TPC-H {m['tpch']['tps']:.2f} q/s" for n, m in mx.items()))
    for r in rep_rows(meta):
        lines.append(f"repetitions, alpha {r['alpha']}, {r['config']} ({r['n']}): short mean "
                     f"{spread_text(r['short_mean'])}, p99 {spread_text(r['short_p99'])}, "
                     f"long vs stock {spread_text(r['long_tput_rel'], 100, 1)} %")
    for n, reps in (meta.get("app_pool") or {}).items():
        lines.append(f"application pool, {n}: " + "; ".join(app_pool_phrase(st) for st in reps))
    oh = overhead_summary(meta)
    if oh:
        lines.append(f"overhead ({oh['other']} / {oh['base']}, median of "
                     f"{oh['kinds']['tpcb']['rounds']} rounds; bench/overhead_ab.py measures it "
                     "side by side): " + ", ".join(
            f"{k} TPS x{v['tps_ratio']:.3f} p99 x{v['p99_ratio']:.3f} CPU/txn x{v['cpu_ratio']:.3f}"
            for k, v in oh["kinds"].items()))
    return "\n".join(lines)


def app_pool_phrase(st: dict) -> str:
    """One round of the application-pool form: short mean / p99 slowdown, long q/s."""
    c = st.get("classes", {})
    s, l = c.get("short", {}), c.get("long", {})
    return (f"short {s.get('slowdown', {}).get('mean', float('nan')):.2f} / "
            f"{s.get('slowdown', {}).get('p99', float('nan')):.2f}, "
            f"long {l.get('throughput_qps', float('nan')):.3f} q/s")


def app_pool_section(meta) -> list:
    """The Markdown lines of the application-pool form, none without it."""
    ap = meta.get("app_pool") or {}
    if not ap:
        return []
    plan = meta["plan"]
    out = ["## Behind an application's connection pool\n",
           f"The open loop's arrivals at α {plan.get('app_pool_alpha')} through "
           f"{plan.get('app_pool_clients')} client connections, as an application server's pool "
           "sends them: an arrival finding every connection busy waits at the client, first "
           "come first served, and its latency counts from its arrival. Each configuration "
           f"{plan.get('app_pool_reps')} times, the order alternating.\n",
           "| configuration | round | short mean | short p99 | long mean | long q/s | "
           "long q/s vs stock | max in system |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    stock = ap.get("stock", [])
    for n, reps in ap.items():
        for i, st in enumerate(reps):
            c = st.get("classes", {})
            s, l = c.get("short", {}), c.get("long", {})
            base = stock[i]["classes"].get("long", {}).get("throughput_qps") \
                if i < len(stock) else None
            lt = l.get("throughput_qps")
            out.append(f"| {n} | {i + 1} | {f(s.get('slowdown', {}).get('mean'))} | "
                       f"{f(s.get('slowdown', {}).get('p99'))} | "
                       f"{f(l.get('slowdown', {}).get('mean'))} | {f(lt, 3)} | "
                       f"{f(lt / base * 100 if lt and base else None, 1)} % | "
                       f"{st.get('max_in_system')} |")
    out.append("")
    return out


def every_point(meta: dict):
    """(configuration, α, repetition, statistics) of every open-loop point of a run: the
    first repetitions in meta["open_loop"], the others in meta["open_loop_reps"], each
    with the number it was stored with (bench/run --reps)."""
    for config, points in meta.get("open_loop", {}).items():
        for alpha, st in points.items():
            yield config, alpha, 0, st
    for config, points in meta.get("open_loop_reps", {}).items():
        for alpha, reps in points.items():
            for i, st in enumerate(reps):
                yield config, alpha, st.get("rep", i + 1), st


def repetitions(meta, name: str, alpha: str) -> dict:
    """Repetition number (from 0) -> statistics of every repetition of configuration
    `name`'s open-loop point at `alpha` that ran (a repetition whose server could not
    start is missing)."""
    return dict(sorted(((rep, st) for c, al, rep, st in every_point(meta)
                        if c == name and al == alpha), key=lambda pair: pair[0]))


def spread(values: list) -> dict | None:
    """Median, lowest and highest of the values that are numbers; None if none is."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return None
    return {"median": statistics.median(xs), "low": xs[0], "high": xs[-1], "n": len(xs)}


def slow(st, cls: str, k: str):
    """A point's slowdown statistic `k` (mean, p99, …) of class `cls`, None if absent."""
    return st["classes"].get(cls, {}).get("slowdown", {}).get(k)


def tput(st):
    """A point's long-query throughput, queries per second, None if absent."""
    return st["classes"].get("long", {}).get("throughput_qps")


def rep_rows(meta) -> list:
    """Per configuration and load point that ran more than once: the median and range
    over its repetitions of the short mean and p99 slowdowns, the long mean slowdown,
    and the long throughput against stock's in the same repetition; a failed repetition
    (point_problem) is counted but left out of the figures."""
    if not meta.get("open_loop_reps"):
        return []
    rows = []
    for al in sorted({al for n in ran_configs(meta) for al in meta["open_loop"][n]}, key=float):
        stock = repetitions(meta, "stock", al)
        good_stock = {k for k, st in stock.items() if not point_problem(st)}
        for n in ran_configs(meta):
            reps = repetitions(meta, n, al)
            if len(reps) < 2:
                continue
            good = {k: st for k, st in reps.items() if not point_problem(st)}
            rel = [tput(st) / tput(stock[k]) if k in good_stock and tput(st) and tput(stock[k])
                   else None for k, st in good.items()]
            rows.append({"alpha": al, "config": n, "n": len(reps),
                         "failed": len(reps) - len(good),
                         "short_mean": spread([slow(st, "short", "mean") for st in good.values()]),
                         "short_p99": spread([slow(st, "short", "p99") for st in good.values()]),
                         "long_mean": spread([slow(st, "long", "mean") for st in good.values()]),
                         "long_tput_rel": spread(rel)})
    return rows


def spread_text(s: dict | None, scale: float = 1.0, nd: int = 2) -> str:
    """"median (low–high)" of a spread."""
    if not s:
        return "–"
    return f"{f(s['median'] * scale, nd)} ({f(s['low'] * scale, nd)}–{f(s['high'] * scale, nd)})"


def repetitions_section(meta) -> list:
    """The Markdown lines of the repeated open-loop points, none for a run without."""
    rows = rep_rows(meta)
    if not rows:
        return []
    out = ["## Repetitions\n",
           f"Each open-loop point ran {meta['plan'].get('reps')} times, the configurations in "
           "turn, the order rotating by one place per repetition (cli.rep_order). Median "
           "(lowest–highest) over the repetitions; long throughput against stock's in the "
           "same repetition. The tables above give the first repetition.\n",
           "| α | configuration | repetitions | short mean | short p99 | long mean | "
           "long throughput vs stock, % |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        bad = f", {r['failed']} failed, left out" if r["failed"] else ""
        out.append(f"| {r['alpha']} | {r['config']} | {r['n']}{bad} | "
                   f"{spread_text(r['short_mean'])} | {spread_text(r['short_p99'])} | "
                   f"{spread_text(r['long_mean'])} | "
                   f"{spread_text(r['long_tput_rel'], 100, 1)} |")
    out.append("")
    return out


# ---- plots -----------------------------------------------------------------------------

def plots(meta, img_dir: Path) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def logaxis(axis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())

    img_dir.mkdir(parents=True, exist_ok=True)
    names = ran_configs(meta)
    ol = meta.get("open_loop", {})
    made = {}
    markers = "osD^vP*X"
    style = {n: markers[i % len(markers)] for i, n in enumerate(names)}

    # Slowdown against load per class (wagner2021 Fig. 7 / 9)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for col, cls in enumerate(CLASSES):
        for row, stat in enumerate(("mean", "p99")):
            ax = axes[row][col]
            for n in names:
                # a failed point (see the tables) is left out of the lines
                pts = sorted((float(a), st["classes"][cls]["slowdown"][stat])
                             for a, st in ol[n].items()
                             if cls in st["classes"] and not point_problem(st))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=style[n], label=n)
            ax.set_yscale("log")
            logaxis(ax.yaxis)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{cls} queries ({class_label(meta, cls)}): {stat} slowdown")
            if row == 1:
                ax.set_xlabel("load α")
            ax.set_ylabel(f"{stat} slowdown (log)")
    axes[0][0].legend()
    fig.suptitle("Slowdown against load, per class (same arrivals for every configuration; "
                 "failed points left out)")
    fig.tight_layout()
    p = img_dir / "slowdown_vs_load.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made["slowdown_vs_load"] = p.name

    # Slowdown CDFs at the highest load
    a = top_alpha(meta)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for col, cls in enumerate(CLASSES):
        ax = axes[col]
        for n in names:
            st = ol[n].get(a)
            if not st or cls not in st["classes"] or point_problem(st):
                continue
            xs = st["classes"][cls]["slowdowns"]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f"{n} (n={len(xs)})")
        ax.set_xscale("log")
        logaxis(ax.xaxis)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("slowdown (log)")
        ax.set_ylabel("fraction of queries")
        ax.set_title(f"{cls} queries ({class_label(meta, cls)}) at α = {a}")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    p = img_dir / "slowdown_cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made["slowdown_cdf"] = p.name

    # Mixed OLTP + analytics
    mx = meta.get("mixed") or {}
    if mx:
        mnames = list(mx)
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
        vals = [
            ("TPC-B transactions/s", [mx[n]["tpcb"]["tps"] for n in mnames]),
            ("TPC-B p99 latency (ms)", [mx[n]["tpcb"]["latency"]["p99"] * 1000 for n in mnames]),
            ("TPC-H work done (isolated-s per s)", [mx[n]["tpch"].get("work_per_s", 0) for n in mnames]),
        ]
        for ax, (title, v) in zip(axes, vals):
            ax.bar(mnames, v, color=[f"C{i}" for i in range(len(mnames))])
            ax.set_title(title, fontsize=10)
            ax.tick_params(axis="x", rotation=20, labelsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle("Mixed workload: TPC-B clients beside TPC-H clients")
        fig.tight_layout()
        p = img_dir / "mixed.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made["mixed"] = p.name
    return made


# ---- RESULTS.md --------------------------------------------------------------------------

def markdown(meta, imgs: dict, img_prefix: str) -> str:
    m = meta["machine"]
    plan = meta["plan"]
    a = top_alpha(meta)
    sf = meta.get("scales", {})
    out = []
    w = out.append
    w("# pg_stride benchmark results\n")
    w(f"Written by `bench/run --{plan['mode']}` (started {meta['started']}, finished "
      f"{meta.get('finished', '–')}, {meta.get('elapsed_s', 0) / 60:.0f} min). Method, "
      "commands and how to read this file: [bench/README.md](README.md).\n")
    w("## Machine\n")
    w(f"- CPU: {m.get('cpu', '?')}, {m['ncpus']} CPUs online; memory {m.get('mem_gib', '?')} GiB; "
      f"{m.get('os', '?')}, kernel {m['kernel']}")
    w(f"- {m['postgres']}; {m['pgbouncer']}; pg_stride library: {m['pg_stride_so']}"
      + (f" ({m['pg_stride_so_build']} build of {m['pg_stride_so_mtime']})"
         if m.get("pg_stride_so_build")
         else f" (built {m['pg_stride_so_mtime']})" if m.get("pg_stride_so_mtime") else ""))
    w(f"- load average at start {' '.join(m.get('loadavg_start', []))}, at end "
      f"{' '.join(m.get('loadavg_end', []))}. The machine is shared (other builds run beside the "
      "benchmark), so timings are noisy: compare configurations only within this run. "
      "\"machine busy\" below is whole-machine CPU use, over a point's measured window (the "
      "arrivals its slowdowns count) or the whole run (pgbench connecting its clients and "
      "the last queries draining included), \"server CPU\" the PostgreSQL (and pgbouncer) "
      "processes' share of all CPUs over the run.\n")

    w("## Set-up\n")
    inc = meta["queries"]["included"]
    exc = meta["queries"]["excluded"]
    if is_synthetic(meta):
        w("- The synthetic event log of bench/stride_bench/synthetic.py, generated in the "
          "server: " + meta["synthetic"]["data"] + ", keys and indexes, ANALYZEd, prewarmed "
          "into shared_buffers. Not TPC-H: the classes are different statements, not one "
          "set at two scales.")
        w(f"- Statements ({len(inc)}), each with its class: "
          + "; ".join(f"{q} ({meta['synthetic']['classes'][q]})" for q in inc)
          + "; parameters drawn per execution.")
    else:
        w(f"- TPC-H generated by tpchgen-cli 4.0.0 at SF {sf['short']:g} (\"short\" class) and SF "
          f"{sf['long']:g} (\"long\" class), keys and indexes, ANALYZEd, prewarmed into "
          "shared_buffers.")
        w(f"- Queries ({len(inc)}): {', '.join(q.upper() for q in inc)}; parameters drawn per "
          "execution." + (" Left out: " + "; ".join(f"{q.upper()} ({r})" for q, r in exc.items())
                         if exc else ""))
    cal = meta.get("calibration")
    if plan.get("load_from", "latency") == "cpu" and cal:
        lo, hi = cal["window"]
        rate = (f"rate calibrated so that α is the share of the machine's CPU ({meta['machine']['ncpus']} "
                "CPUs) that the arrivals pgbench sends need: a dry run with the same seed, "
                f"clients and -f weights but `SELECT 1;` scripts ({cal['dry_arrivals']} arrivals at "
                f"{cal['dry_rate']:g}/s) gives the script sequence, and the rate is the one at which "
                f"the arrivals in the measured window ({lo:g}–{hi:g} s after the first) need α of "
                "the machine's CPU time over the window, each arrival counted at its query's server "
                f"CPU in the isolated runs (the mix's mean, c = {meta['mean_cpu_s'] * 1000:.1f} ms, "
                "gives the nominal rate α · CPUs / c)")
        again = {a: pt["speed_scale"] for a, pt in cal["points"].items() if "speed_scale" in pt}
        if again:
            rate += ("; each later load point's rate calibrated again just before its points, "
                     "each query's CPU scaled by how much longer the isolated rounds after the "
                     "points before took than the isolated runs (" + ", ".join(
                         f"α = {a}: ×{x:.3f}" for a, x in sorted(again.items(), key=lambda i: float(i[0])))
                     + ")")
    elif plan.get("load_from", "latency") in ("cpu", "cpu-mean"):
        rate = (f"rate λ = α · CPUs / c with c = {meta['mean_cpu_s'] * 1000:.1f} ms, the mean server "
                f"CPU of an arrival measured in the isolated runs ({meta['machine']['ncpus']} CPUs), "
                "so that α is the share of the machine's CPU the mix's mean arrival needs (not "
                "calibrated to the arrivals drawn: see the offered CPU per point)")
    else:
        rate = (f"rate λ = α / d with d = {meta['mean_isolated_s'] * 1000:.1f} ms, the mean isolated "
                "latency of an arrival")
    w(f"- Arrivals: Poisson (pgbench --rate), 3 of 4 {class_label(meta, 'short')}, uniform over the "
      f"queries within a class; {rate}. Same seed, so the same arrival times and query "
      "sequence, for every configuration.")
    w(f"- {plan['ol_duration']} s of arrivals per point; the first {plan['warmup_frac'] * 100:.0f} % "
      f"are warm-up and not counted; {plan['clients']} pgbench clients (one thread"
      + "".join(sorted({f", SCHED_FIFO priority {st['pgbench_fifo']}" for n in meta["open_loop"]
                        for st in meta["open_loop"][n].values() if st.get("pgbench_fifo")}))
      + "); load points "
      f"α = {', '.join(str(x) for x in plan['alphas'])}; rates " +
      ", ".join(f"{float(r):.2f}/s" for r in meta["rates"].values()) + ".")
    fps, failed_pts = {}, []
    for n in ran_configs(meta):
        for al, st in meta["open_loop"][n].items():
            if point_problem(st):
                failed_pts.append(f"{n} at α = {al}")
            else:
                fps.setdefault(al, set()).add(st.get("arrival_fingerprint"))
    same = all(len(v) == 1 for v in fps.values())
    w("- Arrival sequences (query per arrival, in order) of the configurations at each load: "
      + ("identical (checked)" if same else "**differ** between configurations: " +
         "; ".join(f"α {al}: {sorted(v)}" for al, v in fps.items() if len(v) > 1))
      + (f", failed runs left out of the check: {', '.join(failed_pts)}." if failed_pts else "."))
    if cal:
        bad = [f"{r['config']} at α = {r['alpha']} ({r['sequence']})" for r in load_rows(meta)
               if r["sequence"].startswith("**")]
        w("- Every point's arrivals against the dry run's (scripts in order, near-simultaneous "
          "ones may trade places; see the load table): " +
          ("**not the same**: " + "; ".join(bad) + ". The calibration counted on other "
           "arrivals than these points sent." if bad else "the same at every point."))
    if m.get("pg_stride_so_changed"):
        import datetime as dt
        changed = dt.datetime.fromisoformat(m["pg_stride_so_changed"]).timestamp()
        last_ol = max((st.get("last_completion", 0) for *_, st in every_point(meta)),
                      default=0)
        detail = ("every open-loop point had finished before then; the mixed and overhead "
                  "measurements that came later may have run the new build" if last_ol < changed
                  else "pg_stride configurations may mix builds")
        w(f"- **Warning**: pg_stride.so was replaced during the run (now dated "
          f"{m['pg_stride_so_changed']}, the run started with the build of "
          f"{m.get('pg_stride_so_mtime', '?')}): {detail}.")
    huge = huge_pages_line(meta)
    if huge:
        w(huge)
    w("- Slowdown of a query = its response time (completion − scheduled arrival) / the median "
      "isolated latency of the same query at the same scale.\n")

    w("## Configurations\n")
    w("| configuration | what | status |")
    w("|---|---|---|")
    for n, c in meta["configs"].items():
        status = c.get("status")
        if status == "skipped":
            status = f"skipped: {c.get('reason')}"
        extra = f" (server pool {c['pool_size']})" if c.get("pool_size") else ""
        w(f"| {n} | {c.get('label', '')}{extra} | {status} |")
    w("")

    rows = headline_rows(meta)
    w(f"## Headline (α = {a})\n")
    w("| configuration | short mean slowdown | short p99 slowdown | stock p99 / this p99 | "
      "long mean slowdown | long p99 slowdown | long throughput (q/s) | long throughput vs stock "
      "| mixed: long work vs stock | offered CPU, window | machine busy, window | server CPU, "
      "run | machine busy, run |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        w(f"| {r['config']} | {f(r['short_mean'])} | {f(r['short_p99'])} | {f(r['p99_gain'])}× | "
          f"{f(r['long_mean'])} | {f(r['long_p99'])} | {f(r['long_tput'], 3)} | "
          f"{f(r['long_tput_rel'] * 100, 1)} % | {f(r['mixed_long_rel'] * 100, 1)} % | "
          f"{f(r['offered'] * 100, 0)} % | {f(r['machine_window'] * 100, 0)} % | "
          f"{f(r['cpu'] * 100, 0)} % | {f(r['machine'] * 100, 0)} % |")
    for r in rows:
        if r["problem"]:
            w(f"\n{r['config']}: {r['problem']}.")
    speed = speed_rows(meta)
    if speed:
        probe = ("the synthetic log's events" if is_synthetic(meta)
                 else "the short scale's lineitem")
        w(f"\nHow fast the machine ran around each point: a serial scan of {probe} "
          f"on the idle server, median of 5, just before and after the point, against "
          f"the {meta['probe_ms']:.1f} ms measured with the isolated runs (on which the rate "
          "rests). The machine is shared: a point whose scan took longer ran on a slower "
          "machine, at more than its α.\n")
        w("| configuration | before | after | vs the isolated runs' |")
        w("|---|---:|---:|---:|")
        for name, before, after in speed:
            w(f"| {name} | {before:.1f} ms | {after:.1f} ms | "
              f"×{before / meta['probe_ms']:.2f} / ×{after / meta['probe_ms']:.2f} |")
    den = meta.get("denominators")
    if den:
        sets = "; ".join(f"{s['when']}, {s['probe_ms']:.1f} ms" for s in den["sets"])
        if "rounds" in den:
            each = (den["rounds"] - den["between"]) // 2
            w(f"\nThe isolated latencies were measured in {den['rounds']} rounds through the "
              f"queries: {each} before the open loop, one after each of the {den['between']} "
              f"points, {each} after the open loop. A speed probe followed the rounds before "
              f"and those after the open loop ({sets}; median around the points "
              f"{den['points_probe_ms']:.1f} ms). The slowdowns "
              "divide by the median of all the rounds' executions. With the set before or "
              "after the open loop alone, the short and long slowdowns (mean / p99) would "
              "be:\n")
        else:
            # a run from before the rounds between the points: one set of the two chosen,
            # or both pooled when their probes agreed
            how = ("the median of both sets' executions, their probes agreeing"
                   if den["chosen"] == "both, pooled" else
                   f"the set {den['chosen']}, the nearer to the median probe around the "
                   f"points ({den['points_probe_ms']:.1f} ms)")
            w(f"\nThe isolated latencies were measured twice, each set followed by the speed "
              f"probe ({sets}). The slowdowns divide by {how}. With a set not chosen, alone, "
              "the short and long slowdowns (mean / p99) would be:\n")
        alone = other_denominator_rows(meta)
        names = sorted({n for _, o in alone for n in o})
        w("| configuration | " + " | ".join(f"short, {n} | long, {n}" for n in names) + " |")
        w("|---|" + "---:|---:|" * len(names))
        for name, o in alone:
            w(f"| {name} | " + " | ".join(
                f"{o[n][c]['mean']:.2f} / {o[n][c]['p99']:.2f}" if c in o.get(n, {}) else "–"
                for n in names for c in ("short", "long")) + " |")
    oh = overhead_summary(meta)
    if oh:
        w("")
        w(f"Overhead ({oh['other']} ÷ {oh['base']}, median of {oh['kinds']['tpcb']['rounds']} "
          "interleaved rounds of a few seconds, a server start apart, which a shared machine's "
          "drift moves by several per cent; `bench/overhead_ab.py` runs the two side by side "
          "in 1-s turns): " + "; ".join(
              f"{'TPC-B' if k == 'tpcb' else 'select-only'} TPS ×{v['tps_ratio']:.3f}, "
              f"p99 ×{v['p99_ratio']:.3f}, server CPU per transaction ×{v['cpu_ratio']:.3f}"
              for k, v in oh["kinds"].items()) +
          (f". Note: {oh['note']}; this is an A/A comparison of stock with itself, "
           "i.e. the noise floor of the measurement." if oh.get("note") else "."))
    w("\nTargets of the scheduling issues (measured here, met there): at α = 0.95 pg_stride's "
      "short-query mean slowdown ≤ 1.5 and p99 slowdown ≥ 10× lower than stock; long-query "
      "throughput ≥ 95 % of stock; OLTP overhead < 2 %.\n")
    stride_rows = [r for r in rows if r["config"].startswith("stride")]
    if stride_rows:
        def mark(ok):
            return "–" if ok is None else ("met" if ok else "not met")

        def ge(x, lim):
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x >= lim

        w("| configuration | short mean ≤ 1.5 | p99 ≥ 10× lower than stock | long throughput ≥ 95 % "
          "(open loop / mixed) | OLTP overhead < 2 % (TPC-B TPS) |")
        w("|---|---|---|---|---|")
        tpcb = oh["kinds"]["tpcb"]["tps_ratio"] if oh and not oh.get("note") else None
        for r in stride_rows:
            sm = r["short_mean"]
            w(f"| {r['config']} | {mark(None if sm is None else sm <= 1.5)} | "
              f"{mark(ge(r['p99_gain'], 10))} | {mark(ge(r['long_tput_rel'], 0.95))} / "
              f"{mark(ge(r['mixed_long_rel'], 0.95))} | {mark(ge(tpcb, 0.98))} |")
        w("")

    w("## Plots\n")
    if "slowdown_vs_load" in imgs:
        w(f"![slowdown against load]({img_prefix}{imgs['slowdown_vs_load']})\n")
    if "slowdown_cdf" in imgs:
        w(f"![slowdown CDFs at the highest load]({img_prefix}{imgs['slowdown_cdf']})\n")
    if "mixed" in imgs:
        w(f"![mixed workload]({img_prefix}{imgs['mixed']})\n")

    where = "" if not den else (f", {den['rounds']} rounds pooled" if "rounds" in den else
                                ", both sets pooled" if den["chosen"] == "both, pooled"
                                else f", measured {den['chosen']}")
    w(f"## Isolated latencies (ms, median; the denominators{where})\n")
    iso = meta["isolated"]
    if is_synthetic(meta):
        w("| statement | class | median | runs | min–max |")
        w("|---|---|---:|---:|---|")
        for cls in CLASSES:
            for q in queries_of(meta, cls):
                r = iso.get(f"{q}|{cls}")
                if r:
                    w(f"| {q} | {cls} | {ms(r['median_s'])} | {r['runs']} | "
                      f"{ms(r['min_s'])}–{ms(r['max_s'])} |")
    else:
        w(f"| query | SF {sf['short']:g} | runs | min–max | SF {sf['long']:g} | runs | min–max |")
        w("|---|---:|---:|---|---:|---:|---|")
        for q in inc:
            s, l = iso.get(f"{q}|short"), iso.get(f"{q}|long")
            if not s or not l:
                continue
            w(f"| {q.upper()} | {ms(s['median_s'])} | {s['runs']} | "
              f"{ms(s['min_s'])}–{ms(s['max_s'])} | {ms(l['median_s'])} | {l['runs']} | "
              f"{ms(l['min_s'])}–{ms(l['max_s'])} |")
    w("")

    w("## Open-loop sweep: all points\n")
    w("Load per point: the rate from the mix's mean (nominal) and the one used, the share of "
      "the machine's CPU that the arrivals the point really sent need (each at its query's "
      "isolated CPU, from the point's pgbench log) over the measured window and over the "
      "whole run, beside the machine's CPU measured over each (the window's sampled every "
      "0.5 s) and the server's over the run, and whether the point sent the dry run's "
      "arrivals (max arrival-time difference in ms).\n")
    w("| α | configuration | nominal rate/s | rate/s | offered CPU, window | machine busy, "
      "window | offered CPU, run | server CPU, run | machine busy, run | arrivals as the dry "
      "run |")
    w("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in load_rows(meta):
        te = r["time_error"]
        w(f"| {r['alpha']} | {r['config']} | {f(r['nominal'])} | {f(r['rate'])}"
          f"{' (calibrated)' if r['calibrated'] else ''} | "
          f"{f(r['offered_window'] * 100, 1)} % | {f(r['machine_window'] * 100, 0)} % | "
          f"{f(r['offered_run'] * 100, 1)} % | "
          f"{f(r['cpu'] * 100, 0)} % | {f(r['machine'] * 100, 0)} % | {r['sequence']}"
          f"{'' if te is None else f' (Δt ≤ {te * 1000:.0f} ms)'} |")
    w("")
    w("| configuration | α | rate/s | class | n | mean | p50 | p95 | p99 | max | geomean | "
      "throughput q/s | server CPU | machine busy | max in system | max schedule lag, ms | "
      "failed |")
    w("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ol = meta.get("open_loop", {})
    for n in ran_configs(meta):
        for al in sorted(ol[n], key=float):
            st = ol[n][al]
            for cls in CLASSES:
                c = st["classes"].get(cls)
                if not c:
                    continue
                s = c["slowdown"]
                flag = " (all clients busy)" if st.get("ran_out_of_clients") else ""
                prob = point_problem(st)
                fail = f"{st['failed']}" + (f"; **{prob}**" if prob else "") + (
                    f"; ran again after: {st['retried_after']}" if st.get("retried_after") else "")
                w(f"| {n} | {al} | {st['rate']:.2f} | {cls} | {s['n']} | {f(s['mean'])} | "
                  f"{f(s['p50'])} | {f(s['p95'])} | {f(s['p99'])} | {f(s['max'])} | "
                  f"{f(c['slowdown_geomean'])} | {f(c['throughput_qps'], 3)} | "
                  f"{f(cpu_share(st) * 100, 0)} % | "
                  f"{f(st['cpu']['machine_busy'] * 100, 0)} % | {st.get('max_in_system')}{flag} | "
                  f"{f(st.get('max_lag_s', 0) * 1000, 1)} | {fail} |")
    w("")
    w(f"Mean slowdown per query at α = {a}:\n")
    hdr = [n for n in ran_configs(meta) if a in ol[n]]
    w("| query | class | " + " | ".join(hdr) + " |")
    w("|---|---|" + "---:|" * len(hdr))
    for cls in CLASSES:
        for q in queries_of(meta, cls):
            vals = [ol[n][a]["classes"].get(cls, {}).get("per_query_mean_slowdown", {}).get(q)
                    for n in hdr]
            w(f"| {q.upper()} | {cls} | " + " | ".join(f(v) for v in vals) + " |")
    w("")

    for line in repetitions_section(meta) + app_pool_section(meta):
        w(line)

    mx = meta.get("mixed") or {}
    if mx:
        w("## Mixed OLTP + analytics (psaroudakis2013 §7.2)\n")
        w(f"{plan['mixed_oltp_clients']} pgbench TPC-B-like clients (database `oltp`, scale "
          f"{plan['oltp_scale']}) beside {plan['mixed_tpch_clients']} closed-loop TPC-H clients "
          f"(the same 3:1 mix), {plan['mixed_duration']} s, disjoint data sets. \"work\" = the "
          "isolated latencies of the completed queries per second of run: analytical throughput "
          "independent of which queries happened to be drawn.\n")
        w("| configuration | TPC-B TPS | TPC-B mean ms | TPC-B p99 ms | TPC-H q/s | short q/s | "
          "long q/s | TPC-H work/s | long work/s | short mean slowdown | server CPU |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, r in mx.items():
            b, h = r["tpcb"], r["tpch"]
            hc = h.get("classes", {})
            w(f"| {n} | {b['tps']:.0f} | {ms(b['latency']['mean'])} | {ms(b['latency']['p99'])} | "
              f"{h['tps']:.2f} | {f(hc.get('short', {}).get('qps'))} | "
              f"{f(hc.get('long', {}).get('qps'), 3)} | {f(h.get('work_per_s'))} | "
              f"{f(hc.get('long', {}).get('work_per_s'))} | "
              f"{f(hc.get('short', {}).get('slowdown', {}).get('mean'))} | "
              f"{f(r['cpu']['server_cpu_util'] * 100, 0)} % |")
        w("")

    if oh:
        w("## Overhead: pgbench TPC-B-like and select-only\n")
        w(f"{plan['overhead_clients']} clients, -M prepared, {plan['overhead_duration']} s per run, "
          f"{oh['kinds']['tpcb']['rounds']} rounds, variants interleaved (order alternating per round), "
          "server restarted before each run.\n")
        w(f"| workload | TPS {oh['base']} | TPS {oh['other']} | ratio | p99 ms {oh['base']} | "
          f"p99 ms {oh['other']} | ratio | server CPU µs/txn {oh['base']} | "
          f"CPU µs/txn {oh['other']} | ratio |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k, v in oh["kinds"].items():
            w(f"| {'TPC-B-like' if k == 'tpcb' else 'select-only'} | {v['base_tps']:.0f} | "
              f"{v['other_tps']:.0f} | {v['tps_ratio']:.3f} | {v['base_p99']:.2f} | "
              f"{v['other_p99']:.2f} | {v['p99_ratio']:.3f} | {f(v['base_cpu'], 1)} | "
              f"{f(v['other_cpu'], 1)} | {f(v['cpu_ratio'], 3)} |")
        w("")
        w("Server CPU per transaction (CPU seconds of the PostgreSQL processes ÷ transactions) is "
          "the steadier overhead figure on a shared machine: it does not move when another "
          "process takes CPU away from the benchmark, as TPS does.")
        w("")
        w("Per round (TPS):\n")
        for i, r in enumerate(meta["overhead"]["rounds"]):
            w(f"- round {i + 1}: " + "; ".join(
                f"{lab}: TPC-B {v['tpcb']['tps']:.0f}, select-only {v['select']['tps']:.0f} "
                f"(machine busy {v['tpcb'].get('machine_busy', 0) * 100:.0f} / "
                f"{v['select'].get('machine_busy', 0) * 100:.0f} %)"
                for lab, v in r.items()))
        w("")
    return "\n".join(out) + "\n"


def write(meta, run_dir: Path, publish: bool, outdir: Path | None = None):
    if publish:
        md_path, img_dir, prefix = RESULTS_MD, RESULTS_DIR, "results/"
    else:
        target = outdir or run_dir
        target.mkdir(parents=True, exist_ok=True)
        md_path, img_dir, prefix = target / "RESULTS.md", target, ""
    if not meta.get("open_loop"):
        if meta.get("app_pool"):
            md_path.write_text("# pg_stride bench: the application-pool form\n\n"
                               + "\n".join(app_pool_section(meta)) + "\n")
            log(f"wrote {md_path}")
            print(md_path.read_text(), flush=True)
            return
        log("no open-loop results: nothing to report")
        return
    imgs = plots(meta, img_dir)
    md_path.write_text(markdown(meta, imgs, prefix))
    log(f"wrote {md_path}")
    print()
    print(compact_table(meta), flush=True)
