//! The tuner's guards and state, on small traces.

use super::*;
use crate::sim::{generate, QuerySpec, Shape};

const QUANTUM: u64 = 2_000_000;

fn sim() -> SimConfig {
    SimConfig::new(2, Policy::DecayingStride)
}

fn params(lambda: f64, d_start: u32) -> DecayParams {
    DecayParams {
        lambda,
        d_start,
        ..DecayParams::default()
    }
}

/// `secs` of the paper's shape at load 0.9 on 2 slots, CPU scaled by `scale`.
fn workload(secs: f64, scale: f64, seed: u64) -> Vec<QuerySpec> {
    let shape = Shape {
        queries: 10_000,
        load: 0.9,
        slots: 2,
        seed,
        short_ms: (5.0 * scale, 40.0 * scale),
        long_ms: (50.0 * scale, 400.0 * scale),
        ..Shape::default()
    };
    generate(&shape)
        .into_iter()
        .filter(|q| (q.arrival_ns as f64) < secs * 1e9)
        .collect()
}

/// The trace a tracer would record after `workload` ran to the end under `decay`.
fn traced(workload: &[QuerySpec], decay: DecayParams) -> Trace {
    let results = simulate(workload, &SimConfig { decay, ..sim() });
    let records: Vec<TraceRecord> = results
        .iter()
        .zip(workload)
        .map(|(r, q)| TraceRecord {
            arrival_ns: r.arrival_ns,
            admit_ns: r.admitted_ns.unwrap(),
            finish_ns: r.finish_ns.unwrap(),
            cpu_ns: r.received_ns,
            query_id: 0,
            group: r.group,
            procs: q.procs,
            pinned_priority: 0,
            flags: 0,
            userid: 0,
            acct: Accounting::default(),
        })
        .collect();
    Trace::from_records(&records, 0, u64::MAX)
}

/// A tuner that has searched on a trace of the paper's shape.
fn after_a_search() -> Tuner {
    let mut t = Tuner::new(TunerSettings::default());
    t.refresh(
        &traced(&workload(5.0, 1.0, 1), DecayParams::default()),
        &sim(),
    );
    t
}

#[test]
fn a_trace_with_too_few_finished_queries_is_skipped() {
    let mut t = Tuner::new(TunerSettings::default());
    let w = workload(5.0, 1.0, 1);
    let small = Trace::from_workload(w[..19].to_vec());
    let r = t.refresh(&small, &sim());
    assert_eq!(
        (r.reason, r.adopted, r.simulations),
        (Reason::TooFewQueries, false, 0)
    );
    assert_eq!(
        (r.queries, r.finished, r.best, r.new),
        (19, 19, None, r.old)
    );
    // 40 queries, but only 19 finished: the running ones are load, not evidence.
    let mut mixed = Trace::from_workload(w[..40].to_vec());
    mixed.seen[19..].fill(Seen::Running);
    let r = t.refresh(&mixed, &sim());
    assert_eq!(
        (r.reason, r.queries, r.finished),
        (Reason::TooFewQueries, 40, 19)
    );
    // Nothing was learnt: no shift baseline yet.
    assert!(!t.shifted(&Trace::from_workload(w), QUANTUM));
}

#[test]
fn the_search_starts_from_the_quantile_candidates_within_the_bounds() {
    let trace = traced(&workload(12.0, 10.0, 2), DecayParams::default());
    let profile = QuantaProfile::new(&trace.queries, QUANTUM);
    let candidates = profile.d_start_candidates(&UNDECAYED_SHARES, profile.p95() as u32);
    assert!(candidates.len() >= 4, "{candidates:?}");
    let r = Tuner::new(TunerSettings::default()).refresh(&trace, &sim());
    let best = r.best.unwrap();
    assert!(
        candidates.contains(&best.d_start),
        "{best:?} {candidates:?}"
    );
    assert!(best.d_start as u64 <= profile.p95());
    assert!((0.5..=1.0).contains(&best.lambda), "{best:?}");
    assert_eq!(best.quantum_ns, QUANTUM);
    // Per candidate the start and two neighbours per step at most, plus the incumbent.
    let most = candidates.len() as u32 * (1 + 2 * search::STEPS) + 1;
    assert!(
        (candidates.len() as u32..=most).contains(&r.simulations),
        "{}",
        r.simulations
    );
    // Queries 10× longer than the defaults assume: it adopts a later start of decay.
    assert!(best.d_start > DecayParams::default().d_start, "{best:?}");
    assert_eq!(r.reason, Reason::Adopted, "{r:?}");
}

#[test]
fn the_incumbent_stays_unless_the_gain_beats_the_margin() {
    let trace = traced(&workload(12.0, 10.0, 2), DecayParams::default());
    let with_margin = |margin| {
        let settings = TunerSettings {
            margin,
            ..TunerSettings::default()
        };
        Tuner::new(settings).refresh(&trace, &sim())
    };
    let gain = with_margin(0.0).gain().unwrap();
    let kept = with_margin(gain + 0.01);
    assert_eq!(
        (kept.reason, kept.adopted),
        (Reason::GainBelowMargin, false)
    );
    assert_eq!(kept.new, kept.old);
    let taken = with_margin(gain - 0.01);
    assert_eq!((taken.reason, taken.adopted), (Reason::Adopted, true));
    assert_eq!(Some(taken.new), taken.best);
    // With the best in force already, there is nothing to gain.
    let best = taken.best.unwrap();
    let again = Tuner::new(TunerSettings::default()).refresh(
        &trace,
        &SimConfig {
            decay: best,
            ..sim()
        },
    );
    assert_eq!((again.reason, again.new), (Reason::GainBelowMargin, best));
    assert!(again.gain().unwrap() <= 0.0);
}

#[test]
fn a_shift_of_the_median_quanta_is_detected_and_handled_once() {
    let a = Trace::from_workload(workload(5.0, 1.0, 3)).recent(40);
    let b = Trace::from_workload(workload(30.0, 10.0, 3)).recent(40);
    assert!(!Tuner::new(TunerSettings::default()).shifted(&b, QUANTUM));
    let mut t = after_a_search();
    assert!(!t.shifted(&a, QUANTUM));
    assert!(t.shifted(&b, QUANTUM));
    assert!(!t.shifted(&b.recent(19), QUANTUM), "too few to judge");
    // Parameters tuned for A are not the configured ones: the fallback check settles it.
    let tuned_for_a = params(0.85, 3);
    let sim_a = SimConfig {
        decay: tuned_for_a,
        ..sim()
    };
    t.fall_back(&b, &sim_a, DecayParams::default());
    assert!(!t.shifted(&b, QUANTUM));
    // The next search on B makes B the baseline; A is then the shift.
    t.refresh(&traced(&workload(10.0, 10.0, 4), tuned_for_a), &sim_a);
    assert!(!t.shifted(&b, QUANTUM));
    assert!(t.shifted(&a, QUANTUM));
}

#[test]
fn the_fallback_replaces_parameters_tuned_for_another_workload() {
    // Parameters for 10× longer queries, on a trace of the paper's shape.
    let for_b = params(0.98, 60);
    let trace = traced(&workload(5.0, 1.0, 5), for_b).recent(80);
    let mut t = after_a_search();
    let on_b = SimConfig {
        decay: for_b,
        ..sim()
    };
    let r = t.fall_back(&trace, &on_b, DecayParams::default());
    assert_eq!(
        (r.check, r.reason, r.simulations),
        (Check::Fallback, Reason::Adopted, 2)
    );
    assert_eq!(r.new, DecayParams::default());
    assert!(r.gain().unwrap() > 0.03, "{r:?}");
    // With the configured parameters in force there is one point to evaluate.
    let r = after_a_search().fall_back(&trace, &sim(), DecayParams::default());
    assert_eq!((r.reason, r.simulations), (Reason::GainBelowMargin, 1));
}

#[test]
fn a_replay_that_misses_the_observed_slowdown_adopts_no_faster_decay() {
    // Parameters for 10× longer queries in force on the paper's shape: the search wants
    // a faster decay.
    let for_b = params(0.98, 60);
    let on_b = SimConfig {
        decay: for_b,
        ..sim()
    };
    let trace = traced(&workload(5.0, 1.0, 6), for_b);
    let faithful = Tuner::new(TunerSettings::default()).refresh(&trace, &on_b);
    assert_eq!(faithful.reason, Reason::Adopted);
    let ratio = faithful.observed.unwrap() / faithful.predicted_old.unwrap().mean;
    assert!(
        (ratio - 1.0).abs() < 1e-9,
        "the trace was recorded under for_b: {ratio}"
    );
    let best = faithful.best.unwrap();
    assert!(best.d_start < for_b.d_start || best.lambda < for_b.lambda);
    // The same queries observed twice as slow: a backlog the replay does not have.
    let mut slower = trace.clone();
    for s in &mut slower.seen {
        if let Seen::Finished {
            latency_ns: Some(l),
        } = s
        {
            *l *= 2;
        }
    }
    let r = Tuner::new(TunerSettings::default()).refresh(&slower, &on_b);
    assert_eq!(
        (r.reason, r.adopted, r.new),
        (Reason::ReplayMismatch, false, for_b)
    );
    assert_eq!(r.best, Some(best));
}

#[test]
fn only_finished_queries_count_in_the_objective() {
    let w = workload(5.0, 1.0, 7);
    let all = Trace::from_workload(w.clone());
    let mut half = all.clone();
    for (i, s) in half.seen.iter_mut().enumerate() {
        if i % 2 == 1 {
            *s = Seen::Running;
        }
    }
    let t = |trace: &Trace| Tuner::new(TunerSettings::default()).refresh(trace, &sim());
    let (r_all, r_half) = (t(&all), t(&half));
    assert_eq!(
        (r_all.finished, r_half.finished),
        (w.len(), w.len().div_ceil(2))
    );
    assert_eq!(r_half.queries, w.len());
    // Same replay, other queries counted.
    assert_ne!(r_all.predicted_old, r_half.predicted_old);
    let o = r_half.predicted_old.unwrap();
    assert!(o.short_mean <= o.mean, "{o:?}");
}
