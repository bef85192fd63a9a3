//! The self-tuner in the loop (wagner2021 §4; docs/design.md §9 1): on a
//! workload that shifts from the paper's shape to queries 10× longer and back, tuning
//! must lower the short queries' mean slowdown where the defaults are wrong (phase B) and
//! not raise it elsewhere; on a stationary workload it must change nothing that matters.
//!
//! Each phase is 60 s of Poisson arrivals at load 0.9 on 2 slots: A = 75 % short queries
//! of 5–40 ms CPU and 25 % long ones of 50–400 ms; B = the same, 10× longer; C = A again.
//! Six seeds; a phase's figure is the mean slowdown of all short queries that arrived in
//! it, over the six runs. The tuner runs with `LoopSettings::default()`, and sees only
//! what a tracer would (the CPU running queries had used so far).

use pg_stride_sched::sim::{generate, simulate, QueryResult, QuerySpec, Shape, SimConfig};
use pg_stride_sched::tuner::{simulate_tuned, Check, LoopSettings, Reason, TunedRun};
use pg_stride_sched::Policy;

const PHASE_NS: u64 = 60_000_000_000;
const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];
const LOAD: f64 = 0.9;
const SLOTS: u32 = 2;

/// Three phases of `PHASE_NS`, with CPU demands scaled by `scales`.
fn phases(seed: u64, scales: [f64; 3]) -> Vec<QuerySpec> {
    let mut out = Vec::new();
    for (p, scale) in scales.into_iter().enumerate() {
        let shape = Shape {
            load: LOAD,
            slots: SLOTS,
            seed: seed * 10 + p as u64,
            short_ms: (5.0 * scale, 40.0 * scale),
            long_ms: (50.0 * scale, 400.0 * scale),
            ..Shape::default()
        };
        // Enough queries to fill the phase, then cut at its end.
        let per_ms = LOAD * SLOTS as f64 / shape.mean_cpu_ms();
        let queries = (per_ms * PHASE_NS as f64 / 1e6 * 1.5) as usize + 10;
        let start = p as u64 * PHASE_NS;
        out.extend(
            generate(&Shape { queries, ..shape })
                .into_iter()
                .filter(|q| q.arrival_ns < PHASE_NS)
                .map(|q| QuerySpec {
                    arrival_ns: q.arrival_ns + start,
                    ..q
                }),
        );
    }
    out
}

/// Slowdowns of the short queries that arrived in each phase.
#[derive(Default)]
struct PerPhase([Vec<f64>; 3]);

impl PerPhase {
    fn add(&mut self, results: &[QueryResult]) {
        for r in results.iter().filter(|r| r.class == "short") {
            let phase = (r.arrival_ns / PHASE_NS) as usize;
            self.0[phase].push(r.slowdown().expect("every query finishes"));
        }
    }

    fn mean(&self, phase: usize) -> f64 {
        let v = &self.0[phase];
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn p99(&self, phase: usize) -> f64 {
        let mut v = self.0[phase].clone();
        v.sort_by(f64::total_cmp);
        v[((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
    }
}

/// Fixed defaults and the tuner in the loop over all seeds; prints the table.
fn compare(
    what: &str,
    seeds: &[u64],
    scales: [f64; 3],
    settings: &LoopSettings,
) -> (PerPhase, PerPhase, Vec<TunedRun>) {
    let cfg = SimConfig::new(SLOTS, Policy::DecayingStride);
    let (mut fixed, mut tuned, mut runs) = (PerPhase::default(), PerPhase::default(), Vec::new());
    for &seed in seeds {
        let w = phases(seed, scales);
        fixed.add(&simulate(&w, &cfg));
        let run = simulate_tuned(&w, &cfg, settings);
        tuned.add(&run.results);
        runs.push(run);
    }
    println!("{what}: short queries, mean / p99 slowdown");
    for (p, name) in ["A", "B", "C"].into_iter().enumerate() {
        println!(
            "  {name}: fixed {:.3} / {:.2}, tuned {:.3} / {:.2} ({:+.1} %)",
            fixed.mean(p),
            fixed.p99(p),
            tuned.mean(p),
            tuned.p99(p),
            (tuned.mean(p) / fixed.mean(p) - 1.0) * 100.0
        );
    }
    (fixed, tuned, runs)
}

/// Refreshes of `check` that adopted parameters, in phase `phase`.
fn adopted_in(runs: &[TunedRun], check: Check, phase: u64) -> usize {
    runs.iter()
        .flat_map(|r| &r.refreshes)
        .filter(|r| r.at_ns / PHASE_NS == phase)
        .filter(|r| r.refresh.check == check && r.refresh.reason == Reason::Adopted)
        .count()
}

#[test]
fn tuning_helps_where_the_defaults_are_wrong_and_hurts_no_phase() {
    let (fixed, tuned, runs) = compare(
        "A → B (10× longer) → C",
        &SEEDS,
        [1.0, 10.0, 1.0],
        &LoopSettings::default(),
    );
    // In B the defaults decay queries that are all long: the short ones of B lose their
    // edge (docs/design.md §9: there the grid optimum is 12–42 % better than the defaults).
    assert!(
        tuned.mean(1) <= 0.8 * fixed.mean(1),
        "B: tuned {} vs fixed {}",
        tuned.mean(1),
        fixed.mean(1)
    );
    for p in 0..3 {
        assert!(
            tuned.mean(p) <= 1.05 * fixed.mean(p),
            "phase {p}: tuned {} vs fixed {}",
            tuned.mean(p),
            fixed.mean(p)
        );
    }
    // It got there by searching in B and falling back when C came.
    assert!(adopted_in(&runs, Check::Search, 1) >= 3);
    assert!(adopted_in(&runs, Check::Fallback, 2) >= 3);
}

#[test]
fn without_the_shift_check_phase_c_pays_for_b() {
    // The control that shows the "no phase more than 5 % higher" assertion has teeth:
    // parameters tuned for B stay in force into C until the next refresh (docs/design.md §9:
    // "Shift back (C): the tuner is worse than fixed").
    let settings = LoopSettings {
        shift_queries: 0,
        ..LoopSettings::default()
    };
    // (Half the seeds suffice to show it.)
    let seeds = &SEEDS[..3];
    let (fixed, tuned, _) = compare("same, no shift check", seeds, [1.0, 10.0, 1.0], &settings);
    assert!(
        tuned.mean(2) > 1.05 * fixed.mean(2),
        "C: tuned {} vs fixed {}",
        tuned.mean(2),
        fixed.mean(2)
    );
}

#[test]
fn on_a_stationary_workload_tuning_changes_little() {
    let (fixed, tuned, runs) = compare(
        "A → A → A (stationary)",
        &SEEDS,
        [1.0, 1.0, 1.0],
        &LoopSettings::default(),
    );
    for p in 0..3 {
        let change = tuned.mean(p) / fixed.mean(p) - 1.0;
        assert!(change.abs() < 0.03, "phase {p}: {:+.1} %", change * 100.0);
    }
    // Not because it did nothing: it searched every interval.
    let searches = runs
        .iter()
        .flat_map(|r| &r.refreshes)
        .filter(|r| r.refresh.check == Check::Search && r.refresh.simulations > 50)
        .count();
    assert!(searches >= 2 * SEEDS.len(), "{searches} searches");
}
