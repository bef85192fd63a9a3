"""TUNER.md: the report of a tuner phases run (bench/run --tuner-phases).  Pure Python."""

import datetime as dt
import math
from pathlib import Path

from . import analysis
from .common import RESULTS_DIR, log

# the phases' constants; phases.py imports nothing that needs a server at import time
BUCKET_S = 10.0


def phase_window(duration: float) -> tuple:
    from .phases import phase_window as pw
    return pw(duration)

CLASSES = ("short", "long")
# What the tuner is compared with: the shipped defaults it starts from (stride-tuner is
# the same configuration with pg_stride.tuner = on).
BASELINE = "stride-defaults"
STATS = ("mean", "p95", "p99")


def f(x, nd=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{nd}f}"


def publishable(meta) -> bool:
    """Only a run with phases of at least 120 s and both of the baseline and
    stride-tuner rewrites bench/results/TUNER.md; shorter ones (smoke runs) report into
    their run directory."""
    ph = meta.get("phases", {})
    configs = {r["config"] for r in ph.get("runs", [])}
    return ph.get("duration", 0) >= 120 and {BASELINE, "stride-tuner"} <= configs


def configs_of(meta) -> list:
    out = []
    for r in meta.get("phases", {}).get("runs", []):
        if r["config"] not in out:
            out.append(r["config"])
    # the baseline first when it ran
    out.sort(key=lambda n: 0 if n == BASELINE else 1)
    return out


def pooled(meta) -> dict:
    """(config, phase, class) -> summary of the slowdowns of all repetitions together."""
    acc = {}
    for r in meta.get("phases", {}).get("runs", []):
        for ph, st in r["phases"].items():
            for cls, c in st.get("classes", {}).items():
                acc.setdefault((r["config"], ph, cls), []).append(c["slowdowns"])
    return {k: analysis.pooled_summary(v) for k, v in acc.items()}


def pooled_rolling(meta, phase: str, cls: str = "short") -> dict:
    """config -> [(bucket start, n, mean)] over the repetitions together."""
    out = {}
    for r in meta.get("phases", {}).get("runs", []):
        roll = r["phases"].get(phase, {}).get(f"rolling_{cls}", [])
        acc = out.setdefault(r["config"], {})
        for b in roll:
            s, n = acc.get(b["t"], (0.0, 0))
            if b["n"]:
                acc[b["t"]] = (s + b["mean"] * b["n"], n + b["n"])
            else:
                acc.setdefault(b["t"], (0.0, 0))
    return {c: [(t, n, s / n if n else float("nan")) for t, (s, n) in sorted(v.items())]
            for c, v in out.items()}


def phase_table(meta) -> list:
    """Rows of the per-phase comparison: phase, class, n, per config mean/p95/p99 and the
    ratios of every other configuration to the first."""
    cfgs = configs_of(meta)
    pl = pooled(meta)
    rows = []
    for ph in [p["name"] for p in meta["phases"]["phases"]]:
        for cls in CLASSES:
            row = {"phase": ph, "class": cls, "configs": {}, "ratios": {}}
            for c in cfgs:
                row["configs"][c] = pl.get((c, ph, cls), analysis.summarize([]))
            base = row["configs"][cfgs[0]] if cfgs else None
            for c in cfgs[1:]:
                row["ratios"][c] = {k: analysis.ratio(row["configs"][c][k], base[k])
                                    for k in STATS}
            rows.append(row)
    return rows


def rep_ratios(meta) -> list:
    """[(rep, {(phase, class): {"mean", "p99"} ratio of the second configuration to the
    first})] for the repetitions in which both ran."""
    cfgs = configs_of(meta)
    if len(cfgs) < 2:
        return []
    by = {(r["config"], r["rep"]): r for r in meta["phases"]["runs"]}
    out = []
    for rep in sorted({r["rep"] for r in meta["phases"]["runs"]}):
        a, b = by.get((cfgs[0], rep)), by.get((cfgs[1], rep))
        if not a or not b:
            continue
        ratios = {}
        for p in meta["phases"]["phases"]:
            for cls in CLASSES:
                sa = a["phases"].get(p["name"], {}).get("classes", {}).get(cls, {}).get(
                    "slowdown", {})
                sb = b["phases"].get(p["name"], {}).get("classes", {}).get(cls, {}).get(
                    "slowdown", {})
                ratios[(p["name"], cls)] = {k: analysis.ratio(sb.get(k, float("nan")),
                                                              sa.get(k, float("nan")))
                                            for k in ("mean", "p99")}
        out.append((rep, ratios))
    return out


def rel(t, starts):
    """'B+37s' for epoch t given the phases' (name, start) list."""
    idx = analysis.phase_of(t, [s for _, s in starts])
    if idx is None:
        return f"{t - starts[0][1]:+.0f}s" if starts else "–"
    name, s = starts[idx]
    return f"{name}+{t - s:.0f}s"


def markdown(meta) -> str:
    ph = meta["phases"]
    cfgs = configs_of(meta)
    out = []
    w = out.append
    plan = meta["plan"]
    m = meta.get("machine", {})
    w("# pg_stride tuner under a workload shift")
    w("")
    w("`bench/run --tuner-phases` (see bench/README.md, \"Tuner phases\"): three consecutive "
      "open-loop phases at one load α, the same arrivals for every configuration, each "
      "sequence on a freshly started server; configurations alternate order between "
      "repetitions.")
    w("")
    major = "".join(ch for ch in m.get("postgres", "").split(")")[-1].strip().split(".")[0]
                    if ch.isdigit())
    env = f"PG={major} . scripts/pg-env && " if major and major != "15" else ""
    cmd = (f"{env}bench/run --tuner-phases --alphas {ph['alpha']} --phase-duration {ph['duration']} "
           f"--reps {ph['reps']} --configs {','.join(cfgs)}"
           + (f" --prime {ph['prime_s']}" if ph["prime_s"] != 60 else ""))
    w(f"- command: `{cmd}` (α {ph['alpha']}, {ph['duration']} s per phase, "
      f"{ph['prime_s']} s of unmeasured phase-A arrivals before phase A)")
    w(f"- run: {meta.get('started', '?')} – {meta.get('finished', '?')}, "
      f"{meta.get('elapsed_s', 0) / 60:.0f} min in all (with data check and isolated latencies)")
    w(f"- machine: {m.get('cpu', '?')}, {m.get('ncpus', '?')} CPUs, {m.get('mem_gib', '?')} GiB; "
      f"{m.get('postgres', '?')}; pg_stride.so {m.get('pg_stride_so', '?')} "
      f"({m.get('pg_stride_so_mtime', '?')}); load average at start "
      f"{' '.join(m.get('loadavg_start', []))}, at end {' '.join(m.get('loadavg_end', []))}")
    if m.get("pg_stride_so_changed"):
        w(f"- **Warning**: pg_stride.so was replaced during the run ({m['pg_stride_so_changed']})")
    sc = meta.get("scales", {})
    w("")
    w("| phase | short slot | long slot | d (mean isolated latency of an arrival) | arrivals/s | seed |")
    w("|---|---|---|---|---|---|")
    for p in ph["phases"]:
        short_sf = sc.get(p["short_from"], "?")
        w(f"| {p['name']} | SF {short_sf} (weight 3) | SF {sc.get('long', '?')} (weight 1) | "
          f"{ph['mean_isolated_s'][p['name']] * 1000:.0f} ms | {ph['rates'][p['name']]:.2f} | "
          f"{p['seed']} |")
    w("")
    w("Slowdown = response time (completion − scheduled arrival) ÷ isolated latency of the "
      "same query at the same scale. In phase B the \"short\" row is the short slot's "
      "arrivals, which run SF-0.5 queries (slowdown against their SF-0.5 isolated latency). "
      f"Measured: the arrivals of the whole phase up to 5 % (≥ 3 s) before its end. "
      "Figures pool the repetitions (same arrivals each time).")
    w("")

    # ---- per phase table
    w("## Per phase and class: slowdown")
    w("")
    if len(cfgs) >= 2:
        base = cfgs[0]
        for other in cfgs[1:]:
            w(f"Ratios: {other} ÷ {base} (below 1: {other} is better).")
            w("")
            w(f"| phase | class | n | {base} mean | {other} mean | ratio | {base} p95 | "
              f"{other} p95 | ratio | {base} p99 | {other} p99 | ratio |")
            w("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for row in phase_table(meta):
                b, o, r = row["configs"][base], row["configs"][other], row["ratios"][other]
                w(f"| {row['phase']} | {row['class']} | {b['n']}/{o['n']} | " + " | ".join(
                    f"{f(b[k])} | {f(o[k])} | {f(r[k], 3)}" for k in STATS) + " |")
            w("")
    else:
        w("| phase | class | config | n | mean | p95 | p99 |")
        w("|---|---|---|---|---|---|---|")
        for row in phase_table(meta):
            for c, s in row["configs"].items():
                w(f"| {row['phase']} | {row['class']} | {c} | {s['n']} | {f(s['mean'])} | "
                  f"{f(s['p95'])} | {f(s['p99'])} |")
        w("")

    # ---- per repetition
    w("## Per repetition")
    w("")
    w("Short and long mean / p99 slowdown of each sequence, in the order they ran. "
      "\"server CPU\" is the PostgreSQL processes' CPU over the sequence as a share of all "
      "CPUs, \"machine\" the whole machine's: the difference is what other processes on "
      "the shared machine took. \"max in system\" per phase: arrivals not yet finished at "
      "once; at the client count (" + str(plan.get("clients", "?")) + ") pgbench ran out of "
      "clients: later arrivals waited for a free client (max lag given). Their response "
      "times still count from the scheduled arrival (the lag is in them), but while "
      "clients ran out at most that many queries were in the server, with a FIFO queue in "
      "front of it, so the scheduler saw fewer of the waiting queries.")
    w("")
    names = [p["name"] for p in ph["phases"]]
    w("| # | config | rep | " + " | ".join(f"{n} short | {n} long" for n in names) +
      " | server CPU | max in system | failed |")
    w("|---|---|---|" + "---|---|" * len(names) + "---|---|---|")
    for i, r in enumerate(ph["runs"]):
        cells = []
        mis, failed = [], 0
        for n in names:
            st = r["phases"].get(n, {})
            c = st.get("classes", {})
            for cls in CLASSES:
                s = c.get(cls, {}).get("slowdown", {})
                cells.append(f"{f(s.get('mean'))} / {f(s.get('p99'))}")
            mi = str(st.get("max_in_system", "–"))
            if st.get("ran_out_of_clients"):
                mi += f" (out of clients, lag ≤ {st.get('max_lag_s', 0):.1f} s)"
            mis.append(mi)
            failed += st.get("failed", 0)
        bad = [s for s in r["steps"] if s.get("rc") or s.get("timed_out")]
        w(f"| {i + 1} | {r['config']} | {r['rep'] + 1} | " + " | ".join(cells) +
          f" | {r['cpu']['server_cpu_util'] * 100:.0f} % (machine {r['cpu']['machine_busy'] * 100:.0f} %)"
          f" | {'/'.join(mis)} | {failed}{' (pgbench failed: ' + ', '.join(s['name'] for s in bad) + ')' if bad else ''} |")
    w("")

    # ---- ratios within each repetition
    pairs = rep_ratios(meta)
    if pairs:
        base, other = cfgs[0], cfgs[1]
        w(f"Within each repetition the two sequences ran back to back, so they shared the "
          f"machine's conditions more than sequences of different repetitions: "
          f"{other} ÷ {base} per repetition (mean / p99).")
        w("")
        w("| rep | " + " | ".join(f"{n} short | {n} long" for n in names) + " |")
        w("|---|" + "---|---|" * len(names))
        for rep, ratios in pairs:
            w(f"| {rep + 1} | " + " | ".join(
                f"{f(ratios[(n, cls)]['mean'], 3)} / {f(ratios[(n, cls)]['p99'], 3)}"
                for n in names for cls in CLASSES) + " |")
        w("")

    # ---- arrivals check
    w("## Same arrivals")
    w("")
    w("Fingerprint (count:CRC of the script sequence) of each phase's measured arrivals.")
    w("")
    w("| phase | " + " | ".join(f"{r['config']} rep {r['rep'] + 1}" for r in ph["runs"]) +
      " | equal |")
    w("|---|" + "---|" * len(ph["runs"]) + "---|")
    for n in names:
        fps = [r["phases"].get(n, {}).get("arrival_fingerprint", "–") for r in ph["runs"]]
        w(f"| {n} | " + " | ".join(fps) + f" | {'yes' if len(set(fps)) == 1 else '**no**'} |")
    w("")
    short_runs = []
    for n in names:
        counts = [(r, r["phases"].get(n, {}).get("arrival_fingerprint", "0:").split(":")[0])
                  for r in ph["runs"]]
        most = max((int(c) for _, c in counts if c.isdigit()), default=0)
        for r, c in counts:
            if c.isdigit() and int(c) < most:
                st = r["phases"][n]
                short_runs.append(f"{r['config']} rep {r['rep'] + 1} phase {n}: {c} of {most} "
                                  f"arrivals (max schedule lag {st.get('max_lag_s', 0):.1f} s)")
    if short_runs:
        w("Fewer arrivals: " + "; ".join(short_runs) + ". pgbench `-T` ends a run at its "
          "end whatever the backlog: arrivals that were still waiting for a free client then "
          "(schedule lag beyond the 5 % margin at the window's end) never run, so these "
          "runs miss their last, most delayed arrivals, and their figures for the phase are "
          "somewhat too good.")
        w("")

    # ---- rolling view
    w(f"## Adaptation: short-class mean slowdown per {BUCKET_S:.0f} s of arrivals")
    w("")
    w("Buckets by arrival time after the phase's first arrival, repetitions pooled "
      "(n = arrivals in the bucket).")
    w("")
    for n in names:
        roll = pooled_rolling(meta, n, "short")
        ts = sorted({t for v in roll.values() for t, _, _ in v})
        if not ts:
            continue
        w(f"Phase {n}:")
        w("")
        w("| t (s) | " + " | ".join(f"{c} (n)" for c in cfgs) +
          (" | ratio |" if len(cfgs) == 2 else " |"))
        w("|---|" + "---|" * len(cfgs) + ("---|" if len(cfgs) == 2 else ""))
        for t in ts:
            vals = []
            means = []
            for c in cfgs:
                e = next((x for x in roll.get(c, []) if x[0] == t), None)
                vals.append(f"{f(e[2])} ({e[1]})" if e else "–")
                means.append(e[2] if e else float("nan"))
            extra = (f" | {f(analysis.ratio(means[1], means[0]), 3)} |"
                     if len(cfgs) == 2 else " |")
            hi = min(t + BUCKET_S, phase_window(ph["duration"])[1])
            w(f"| {t:.0f}–{hi:.0f} | " + " | ".join(vals) + extra)
        w("")

    # ---- tuner CPU
    w("## The tuner's own CPU")
    w("")
    w("CPU time (utime + stime, /proc/<pid>/stat) of the `pg_stride tuner` process "
      "(pid from `pg_stride.scheduler.tuner_pid`) from just before the priming to the end of "
      "phase C, as a share of one CPU over that time; beside it the sum of the recorded "
      "refreshes' `cpu_ms` (the view records searches and the shift checks that found a "
      "shift, not the shift checks that found none).")
    w("")
    w("| config | rep | tuner pid | CPU s | wall s | share of one CPU | refreshes (searches / shift) | Σ cpu_ms of refreshes |")
    w("|---|---|---|---|---|---|---|---|")
    for r in ph["runs"]:
        t = r["tuner"]
        refs = r.get("refreshes", [])
        ns = sum(1 for x in refs if x.get("action") == "search")
        cpu_ms = sum(x.get("cpu_ms") or 0 for x in refs)
        pid = str(t.get("pid") or "–")
        if t.get("pid_end") and t.get("pid_end") != t.get("pid"):
            pid += f" → {t['pid_end']} (restarted)"
        share = t.get("share_of_one_cpu")
        w(f"| {r['config']} | {r['rep'] + 1} | {pid} | {f(t.get('cpu_s'))} | {r['wall_s']:.0f} | "
          f"{f(share * 100 if share is not None else None, 3)} % | {ns} / {len(refs) - ns} | "
          f"{cpu_ms:.0f} |")
    w("")

    # ---- refreshes
    for r in ph["runs"]:
        refs = r.get("refreshes", [])
        if not refs and not r.get("decay_timeline"):
            continue
        starts = [("prime", s["started"]) if not s.get("phase") else (s["phase"], s["started"])
                  for s in r["steps"]]
        w(f"## Refreshes: {r['config']}, repetition {r['rep'] + 1}")
        w("")
        s0, s1 = r.get("scheduler_start", {}), r.get("scheduler_end", {})
        w(f"Decay in force at the start: λ {s0.get('decay_lambda')}, d_start "
          f"{s0.get('decay_start')} (tuned: {s0.get('decay_tuned')}); at the end: λ "
          f"{s1.get('decay_lambda')}, d_start {s1.get('decay_start')} (tuned: "
          f"{s1.get('decay_tuned')}).")
        w("")
        if refs:
            w("| time | action | statements (finished) | simulations | cpu_ms | old λ / d_start | "
              "best λ / d_start | new λ / d_start | predicted mean before → after | "
              "short before → after | observed mean | adopted | reason |")
            w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for x in refs:
                w(f"| {rel(x['at'], starts)} | {x.get('action')} | {x.get('statements')} "
                  f"({x.get('finished')}) | {x.get('simulations')} | {f(x.get('cpu_ms'), 1)} | "
                  f"{f(x.get('old_lambda'), 3)} / {x.get('old_decay_start')} | "
                  f"{f(x.get('best_lambda'), 3)} / {x.get('best_decay_start')} | "
                  f"{f(x.get('new_lambda'), 3)} / {x.get('new_decay_start')} | "
                  f"{f(x.get('predicted_mean_before'))} → {f(x.get('predicted_mean_after'))} | "
                  f"{f(x.get('predicted_short_mean_before'))} → "
                  f"{f(x.get('predicted_short_mean_after'))} | "
                  f"{f(x.get('observed_mean_slowdown'))} | "
                  f"{'**yes**' if x.get('adopted') else 'no'} | {x.get('reason') or ''} |")
            w("")
        tl = r.get("decay_timeline", [])
        if len(tl) > 1:
            w("Decay in force, as read every 5 s (changes only): " + "; ".join(
                f"{rel(e['at'], starts)} λ {e.get('decay_lambda')} d_start "
                f"{e.get('decay_start')}{' (tuned)' if e.get('decay_tuned') else ''}"
                for e in tl))
            w("")
    return "\n".join(out) + "\n"


def compact(meta) -> str:
    lines = []
    cfgs = configs_of(meta)
    lines.append(f"{'phase':5s} {'class':5s} " + " ".join(f"{c:>24s}" for c in cfgs))
    for row in phase_table(meta):
        lines.append(f"{row['phase']:5s} {row['class']:5s} " + " ".join(
            f"{'mean ' + f(row['configs'][c]['mean']) + ' p99 ' + f(row['configs'][c]['p99']):>24s}"
            for c in cfgs))
    for r in meta["phases"]["runs"]:
        t = r["tuner"]
        if t.get("share_of_one_cpu") is not None:
            lines.append(f"{r['config']} rep {r['rep'] + 1}: tuner CPU {t['cpu_s']:.2f} s = "
                         f"{t['share_of_one_cpu'] * 100:.3f} % of one CPU")
    return "\n".join(lines)


def write(meta, run_dir: Path, publish: bool, outdir: Path | None = None):
    if not meta.get("phases", {}).get("runs"):
        log("no phases results: nothing to report")
        return
    text = markdown(meta)
    target = outdir or run_dir
    target.mkdir(parents=True, exist_ok=True)
    (target / "TUNER.md").write_text(text)
    log(f"wrote {target / 'TUNER.md'}")
    if publish:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "TUNER.md").write_text(text)
        log(f"wrote {RESULTS_DIR / 'TUNER.md'}")
    print()
    print(compact(meta), flush=True)
