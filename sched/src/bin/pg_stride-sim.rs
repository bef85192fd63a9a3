//! `pg_stride-sim`: replays a workload through the scheduler and prints slowdowns.
//!
//! ```text
//! pg_stride-sim run   [options] FILE.csv|-     replay a CSV workload
//! pg_stride-sim tune  [options] FILE.csv|-     search decay parameters for a workload
//! pg_stride-sim gen   [options]                write a generated workload as CSV
//! pg_stride-sim sweep [options]                generate and replay loads × slot counts
//! pg_stride-sim numa  [options]                oblivious vs affine NUMA placement
//! pg_stride-sim predict [options] [FILE.csv|-] priorities started by decay, prediction
//!                                              and an oracle (no file: a heavy-tailed mix)
//! ```
//!
//! Options: `--slots N` (`sweep`, `numa`: list), `--policy fifo|fair|decay|all`,
//! `--slice-ms F`, `--lambda F`, `--d-start N`, `--p0 N`, `--p-min N`, `--max-active N`,
//! `--preempt true|false`, `--start decay|predicted|oracle`, `--group-weight G=W`
//! (repeatable), `--queries N`, `--load F` (`sweep`, `numa`: list), `--seed N`, `--procs N`; `run --results FILE` (one policy: each query's times as CSV, in the
//! workload's arrival order); `run --tuner` with `--tuner-interval S`, `--tuner-window S`;
//! `tune --margin F`; NUMA (`run`, `numa`): `--nodes N`, `--penalty F`,
//! `--placement affine|oblivious` (`run`), `--steal-after K|never` (`numa`: list);
//! `gen --heavy-tail` and `predict`'s generated mix: `--fingerprints N`,
//! `--pareto-alpha F`, `--spread F`.

use std::collections::HashMap;
use std::io::Read;
use std::process::ExitCode;

use std::time::Instant;

use pg_stride_sched::decay::PriorityRange;
use pg_stride_sched::predict;
use pg_stride_sched::sim::{
    self, HeavyTail, NumaPlacement, NumaReport, NumaSim, QueryResult, QuerySpec, Shape,
    SimConfig, StartMode,
};
use pg_stride_sched::tuner::{self, LoopSettings, Trace, Tuner, TunerSettings};
use pg_stride_sched::{DecayParams, GroupConfig, Policy};

const USAGE: &str = "usage: pg_stride-sim run [options] FILE.csv|- | tune [options] FILE.csv|-
       | gen [options] | sweep [options] | numa [options] | predict [options] [FILE.csv|-]
  --slots N          CPU slots (sweep: comma list, default 2,16; numa: list, default 4,16)
  --policy P         fifo | fair | decay | all (default all; numa: one, default decay)
  --results FILE     run, one policy: write each query's times as CSV, in arrival order
  --tuner            run: also replay with the self-tuner in the loop (policy tuned)
  --tuner-interval S run --tuner: seconds between searches (default 60)
  --tuner-window S   run --tuner: seconds of trace a search replays (default 20)
  --margin F         tune, run --tuner: predicted gain needed to switch (default 0.03)
  --slice-ms F       slice length (default 2)
  --lambda F         decay factor per quantum (default 0.9)
  --d-start N        quanta before decay starts (default 8)
  --p0 N, --p-min N  initial and lowest priority of group 0's queries and of the groups
                     given a weight (default 10000 and 100)
  --max-active N     query table size; more queries wait for admission (default 4096)
  --preempt B        true: a process that starts waiting ends a lower-priority holder's
                     slice at once, as the extension does (default false)
  --start S          decay | predicted | oracle: where a query's priority starts, as with
                     pg_stride.predict off, on (from its fingerprint's earlier executions),
                     or by the CPU it will use (default decay; predict: all three)
  --group-weight G=W CPU weight of group G (repeatable)
  --queries N        generated queries (default 4000)
  --load F           load factor (sweep: comma list, default 0.8,0.9,1.0; numa: list,
                     default 0.7,0.9,1.0)
  --seed N           random seed (default 1)
  --procs N          processes per generated query (default 1)
  --nodes N          run, numa: NUMA nodes with equal CPUs, slots split over them
                     (default 2; run simulates NUMA only given one of these four)
  --penalty F        run, numa: CPU time factor away from the query's memory (default 1.3)
  --placement P      run: affine (numa = bind) | oblivious (numa = off) (default affine)
  --steal-after K    run, numa: slices a process waits at home before it may steal, or
                     never (run: default 4; numa: comma list, default never,1,4)
  --heavy-tail       gen: the heavy-tailed mix of repeating statements that predict
                     replays without a file
  --fingerprints N   heavy-tailed mix: distinct statements (default 200)
  --pareto-alpha F   heavy-tailed mix: Pareto shape of their typical CPU (default 0.8)
  --spread F         heavy-tailed mix: sd of ln(CPU) between executions (default 0.3)";

/// Options that take no value.
const FLAGS: [&str; 2] = ["tuner", "heavy-tail"];

struct Args {
    command: String,
    file: Option<String>,
    opts: HashMap<String, Vec<String>>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut it = std::env::args().skip(1);
        let command = it.next().ok_or("missing command")?;
        let mut file = None;
        let mut opts: HashMap<String, Vec<String>> = HashMap::new();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                let v = if FLAGS.contains(&name) {
                    "true".to_string()
                } else {
                    it.next().ok_or_else(|| format!("--{name} needs a value"))?
                };
                opts.entry(name.to_string()).or_default().push(v);
            } else if file.is_none() {
                file = Some(a);
            } else {
                return Err(format!("unexpected argument {a}"));
            }
        }
        Ok(Args {
            command,
            file,
            opts,
        })
    }

    fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.opts.get(name).and_then(|v| v.last()) {
            None => Ok(default),
            Some(s) => s.parse().map_err(|_| format!("bad --{name} {s}")),
        }
    }

    fn list<T: std::str::FromStr>(&self, name: &str, default: &str) -> Result<Vec<T>, String> {
        let raw = self
            .opts
            .get(name)
            .and_then(|v| v.last())
            .map_or(default, |s| s.as_str());
        raw.split(',')
            .map(|s| s.trim().parse().map_err(|_| format!("bad --{name} {raw}")))
            .collect()
    }
}

fn policies(args: &Args) -> Result<Vec<Policy>, String> {
    let all = vec![Policy::Fifo, Policy::FairStride, Policy::DecayingStride];
    Ok(match args.get("policy", "all".to_string())?.as_str() {
        "all" => all,
        "fifo" => vec![Policy::Fifo],
        "fair" => vec![Policy::FairStride],
        "decay" => vec![Policy::DecayingStride],
        other => return Err(format!("unknown policy {other}")),
    })
}

fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Fifo => "fifo",
        Policy::FairStride => "fair",
        Policy::DecayingStride => "decay",
    }
}

/// `--start`: where a query's priority starts (`predict` compares all three itself).
fn start_mode(args: &Args) -> Result<StartMode, String> {
    Ok(match args.get("start", "decay".to_string())?.as_str() {
        "decay" => StartMode::Decay,
        "predicted" => StartMode::Predicted,
        "oracle" => StartMode::Oracle,
        other => return Err(format!("unknown start {other}")),
    })
}

fn sim_config(args: &Args, slots: u32, policy: Policy) -> Result<SimConfig, String> {
    let mut cfg = SimConfig::new(slots, policy);
    cfg.slice_ns = (args.get("slice-ms", 2.0f64)? * 1e6) as u64;
    cfg.decay.lambda = args.get("lambda", cfg.decay.lambda)?;
    cfg.decay.d_start = args.get("d-start", cfg.decay.d_start)?;
    cfg.decay.quantum_ns = cfg.slice_ns;
    cfg.max_active = args.get("max-active", cfg.max_active)?;
    cfg.preempt = args.get("preempt", false)?;
    cfg.start = start_mode(args)?;
    for gw in args.opts.get("group-weight").into_iter().flatten() {
        let (g, w) = gw
            .split_once('=')
            .ok_or(format!("bad --group-weight {gw}"))?;
        let g: usize = g.parse().map_err(|_| format!("bad group in {gw}"))?;
        let w: u32 = w.parse().map_err(|_| format!("bad weight in {gw}"))?;
        if cfg.groups.len() <= g {
            cfg.groups.resize(g + 1, GroupConfig::default());
        }
        cfg.groups[g].weight = w;
    }
    // The priority range of group 0 (the one a replayed trace uses) and of the groups
    // given a weight: pg_stride.priority_initial and priority_min.
    if args.opts.contains_key("p0") || args.opts.contains_key("p-min") {
        let default = PriorityRange::default();
        let range = PriorityRange::new(
            args.get("p0", default.p0)?,
            args.get("p-min", default.p_min)?,
        );
        if cfg.groups.is_empty() {
            cfg.groups.push(GroupConfig::default());
        }
        for g in &mut cfg.groups {
            g.priority = range;
        }
    }
    Ok(cfg)
}

fn shape(args: &Args, load: f64, slots: u32) -> Result<Shape, String> {
    Ok(Shape {
        queries: args.get("queries", 4_000)?,
        load,
        slots,
        procs: args.get("procs", 1)?,
        seed: args.get("seed", 1)?,
        ..Shape::default()
    })
}

fn heavy_tail(args: &Args) -> Result<HeavyTail, String> {
    let d = HeavyTail::default();
    Ok(HeavyTail {
        queries: args.get("queries", d.queries)?,
        load: args.get("load", d.load)?,
        slots: args.get("slots", d.slots)?,
        fingerprints: args.get("fingerprints", d.fingerprints)?,
        pareto_alpha: args.get("pareto-alpha", d.pareto_alpha)?,
        spread: args.get("spread", d.spread)?,
        seed: args.get("seed", d.seed)?,
        ..d
    })
}

/// `predict`: the decaying policy with each query's priority started by plain decay, by
/// the prediction from its fingerprint's history, and by its true CPU (an oracle), and
/// how good the predictions were.
fn compare_starts(workload: &[QuerySpec], args: &Args, slots: u32) -> Result<(), String> {
    println!("| start | class | n | mean | p50 | p95 | p99 | max |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut quality = None;
    for (label, start) in [
        ("decay", StartMode::Decay),
        ("predicted", StartMode::Predicted),
        ("oracle", StartMode::Oracle),
    ] {
        let cfg = SimConfig {
            start,
            ..sim_config(args, slots, Policy::DecayingStride)?
        };
        let run = sim::simulate_run(workload, &cfg);
        print_rows(label, &run.results);
        quality = quality.or(run.quality);
    }
    if let Some(q) = quality {
        let judged = q.short_as_short + q.short_as_long + q.long_as_short + q.long_as_long;
        let close: u64 = q.log2_error[predict::ERROR_SPAN - 1..=predict::ERROR_SPAN + 1]
            .iter()
            .sum();
        let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.1} %", v * 100.0));
        println!();
        println!(
            "predicted: {judged} of {} queries ({} from history); short predicted short {}, \
             long predicted long {}; within 2x of the CPU used: {}",
            judged + q.unpredicted,
            q.from_history,
            pct(q.short_recall()),
            pct(q.long_recall()),
            pct((judged > 0).then(|| close as f64 / judged as f64)),
        );
    }
    Ok(())
}

fn print_rows(label: &str, results: &[QueryResult]) {
    for c in sim::summarize(results) {
        println!(
            "| {label} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            c.class, c.count, c.mean, c.p50, c.p95, c.p99, c.max
        );
    }
}

fn tuner_settings(args: &Args) -> Result<TunerSettings, String> {
    Ok(TunerSettings {
        margin: args.get("margin", TunerSettings::default().margin)?,
        ..TunerSettings::default()
    })
}

/// `--steal-after K|never`.
fn parse_steal(s: &str) -> Result<Option<u32>, String> {
    match s.trim() {
        "never" | "-1" => Ok(None),
        k => k
            .parse()
            .map(Some)
            .map_err(|_| format!("bad --steal-after {s}")),
    }
}

fn placement_name(p: NumaPlacement) -> String {
    match p {
        NumaPlacement::Oblivious => "oblivious".into(),
        NumaPlacement::Affine { steal_after: None } => "affine, never steal".into(),
        NumaPlacement::Affine {
            steal_after: Some(k),
        } => format!("affine, steal after {k}"),
    }
}

/// `run`'s NUMA setup: `None` unless `--nodes`, `--placement`, `--penalty` or
/// `--steal-after` is given.
fn run_numa(args: &Args) -> Result<Option<NumaSim>, String> {
    let given = ["nodes", "placement", "penalty", "steal-after"]
        .iter()
        .any(|o| args.opts.contains_key(*o));
    if !given {
        return Ok(None);
    }
    let steal_after = parse_steal(&args.get("steal-after", "4".to_string())?)?;
    let placement = match args.get("placement", "affine".to_string())?.as_str() {
        "affine" | "bind" => NumaPlacement::Affine { steal_after },
        "oblivious" | "off" => NumaPlacement::Oblivious,
        other => return Err(format!("unknown placement {other}")),
    };
    Ok(Some(numa_sim(args, args.get("nodes", 2)?, placement)?))
}

fn numa_sim(args: &Args, nodes: usize, placement: NumaPlacement) -> Result<NumaSim, String> {
    let penalty: f64 = args.get("penalty", 1.3)?;
    if !(penalty.is_finite() && penalty >= 1.0) {
        return Err(format!("--penalty must be at least 1, not {penalty}"));
    }
    if !(1..=64).contains(&nodes) {
        return Err(format!("--nodes must be 1 to 64, not {nodes}"));
    }
    Ok(NumaSim::new(nodes, penalty, placement))
}

fn print_numa(label: &str, r: &NumaReport) {
    for (n, u) in r.nodes.iter().enumerate() {
        println!(
            "| {label} | {n} | {} | {:.2} | {:.2} |",
            u.slots,
            u.cpu_ns as f64 / 1e9,
            u.remote_ns as f64 / 1e9
        );
    }
    println!(
        "| {label} | all | {} | {:.2} | {:.2} ({:.1} %); makespan {:.2} s, {:.2} queries/s, \
         idle slots {:.1} %, stranded {:.1} %, steals {} |",
        r.slots(),
        r.cpu_ns() as f64 / 1e9,
        r.nodes.iter().map(|u| u.remote_ns).sum::<u64>() as f64 / 1e9,
        r.remote_share() * 100.0,
        r.makespan_ns() as f64 / 1e9,
        r.throughput(),
        r.idle_share() * 100.0,
        r.stranded_share() * 100.0,
        r.steals
    );
}

/// Each query's times, ms, in the workload's order (by arrival): what a comparison
/// with a real run's trace needs per query.
fn results_csv(results: &[QueryResult]) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let opt = |ns: Option<u64>| ns.map_or(String::new(), |v| format!("{:.6}", ms(v)));
    let mut out = String::from(
        "arrival_ms,admitted_ms,finish_ms,latency_ms,isolated_ms,cpu_ms,max_wait_ms,class\n",
    );
    for r in results {
        out += &format!(
            "{:.6},{},{},{},{:.6},{:.6},{:.6},{}\n",
            ms(r.arrival_ns),
            opt(r.admitted_ns),
            opt(r.finish_ns),
            opt(r.latency_ns()),
            ms(r.isolated_ns),
            ms(r.received_ns),
            ms(r.max_wait_ns),
            r.class
        );
    }
    out
}

fn print_run(workload: &[QuerySpec], args: &Args, slots: u32) -> Result<(), String> {
    let numa = run_numa(args)?;
    println!("| policy | class | n | mean | p50 | p95 | p99 | max |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut numa_reports = Vec::new();
    for policy in policies(args)? {
        let cfg = SimConfig {
            numa: numa.clone(),
            ..sim_config(args, slots, policy)?
        };
        let run = sim::simulate_run(workload, &cfg);
        print_rows(policy_name(policy), &run.results);
        if let Some(path) = args.opts.get("results").and_then(|v| v.last()) {
            if policies(args)?.len() != 1 {
                return Err("--results needs one --policy".into());
            }
            std::fs::write(path, results_csv(&run.results)).map_err(|e| format!("{path}: {e}"))?;
        }
        numa_reports.extend(run.numa.map(|r| (policy, r)));
    }
    if let (Some(n), false) = (&numa, numa_reports.is_empty()) {
        println!();
        println!(
            "{}, {} node(s), remote penalty {}×",
            placement_name(n.placement),
            n.node_cpus.len(),
            n.remote_penalty
        );
        println!();
        println!("| policy | node | slots | CPU s | remote CPU s |");
        println!("|---|---|---:|---:|---:|");
        for (policy, r) in &numa_reports {
            print_numa(policy_name(*policy), r);
        }
    }
    if args.get("tuner", false)? {
        let secs = |name, default: f64| -> Result<u64, String> {
            Ok((args.get(name, default)? * 1e9) as u64)
        };
        let settings = LoopSettings {
            interval_ns: secs("tuner-interval", 60.0)?,
            window_ns: secs("tuner-window", 20.0)?,
            tuner: tuner_settings(args)?,
            ..LoopSettings::default()
        };
        let cfg = sim_config(args, slots, Policy::DecayingStride)?;
        let run = tuner::simulate_tuned(workload, &cfg, &settings);
        print_rows("tuned", &run.results);
        println!();
        println!("| at s | check | queries | finished | reason | λ | d_start | predicted gain |");
        println!("|---:|---|---:|---:|---|---:|---:|---:|");
        for r in &run.refreshes {
            let f = &r.refresh;
            println!(
                "| {:.1} | {:?} | {} | {} | {} | {:.3} | {} | {} |",
                r.at_ns as f64 / 1e9,
                f.check,
                f.queries,
                f.finished,
                f.reason,
                f.new.lambda,
                f.new.d_start,
                f.gain()
                    .map_or("-".into(), |g| format!("{:.1} %", g * 100.0))
            );
        }
    }
    Ok(())
}

/// The search over a whole workload file taken as one trace, and what the choice does.
fn tune(workload: Vec<QuerySpec>, args: &Args) -> Result<(), String> {
    let slots = args.get("slots", 16)?;
    let cfg = sim_config(args, slots, Policy::DecayingStride)?;
    let mut tuner = Tuner::new(tuner_settings(args)?);
    let started = Instant::now();
    let refresh = tuner.refresh(&Trace::from_workload(workload.clone()), &cfg);
    let elapsed = started.elapsed();
    let Some(best) = refresh.best else {
        return Err(format!("{} ({} queries)", refresh.reason, refresh.queries));
    };
    println!(
        "{} queries, {} slots: λ = {:.3}, d_start = {} ({}; predicted mean slowdown {:.3} \
         → {:.3}, {:+.1} %); {} simulations in {:.0} ms",
        refresh.queries,
        slots,
        best.lambda,
        best.d_start,
        refresh.reason,
        refresh.predicted_old.map_or(f64::NAN, |o| o.mean),
        refresh.predicted_best.map_or(f64::NAN, |o| o.mean),
        -refresh.gain().unwrap_or(0.0) * 100.0,
        refresh.simulations,
        elapsed.as_secs_f64() * 1e3
    );
    println!();
    println!("| decay | class | n | mean | p50 | p95 | p99 | max |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let label = |d: &DecayParams| format!("λ {:.3}, d_start {}", d.lambda, d.d_start);
    for decay in [cfg.decay, best] {
        let results = sim::simulate(
            &workload,
            &SimConfig {
                decay,
                ..cfg.clone()
            },
        );
        print_rows(&label(&decay), &results);
    }
    Ok(())
}

fn read_workload(args: &Args) -> Result<Vec<QuerySpec>, String> {
    let path = args
        .file
        .as_deref()
        .ok_or(format!("{} needs a CSV file (or -)", args.command))?;
    let mut text = String::new();
    if path == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
    } else {
        text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    }
    sim::parse_csv(&text)
}

fn sweep(args: &Args) -> Result<(), String> {
    let slot_counts: Vec<u32> = args.list("slots", "2,16")?;
    let loads: Vec<f64> = args.list("load", "0.8,0.9,1.0")?;
    println!("| slots | load | policy | short mean | short p50 | short p95 | short p99 | long mean | long p50 | long p95 | long p99 |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &slots in &slot_counts {
        for &load in &loads {
            let workload = sim::generate(&shape(args, load, slots)?);
            for policy in policies(args)? {
                let summaries =
                    sim::summarize(&sim::simulate(&workload, &sim_config(args, slots, policy)?));
                let find = |class: &str| summaries.iter().find(|c| c.class == class).cloned();
                let (Some(s), Some(l)) = (find("short"), find("long")) else {
                    return Err("workload lacks a short or long class".into());
                };
                println!(
                    "| {slots} | {load:.1} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    policy_name(policy),
                    s.mean,
                    s.p50,
                    s.p95,
                    s.p99,
                    l.mean,
                    l.p50,
                    l.p95,
                    l.p99
                );
            }
        }
    }
    Ok(())
}

/// Oblivious against affine placement (never stealing, and stealing after each `k` of
/// `--steal-after`) on the paper's workload shape, per slot count and load.
fn numa_table(args: &Args) -> Result<(), String> {
    let slot_counts: Vec<u32> = args.list("slots", "4,16")?;
    let loads: Vec<f64> = args.list("load", "0.7,0.9,1.0")?;
    let nodes: usize = args.get("nodes", 2)?;
    let raw = args
        .opts
        .get("steal-after")
        .and_then(|v| v.last())
        .map_or("never,1,4", |s| s.as_str());
    let steals = raw
        .split(',')
        .map(parse_steal)
        .collect::<Result<Vec<_>, _>>()?;
    let mut placements = vec![NumaPlacement::Oblivious];
    placements.extend(
        steals
            .iter()
            .map(|&steal_after| NumaPlacement::Affine { steal_after }),
    );
    let policy = match policies(args)?.as_slice() {
        [p] => *p,
        _ => Policy::DecayingStride,
    };
    println!(
        "{nodes} nodes, remote penalty {}×, policy {}; slowdowns mean / p99",
        numa_sim(args, nodes, NumaPlacement::Oblivious)?.remote_penalty,
        policy_name(policy)
    );
    println!();
    println!("| slots | load | placement | short | long | all mean | makespan s | queries/s | remote CPU | idle slots | stranded | steals |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &slots in &slot_counts {
        for &load in &loads {
            let workload = sim::generate(&shape(args, load, slots)?);
            for &placement in &placements {
                let cfg = SimConfig {
                    numa: Some(numa_sim(args, nodes, placement)?),
                    ..sim_config(args, slots, policy)?
                };
                let run = sim::simulate_run(&workload, &cfg);
                let summaries = sim::summarize(&run.results);
                let find = |class: &str| summaries.iter().find(|c| c.class == class).cloned();
                let (Some(s), Some(l), Some(all)) = (find("short"), find("long"), find("all"))
                else {
                    return Err("workload lacks a short or long class".into());
                };
                let r = run.numa.expect("a NUMA run reports NUMA");
                println!(
                    "| {slots} | {load:.1} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} | {:.2} | {:.2} | {:.1} % | {:.1} % | {:.1} % | {} |",
                    placement_name(placement),
                    s.mean,
                    s.p99,
                    l.mean,
                    l.p99,
                    all.mean,
                    r.makespan_ns() as f64 / 1e9,
                    r.throughput(),
                    r.remote_share() * 100.0,
                    r.idle_share() * 100.0,
                    r.stranded_share() * 100.0,
                    r.steals
                );
            }
        }
    }
    Ok(())
}

fn main_inner() -> Result<(), String> {
    let args = Args::parse()?;
    match args.command.as_str() {
        "run" => print_run(&read_workload(&args)?, &args, args.get("slots", 16)?),
        "predict" => {
            let workload = if args.file.is_some() {
                read_workload(&args)?
            } else {
                sim::generate_heavy_tail(&heavy_tail(&args)?)
            };
            compare_starts(&workload, &args, args.get("slots", 16)?)
        }
        "tune" => tune(read_workload(&args)?, &args),
        "gen" if args.get("heavy-tail", false)? => {
            print!("{}", sim::to_csv(&sim::generate_heavy_tail(&heavy_tail(&args)?)));
            Ok(())
        }
        "gen" => {
            let slots = args.get("slots", 16)?;
            print!(
                "{}",
                sim::to_csv(&sim::generate(&shape(
                    &args,
                    args.get("load", 0.9)?,
                    slots
                )?))
            );
            Ok(())
        }
        "sweep" => sweep(&args),
        "numa" => numa_table(&args),
        other => Err(format!("unknown command {other}")),
    }
}

fn main() -> ExitCode {
    match main_inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pg_stride-sim: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
