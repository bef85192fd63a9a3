//! Workloads: what arrives when, needing how much CPU.
//!
//! CSV format, one query per line after a header:
//!
//! ```text
//! arrival_ms,cpu_ms,group,class,procs,priority,fingerprint
//! 0.000,12.500,0,short,1,0,17
//! 3.210,180.000,0,long,1,0,42
//! ```
//!
//! `procs` (processes working for the query, default 1), `priority` (a pinned static
//! priority; 0 or absent: decaying) and `fingerprint` (the query identifier predictions
//! are keyed by; 0 or absent: none) may be left out. Lines starting with `#` are skipped.

use std::fmt::Write as _;

/// One query of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct QuerySpec {
    /// Arrival time, ns from the start.
    pub arrival_ns: u64,
    /// CPU time the query needs in total, ns.
    pub cpu_ns: u64,
    /// Resource group index.
    pub group: u32,
    /// Label the report groups by ("short", "long").
    pub class: String,
    /// Processes working for it (leader plus parallel workers), at least 1.
    pub procs: u32,
    /// A pinned static priority instead of the decaying one.
    pub pinned_priority: Option<u32>,
    /// The statement's fingerprint (query identifier), which predictions are keyed by;
    /// 0: none.
    pub fingerprint: u64,
}

/// Reads a workload CSV.
pub fn parse_csv(text: &str) -> Result<Vec<QuerySpec>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("arrival") {
            continue;
        }
        let err = |what: &str| format!("line {}: {what}: {line}", n + 1);
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() < 4 {
            return Err(err(
                "expected arrival_ms,cpu_ms,group,class[,procs[,priority]]",
            ));
        }
        let ms = |s: &str, what: &str| -> Result<u64, String> {
            let v: f64 = s.parse().map_err(|_| err(what))?;
            if !(v.is_finite() && v >= 0.0) {
                return Err(err(what));
            }
            Ok((v * 1e6).round() as u64)
        };
        let opt_u32 = |i: usize, what: &str| -> Result<u32, String> {
            match cols.get(i) {
                None | Some(&"") => Ok(0),
                Some(s) => s.parse().map_err(|_| err(what)),
            }
        };
        // PostgreSQL shows query identifiers as bigint, so negative ones are its upper half.
        let fingerprint = match cols.get(6) {
            None | Some(&"") => 0,
            Some(s) => s
                .parse::<u64>()
                .or_else(|_| s.parse::<i64>().map(|v| v as u64))
                .map_err(|_| err("bad fingerprint"))?,
        };
        out.push(QuerySpec {
            arrival_ns: ms(cols[0], "bad arrival_ms")?,
            cpu_ns: ms(cols[1], "bad cpu_ms")?.max(1),
            group: cols[2].parse().map_err(|_| err("bad group"))?,
            class: cols[3].to_string(),
            procs: opt_u32(4, "bad procs")?.max(1),
            pinned_priority: Some(opt_u32(5, "bad priority")?).filter(|&p| p > 0),
            fingerprint,
        });
    }
    out.sort_by_key(|q| q.arrival_ns);
    Ok(out)
}

/// Writes a workload CSV that [`parse_csv`] reads back.
pub fn to_csv(queries: &[QuerySpec]) -> String {
    let mut s = String::from("arrival_ms,cpu_ms,group,class,procs,priority,fingerprint\n");
    for q in queries {
        let _ = writeln!(
            s,
            "{:.6},{:.6},{},{},{},{},{}",
            q.arrival_ns as f64 / 1e6,
            q.cpu_ns as f64 / 1e6,
            q.group,
            q.class,
            q.procs,
            q.pinned_priority.unwrap_or(0),
            q.fingerprint
        );
    }
    s
}

/// The workload shape of wagner2021 §5.1: Poisson arrivals, 75 % short and 25 % long
/// queries, where the short ones need about a tenth of the CPU of the long ones (TPC-H at
/// SF3 vs SF30) and so make up about a quarter of the total CPU time.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Number of queries.
    pub queries: usize,
    /// Load factor α: arrival rate = α · slots / mean CPU demand.
    pub load: f64,
    /// CPU slots the load is computed for.
    pub slots: u32,
    /// Fraction of short queries.
    pub short_fraction: f64,
    /// CPU demand of short queries, ms: log-uniform in this range.
    pub short_ms: (f64, f64),
    /// CPU demand of long queries, ms: log-uniform in this range.
    pub long_ms: (f64, f64),
    /// Processes per query.
    pub procs: u32,
    /// Random seed.
    pub seed: u64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            queries: 4_000,
            load: 0.9,
            slots: 16,
            short_fraction: 0.75,
            short_ms: (5.0, 40.0),
            long_ms: (50.0, 400.0),
            procs: 1,
            seed: 1,
        }
    }
}

impl Shape {
    /// Expected CPU demand of one query, ms.
    pub fn mean_cpu_ms(&self) -> f64 {
        let log_uniform_mean = |(a, b): (f64, f64)| if b > a { (b - a) / (b / a).ln() } else { a };
        self.short_fraction * log_uniform_mean(self.short_ms)
            + (1.0 - self.short_fraction) * log_uniform_mean(self.long_ms)
    }
}

/// Generates a workload of the given shape.
pub fn generate(shape: &Shape) -> Vec<QuerySpec> {
    let mut rng = SplitMix64(shape.seed);
    let rate_per_ms = shape.load * shape.slots as f64 / shape.mean_cpu_ms();
    let mut now_ms = 0.0;
    (0..shape.queries)
        .map(|_| {
            now_ms += -(1.0 - rng.unit()).ln() / rate_per_ms;
            let short = rng.unit() < shape.short_fraction;
            let (a, b) = if short { shape.short_ms } else { shape.long_ms };
            let cpu_ms = a * (b / a).powf(rng.unit());
            QuerySpec {
                arrival_ns: (now_ms * 1e6) as u64,
                cpu_ns: ((cpu_ms * 1e6) as u64).max(1),
                group: 0,
                class: if short { "short" } else { "long" }.to_string(),
                procs: shape.procs.max(1),
                pinned_priority: None,
                fingerprint: 0,
            }
        })
        .collect()
}

/// A heavy-tailed mix of repeating statements: `fingerprints` statements whose typical
/// CPU follows a bounded Pareto distribution (most are small, a few are huge), each
/// execution of one within a log-normal spread of its typical CPU, statements equally
/// likely to arrive, Poisson arrivals. A query's class is "short" when it needs at most
/// `short_ms`, else "long".
#[derive(Clone, Debug, PartialEq)]
pub struct HeavyTail {
    /// Number of queries.
    pub queries: usize,
    /// Load factor α: arrival rate = α · slots / mean CPU demand.
    pub load: f64,
    /// CPU slots the load is computed for.
    pub slots: u32,
    /// Distinct statements.
    pub fingerprints: usize,
    /// Pareto shape of the statements' typical CPU (smaller: heavier tail).
    pub pareto_alpha: f64,
    /// Bounds of the statements' typical CPU, ms.
    pub cpu_ms: (f64, f64),
    /// Standard deviation of the natural log of one execution's CPU around its
    /// statement's typical CPU.
    pub spread: f64,
    /// Classification threshold for the report, ms.
    pub short_ms: f64,
    /// Random seed.
    pub seed: u64,
}

impl Default for HeavyTail {
    fn default() -> Self {
        HeavyTail {
            queries: 4_000,
            load: 0.9,
            slots: 16,
            fingerprints: 200,
            pareto_alpha: 0.8,
            cpu_ms: (1.0, 2_000.0),
            spread: 0.3,
            short_ms: 16.0,
            seed: 1,
        }
    }
}

/// Generates a heavy-tailed workload; fingerprints are 1, 2, ….
pub fn generate_heavy_tail(shape: &HeavyTail) -> Vec<QuerySpec> {
    let mut rng = SplitMix64(shape.seed);
    let (lo, hi) = shape.cpu_ms;
    let a = shape.pareto_alpha.max(0.01);
    // Inverse CDF of the Pareto distribution bounded to [lo, hi].
    let typical: Vec<f64> = (0..shape.fingerprints.max(1))
        .map(|_| {
            let u = rng.unit();
            let ratio = (lo / hi).powf(a);
            lo / (1.0 - u * (1.0 - ratio)).powf(1.0 / a)
        })
        .collect();
    let mean_spread = (shape.spread * shape.spread / 2.0).exp();
    let mean_ms = typical.iter().sum::<f64>() / typical.len() as f64 * mean_spread;
    let rate_per_ms = shape.load * shape.slots as f64 / mean_ms;
    let mut now_ms = 0.0;
    (0..shape.queries)
        .map(|_| {
            now_ms += -(1.0 - rng.unit()).ln() / rate_per_ms;
            let f = (rng.next() % typical.len() as u64) as usize;
            let cpu_ms = typical[f] * (shape.spread * rng.normal()).exp();
            QuerySpec {
                arrival_ns: (now_ms * 1e6) as u64,
                cpu_ns: ((cpu_ms * 1e6) as u64).max(1),
                group: 0,
                class: if cpu_ms <= shape.short_ms { "short" } else { "long" }.to_string(),
                procs: 1,
                pinned_priority: None,
                fingerprint: f as u64 + 1,
            }
        })
        .collect()
}

/// Small deterministic generator (SplitMix64), so the simulator needs no dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // in (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip() {
        let w = generate(&Shape {
            queries: 50,
            ..Shape::default()
        });
        let back = parse_csv(&to_csv(&w)).unwrap();
        assert_eq!(back.len(), 50);
        for (a, b) in w.iter().zip(&back) {
            assert!(a.arrival_ns.abs_diff(b.arrival_ns) <= 1);
            assert!(a.cpu_ns.abs_diff(b.cpu_ns) <= 1);
            assert_eq!(
                (&a.class, a.group, a.procs, a.fingerprint),
                (&b.class, b.group, b.procs, b.fingerprint)
            );
        }
    }

    #[test]
    fn parse_accepts_short_rows_and_rejects_garbage() {
        let w = parse_csv("# comment\narrival_ms,cpu_ms,group,class\n5,2.5,1,x,1,0,-2\n1,1,0,y,4,300\n")
            .unwrap();
        assert_eq!(w[1].fingerprint, u64::MAX - 1, "a bigint query identifier");
        assert_eq!(w[0].class, "y"); // sorted by arrival
        assert_eq!((w[0].procs, w[0].pinned_priority), (4, Some(300)));
        assert_eq!(
            (w[1].cpu_ns, w[1].group, w[1].procs, w[1].pinned_priority),
            (2_500_000, 1, 1, None)
        );
        assert!(parse_csv("1,2,3\n").is_err());
        assert!(parse_csv("1,-2,0,x\n").is_err());
        assert!(parse_csv("a,2,0,x\n").is_err());
    }

    #[test]
    fn heavy_tail_repeats_statements_with_most_of_them_small() {
        let shape = HeavyTail {
            queries: 20_000,
            load: 0.8,
            slots: 2,
            ..HeavyTail::default()
        };
        let w = generate_heavy_tail(&shape);
        let fingerprints: std::collections::HashSet<u64> =
            w.iter().map(|q| q.fingerprint).collect();
        assert!(fingerprints.len() > 150 && fingerprints.len() <= 200);
        assert!(!fingerprints.contains(&0));
        let short = w.iter().filter(|q| q.class == "short").count() as f64 / w.len() as f64;
        assert!(short > 0.5, "short share {short}");
        // the few long ones take most of the CPU
        let total: u64 = w.iter().map(|q| q.cpu_ns).sum();
        let long: u64 = w.iter().filter(|q| q.class == "long").map(|q| q.cpu_ns).sum();
        let long_share = long as f64 / total as f64;
        assert!(long_share > 0.5, "long CPU share {long_share}");
        let span = w.last().unwrap().arrival_ns as f64;
        let load = total as f64 / span / 2.0;
        assert!((load - 0.8).abs() < 0.15, "load {load}");
    }

    #[test]
    fn generated_shape_matches_the_paper() {
        let shape = Shape {
            queries: 20_000,
            load: 0.8,
            slots: 2,
            ..Shape::default()
        };
        let w = generate(&shape);
        let short: Vec<_> = w.iter().filter(|q| q.class == "short").collect();
        let frac = short.len() as f64 / w.len() as f64;
        assert!((frac - 0.75).abs() < 0.02, "short fraction {frac}");
        let total: u64 = w.iter().map(|q| q.cpu_ns).sum();
        let short_cpu: u64 = short.iter().map(|q| q.cpu_ns).sum();
        let share = short_cpu as f64 / total as f64;
        assert!((0.18..0.30).contains(&share), "short CPU share {share}");
        // Offered load: CPU demanded per unit of time and slot.
        let span = w.last().unwrap().arrival_ns as f64;
        let load = total as f64 / span / 2.0;
        assert!((load - 0.8).abs() < 0.05, "load {load}");
    }
}
