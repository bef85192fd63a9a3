//! The self-tuner of wagner2021 §4, free of PostgreSQL: every refresh, replay the traced
//! window in the simulator over candidate decay parameters `(λ, d_start)` and keep the
//! ones with the lowest mean slowdown (Eq. 3), with the guards of docs/design.md §9("Search").
//!
//! * [`trace`] — the per-statement [`TraceRecord`] and the window → workload conversion.
//! * [`quanta`] — per-query quanta of a trace: d_start candidates, p95 cap, median.
//! * [`search`] — the paper's directional search over any cost function.
//! * [`closed_loop`] — the simulator with the tuner in the loop.
//!
//! How the extension's tuner worker uses it: every interval it converts the last window
//! of the ring with [`Trace::from_records`], calls [`Tuner::refresh`] with the slots,
//! groups and decay in force, and installs [`Refresh::new`] with `SchedShared::set_decay`
//! when [`Refresh::adopted`]. Every second or so it also asks [`Tuner::shifted`] about the
//! most recent arrivals; on a shift it calls [`Tuner::fall_back`] with the configured
//! parameters and brings the next refresh forward to one window later.

pub mod closed_loop;
pub mod precedence;
pub mod quanta;
pub mod search;
pub mod trace;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

pub use closed_loop::{simulate_tuned, LoopSettings, Refreshed, TunedRun};
pub use precedence::DecayChoice;
pub use quanta::QuantaProfile;
pub use trace::{Accounting, Seen, Trace, TraceRecord};

use crate::decay::DecayParams;
use crate::shared::Policy;
use crate::sim::{simulate, QueryResult, SimConfig};

/// Shares of the traced morsels the d_start candidates leave undecayed (wagner2021 §4).
pub const UNDECAYED_SHARES: [f64; 7] = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35];

/// λ of the first search (wagner2021 §4: `λ0 = 0.9` for the first run).
pub const FIRST_LAMBDA: f64 = 0.9;

/// The guards around the paper's search (docs/design.md §9).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TunerSettings {
    /// Adopt other parameters only if their predicted mean slowdown is lower than the
    /// incumbent's by more than this fraction. The replay of one window is a sample:
    /// the best of a hundred candidates on it looks better than it will do.
    pub margin: f64,
    /// Skip traces with fewer finished queries: too few to judge by.
    pub min_queries: usize,
    /// Unless the replay of the parameters in force reproduces the observed mean
    /// slowdown of the finished queries within this fraction, a search adopts only
    /// parameters that decay no faster (d_start and λ no smaller). The replay starts
    /// from an empty system: it misses a backlog of queries that arrived before the
    /// window, and with one, faster decay sinks new queries down among old ones already
    /// at `p_min` — which the replay does not have. (In the closed-loop simulation such
    /// windows were 1.3–8× off, after a shift back and at load 1.0; without this guard
    /// short queries ended up 4–25 % slower than with fixed defaults there.)
    pub fidelity: f64,
    /// λ stays in these bounds (docs/design.md §9: [0.5, 1]). At 0.5 a query already falls from
    /// `p0` = 10⁴ to the paper's `p_min` = 100 within 7 quanta past d_start (to 1, within
    /// 14).
    pub lambda_bounds: (f64, f64),
    /// [`Tuner::shifted`] reports a shift when the median quanta per query changed by
    /// more than this factor against the last searched trace.
    pub shift_factor: f64,
}

impl Default for TunerSettings {
    fn default() -> Self {
        TunerSettings {
            margin: 0.03,
            min_queries: 20,
            fidelity: 0.25,
            lambda_bounds: (0.5, 1.0),
            shift_factor: 2.0,
        }
    }
}

/// The predicted cost of a parameter set on a trace: slowdowns (latency over isolated
/// latency) of the traced queries that had finished when the trace was read.
///
/// Those still running ([`Seen::Running`]) are replayed, with the CPU they had used, so
/// that the load stays whole, but not counted: their CPU so far is not their demand, and
/// a query caught after 2 ms of CPU turns a 60 ms wait in the replay into a slowdown of
/// 30, so the newest queries of a window would decide the search. (In the closed-loop
/// simulation at load 0.95–1.0, counting them left short queries 9–33 % slower than
/// fixed defaults after a shift back, against 4–10 % without; sched/README.md, "Tuner".)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Objective {
    /// Mean slowdown: Eq. 3, the tuner's objective.
    pub mean: f64,
    /// Mean slowdown of the short half: the half of the counted queries that used the
    /// least CPU (ties: earlier arrival first). Reported, not optimised.
    pub short_mean: f64,
}

/// What a refresh ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The paper's search, from the d_start candidates of the trace.
    Search,
    /// After a shift: the parameters in force against the configured ones only.
    Fallback,
}

/// Why a refresh kept or changed the parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The best beat the incumbent by more than the margin and is installed.
    Adopted,
    /// The best did not beat the incumbent by more than the margin.
    GainBelowMargin,
    /// The trace had fewer than `min_queries` finished queries; nothing was simulated.
    TooFewQueries,
    /// The best decays faster than the parameters in force, and the replay of those
    /// did not reproduce the observed slowdown within the fidelity.
    ReplayMismatch,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Adopted => "adopted",
            Reason::GainBelowMargin => "gain below margin",
            Reason::TooFewQueries => "too few queries",
            Reason::ReplayMismatch => "replay mismatch",
        })
    }
}

/// What one refresh did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refresh {
    /// Search or fallback check.
    pub check: Check,
    /// Queries in the trace.
    pub queries: usize,
    /// Of them, finished: those the objective counts.
    pub finished: usize,
    /// Median quanta per traced query.
    pub median_quanta: f64,
    /// Observed mean slowdown of the finished queries, if their latencies are known.
    pub observed: Option<f64>,
    /// Parameters in force before.
    pub old: DecayParams,
    /// The best found (the fallback, for a fallback check); `None` when skipped.
    pub best: Option<DecayParams>,
    /// Parameters in force after: `best` if adopted, else `old`.
    pub new: DecayParams,
    /// Whether `new` replaces `old` and is to be installed.
    pub adopted: bool,
    /// Why.
    pub reason: Reason,
    /// Simulations run (distinct parameter sets evaluated).
    pub simulations: u32,
    /// Predicted cost of `old` on the trace.
    pub predicted_old: Option<Objective>,
    /// Predicted cost of `best` on the trace.
    pub predicted_best: Option<Objective>,
}

impl Refresh {
    /// Predicted relative gain of `best` over `old` in mean slowdown (0.1: 10 % lower).
    pub fn gain(&self) -> Option<f64> {
        match (self.predicted_old, self.predicted_best) {
            (Some(old), Some(best)) => Some(1.0 - best.mean / old.mean),
            _ => None,
        }
    }
}

/// The tuner's state across refreshes: where the next search starts and what the last
/// trace looked like.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuner {
    settings: TunerSettings,
    /// λ0 of the next search: 0.9 at first, then the previous optimum (wagner2021 §4).
    lambda0: f64,
    /// Median quanta per query of the last searched trace.
    last_median: Option<f64>,
    /// A shift was seen and handled by [`Tuner::fall_back`] since the last search.
    shift_handled: bool,
}

impl Tuner {
    /// A tuner that has not refreshed yet.
    pub fn new(settings: TunerSettings) -> Self {
        Tuner {
            settings,
            lambda0: FIRST_LAMBDA,
            last_median: None,
            shift_handled: false,
        }
    }

    /// Its settings.
    pub fn settings(&self) -> &TunerSettings {
        &self.settings
    }

    /// Searches decay parameters for `trace`. `sim` describes the system as it is:
    /// slots, slice, groups (groups with their own λ or d_start keep them), query table
    /// size, and in `sim.decay` the parameters in force, whose quantum the candidates
    /// keep. The result says whether to install [`Refresh::new`].
    pub fn refresh(&mut self, trace: &Trace, sim: &SimConfig) -> Refresh {
        let profile = QuantaProfile::new(&trace.queries, sim.decay.quantum_ns);
        let Some(mut eval) = self.evaluator(trace, sim) else {
            return skipped(Check::Search, trace, &profile, sim.decay);
        };
        self.last_median = Some(profile.median());
        self.shift_handled = false;
        let old = sim.decay;
        // d_start beyond the p95 query would leave all but a few queries undecayed:
        // fair sharing for nearly everyone (docs/design.md §9).
        let candidates = profile.d_start_candidates(&UNDECAYED_SHARES, profile.p95() as u32);
        let best = search::search(
            &candidates,
            self.lambda0,
            self.settings.lambda_bounds,
            &mut |d, l| eval.cost(d, l).mean,
        )
        .expect("a trace of at least one query has a candidate");
        self.lambda0 = best.lambda;
        let best = DecayParams {
            lambda: best.lambda,
            d_start: best.d_start,
            ..old
        };
        let mut refresh = self.decide(Check::Search, trace, &profile, old, best, &mut eval);
        let decays_faster = best.d_start < old.d_start || best.lambda < old.lambda;
        if refresh.adopted && decays_faster && !self.faithful(&refresh) {
            refresh.adopted = false;
            refresh.new = old;
            refresh.reason = Reason::ReplayMismatch;
        }
        refresh
    }

    /// Whether the replay of the parameters in force reproduced the observed mean
    /// slowdown within the fidelity (true when latencies are unknown).
    fn faithful(&self, refresh: &Refresh) -> bool {
        let (Some(observed), Some(predicted)) = (refresh.observed, refresh.predicted_old) else {
            return true;
        };
        let tolerance = 1.0 + self.settings.fidelity;
        (1.0 / tolerance..=tolerance).contains(&(observed / predicted.mean))
    }

    /// After a shift (see [`Tuner::shifted`]): compares the parameters in force with
    /// `fallback` (the configured ones) on a recent `trace` and switches to `fallback`
    /// if it is better by the margin. Two simulations instead of a search: a few
    /// seconds of trace are too little to pick the best of a hundred candidates, but
    /// enough to see that parameters tuned for the old workload hurt the new one
    /// (docs/design.md §9: "the tuner is worse than fixed" right after a shift back). The
    /// fidelity guard does not apply: the configured parameters are the safe choice.
    pub fn fall_back(&mut self, trace: &Trace, sim: &SimConfig, fallback: DecayParams) -> Refresh {
        let profile = QuantaProfile::new(&trace.queries, sim.decay.quantum_ns);
        let Some(mut eval) = self.evaluator(trace, sim) else {
            return skipped(Check::Fallback, trace, &profile, sim.decay);
        };
        let fallback = DecayParams {
            quantum_ns: sim.decay.quantum_ns,
            ..fallback
        };
        let refresh = self.decide(
            Check::Fallback,
            trace,
            &profile,
            sim.decay,
            fallback,
            &mut eval,
        );
        // Settled once the configured parameters are in force; otherwise the next
        // check, with more of the new workload among the recent queries, asks again.
        self.shift_handled = refresh.adopted || refresh.new == fallback;
        if refresh.adopted {
            // The workload the last optimum was found for is gone.
            self.lambda0 = fallback.lambda;
        }
        refresh
    }

    /// True when the median quanta per query of `recent` (the latest arrivals) differs
    /// from that of the last searched trace by more than the shift factor (docs/design.md §9:
    /// "refresh early when the per-query-quanta distribution shifts by more than 2×").
    /// False before the first search, for traces too small to judge, and after a
    /// [`Tuner::fall_back`] until the next search: that shift is being dealt with.
    pub fn shifted(&self, recent: &Trace, quantum_ns: u64) -> bool {
        let Some(last) = self.last_median.filter(|_| !self.shift_handled) else {
            return false;
        };
        if recent.len() < self.settings.min_queries.max(1) {
            return false;
        }
        let now = QuantaProfile::new(&recent.queries, quantum_ns).median();
        // Traced queries used CPU, so medians are at least one morsel.
        let (lo, hi) = if now < last { (now, last) } else { (last, now) };
        hi > self.settings.shift_factor * lo.max(1.0)
    }

    /// An evaluator for the trace, or `None` if it has too few finished queries.
    fn evaluator<'a>(&self, trace: &'a Trace, sim: &SimConfig) -> Option<Evaluator<'a>> {
        let eval = Evaluator::new(trace, sim);
        (eval.counted >= self.settings.min_queries.max(1)).then_some(eval)
    }

    /// Evaluates the incumbent and `best`, and adopts `best` if it wins by the margin.
    fn decide(
        &mut self,
        check: Check,
        trace: &Trace,
        profile: &QuantaProfile,
        old: DecayParams,
        best: DecayParams,
        eval: &mut Evaluator<'_>,
    ) -> Refresh {
        let predicted_old = eval.cost(old.d_start, old.lambda);
        let predicted_best = eval.cost(best.d_start, best.lambda);
        let adopted = predicted_best.mean < predicted_old.mean * (1.0 - self.settings.margin);
        Refresh {
            check,
            queries: trace.len(),
            finished: eval.counted,
            median_quanta: profile.median(),
            observed: eval.observed,
            old,
            best: Some(best),
            new: if adopted { best } else { old },
            adopted,
            reason: if adopted {
                Reason::Adopted
            } else {
                Reason::GainBelowMargin
            },
            simulations: eval.simulations(),
            predicted_old: Some(predicted_old),
            predicted_best: Some(predicted_best),
        }
    }
}

/// The result of a refresh that judged nothing.
fn skipped(check: Check, trace: &Trace, profile: &QuantaProfile, old: DecayParams) -> Refresh {
    Refresh {
        check,
        queries: trace.len(),
        finished: trace.seen.iter().filter(|s| **s != Seen::Running).count(),
        median_quanta: profile.median(),
        observed: None,
        old,
        best: None,
        new: old,
        adopted: false,
        reason: Reason::TooFewQueries,
        simulations: 0,
        predicted_old: None,
        predicted_best: None,
    }
}

/// Simulates a trace under candidate parameters, once per distinct candidate.
struct Evaluator<'a> {
    trace: &'a Trace,
    cfg: SimConfig,
    /// Per query: counted in the objective (finished), and of them, in the short half.
    counted_short: Vec<(bool, bool)>,
    counted: usize,
    /// Observed mean slowdown of the counted queries (after the first simulation, which
    /// gives the isolated latencies), if all their latencies are known.
    observed: Option<f64>,
    seen: HashMap<(u32, u64), Objective>,
}

impl<'a> Evaluator<'a> {
    fn new(trace: &'a Trace, sim: &SimConfig) -> Self {
        let q = &trace.queries;
        let mut by_cpu: Vec<usize> = (0..q.len())
            .filter(|&i| trace.seen[i] != Seen::Running)
            .collect();
        by_cpu.sort_by_key(|&i| (q[i].cpu_ns, q[i].arrival_ns, i));
        let mut counted_short = vec![(false, false); q.len()];
        for (rank, &i) in by_cpu.iter().enumerate() {
            counted_short[i] = (true, rank < by_cpu.len() / 2);
        }
        Evaluator {
            trace,
            cfg: SimConfig {
                policy: Policy::DecayingStride,
                horizon_ns: None,
                ..sim.clone()
            },
            counted_short,
            counted: by_cpu.len(),
            observed: None,
            seen: HashMap::new(),
        }
    }

    fn cost(&mut self, d_start: u32, lambda: f64) -> Objective {
        let key = (d_start, lambda.to_bits());
        if let Some(&o) = self.seen.get(&key) {
            return o;
        }
        self.cfg.decay.d_start = d_start;
        self.cfg.decay.lambda = lambda;
        let results = simulate(&self.trace.queries, &self.cfg);
        if self.seen.is_empty() {
            self.observed = self.observed_mean(&results);
        }
        let (mut all, mut short, mut n_short) = (0.0, 0.0, 0usize);
        for (r, &(counted, is_short)) in results.iter().zip(&self.counted_short) {
            if !counted {
                continue;
            }
            let s = r.slowdown().expect("no horizon: every query finishes");
            all += s;
            if is_short {
                short += s;
                n_short += 1;
            }
        }
        let o = Objective {
            mean: mean(all, self.counted),
            short_mean: mean(short, n_short),
        };
        self.seen.insert(key, o);
        o
    }

    /// Observed mean slowdown of the counted queries, over the isolated latencies of a
    /// replay (the same for every candidate); `None` if a latency is unknown.
    fn observed_mean(&self, results: &[QueryResult]) -> Option<f64> {
        let mut sum = 0.0;
        for (r, seen) in results.iter().zip(&self.trace.seen) {
            if let Seen::Finished { latency_ns } = seen {
                sum += (*latency_ns)? as f64 / r.isolated_ns.max(1) as f64;
            }
        }
        Some(mean(sum, self.counted))
    }

    fn simulations(&self) -> u32 {
        self.seen.len() as u32
    }
}

/// `sum / n`, NaN for no values.
fn mean(sum: f64, n: usize) -> f64 {
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}
