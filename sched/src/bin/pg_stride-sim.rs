//! `pg_stride-sim`: replays a workload through the scheduler and prints slowdowns.
//!
//! ```text
//! pg_stride-sim run   [options] FILE.csv|-     replay a CSV workload
//! pg_stride-sim gen   [options]                write a generated workload as CSV
//! pg_stride-sim sweep [options]                generate and replay loads × slot counts
//! ```
//!
//! Options: `--slots N` (`sweep`: list), `--policy fifo|fair|decay|all`, `--slice-ms F`,
//! `--lambda F`, `--d-start N`, `--max-active N`, `--group-weight G=W` (repeatable),
//! `--queries N`, `--load F` (`sweep`: list), `--seed N`, `--procs N`.

use std::collections::HashMap;
use std::io::Read;
use std::process::ExitCode;

use pg_stride_sched::sim::{self, QuerySpec, Shape, SimConfig};
use pg_stride_sched::{GroupConfig, Policy};

const USAGE: &str =
    "usage: pg_stride-sim run [options] FILE.csv|- | gen [options] | sweep [options]
  --slots N          CPU slots (sweep: comma list, default 2,16)
  --policy P         fifo | fair | decay | all (default all)
  --slice-ms F       slice length (default 2)
  --lambda F         decay factor per quantum (default 0.9)
  --d-start N        quanta before decay starts (default 8)
  --max-active N     query table size; more queries wait for admission (default 4096)
  --group-weight G=W CPU weight of group G (repeatable)
  --queries N        generated queries (default 4000)
  --load F           load factor (sweep: comma list, default 0.8,0.9,1.0)
  --seed N           random seed (default 1)
  --procs N          processes per generated query (default 1)";

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
                let v = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
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

fn sim_config(args: &Args, slots: u32, policy: Policy) -> Result<SimConfig, String> {
    let mut cfg = SimConfig::new(slots, policy);
    cfg.slice_ns = (args.get("slice-ms", 2.0f64)? * 1e6) as u64;
    cfg.decay.lambda = args.get("lambda", cfg.decay.lambda)?;
    cfg.decay.d_start = args.get("d-start", cfg.decay.d_start)?;
    cfg.decay.quantum_ns = cfg.slice_ns;
    cfg.max_active = args.get("max-active", cfg.max_active)?;
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

fn print_run(workload: &[QuerySpec], args: &Args, slots: u32) -> Result<(), String> {
    println!("| policy | class | n | mean | p50 | p95 | p99 | max |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for policy in policies(args)? {
        let results = sim::simulate(workload, &sim_config(args, slots, policy)?);
        for c in sim::summarize(&results) {
            println!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                policy_name(policy),
                c.class,
                c.count,
                c.mean,
                c.p50,
                c.p95,
                c.p99,
                c.max
            );
        }
    }
    Ok(())
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

fn main_inner() -> Result<(), String> {
    let args = Args::parse()?;
    match args.command.as_str() {
        "run" => {
            let path = args.file.as_deref().ok_or("run needs a CSV file (or -)")?;
            let mut text = String::new();
            if path == "-" {
                std::io::stdin()
                    .read_to_string(&mut text)
                    .map_err(|e| e.to_string())?;
            } else {
                text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            }
            let workload = sim::parse_csv(&text)?;
            print_run(&workload, &args, args.get("slots", 16)?)
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
