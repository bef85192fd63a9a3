//! The simulator with the tuner in the loop: the scheduler runs a workload while, as in
//! the extension's tuner worker, a tuner periodically reads the trace of the last window,
//! searches, and installs what it adopts (wagner2021 §4, Figure 6; docs/design.md §9).
//!
//! The trace is what a real tracer could see at that moment: the queries that arrived in
//! the window, finished ones with their CPU, running ones with the CPU charged so far
//! (not their future demand), and none of the queries still waiting for admission.

use super::trace::{Accounting, Trace, TraceRecord};
use super::{Refresh, Tuner, TunerSettings};
use crate::sim::{simulate_with, QueryResult, QuerySpec, SimConfig};

/// How often the tuner runs and what it reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopSettings {
    /// Refresh period `t_r`: a search every interval, the first once a window has been
    /// traced.
    pub interval_ns: u64,
    /// Traced window `t_t`: a search replays the queries that arrived in the last window.
    pub window_ns: u64,
    /// How often the tuner wakes up to see whether a search is due and to look for a
    /// shift.
    pub check_ns: u64,
    /// The shift check reads the last this many arrivals within the window (a count,
    /// not a time: enough queries to judge a median by, quickly when queries are short
    /// and many); 0: no shift check. On a shift, the parameters in force are checked
    /// against the configured ones on these queries ([`Tuner::fall_back`]), and the next
    /// search comes one window later (when the window holds only the new workload) if
    /// it was due later than that.
    pub shift_queries: usize,
    /// The tuner's guards.
    pub tuner: TunerSettings,
}

impl Default for LoopSettings {
    /// The defaults chosen from the closed-loop simulations (sched/README.md, "Tuner"):
    /// the paper's `t_t` = 20 s and `t_r` = 60 s (wagner2021 §5.1), and a look for a
    /// shift every second in the last 40 arrivals.
    fn default() -> Self {
        LoopSettings {
            interval_ns: 60_000_000_000,
            window_ns: 20_000_000_000,
            check_ns: 1_000_000_000,
            shift_queries: 40,
            tuner: TunerSettings::default(),
        }
    }
}

/// A refresh of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Refreshed {
    /// When, ns of simulated time.
    pub at_ns: u64,
    /// What it did.
    pub refresh: Refresh,
}

/// A run with the tuner in the loop.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedRun {
    /// Every query, in workload order.
    pub results: Vec<QueryResult>,
    /// Every refresh, in time order.
    pub refreshes: Vec<Refreshed>,
}

/// Runs `workload` under `cfg` with the tuner in the loop. `cfg.decay` is the
/// configured decay: the tuner starts from it and falls back to it after a shift.
pub fn simulate_tuned(
    workload: &[QuerySpec],
    cfg: &SimConfig,
    settings: &LoopSettings,
) -> TunedRun {
    let mut tuner = Tuner::new(settings.tuner);
    let mut system = cfg.clone();
    let mut due = settings.window_ns;
    let mut refreshes = Vec::new();
    let mut on_tick = |now: u64, so_far: &[QueryResult]| {
        let refresh = if now >= due {
            due = now + settings.interval_ns;
            let window = traced(workload, so_far, now, settings.window_ns);
            tuner.refresh(&window, &system)
        } else if settings.shift_queries == 0 {
            return None;
        } else {
            let window = traced(workload, so_far, now, settings.window_ns);
            let recent = window.recent(settings.shift_queries);
            if !tuner.shifted(&recent, system.decay.quantum_ns) {
                return None;
            }
            due = due.min(now + settings.window_ns);
            tuner.fall_back(&recent, &system, cfg.decay)
        };
        let install = refresh.adopted.then_some(refresh.new);
        if let Some(decay) = install {
            system.decay = decay;
        }
        refreshes.push(Refreshed {
            at_ns: now,
            refresh,
        });
        install
    };
    let results = simulate_with(workload, cfg, settings.check_ns, &mut on_tick);
    TunedRun { results, refreshes }
}

/// The trace of the queries that arrived in the `window_ns` before `now`, as a tracer
/// sees them at `now`.
fn traced(workload: &[QuerySpec], so_far: &[QueryResult], now: u64, window_ns: u64) -> Trace {
    let start = now.saturating_sub(window_ns);
    let records: Vec<TraceRecord> = workload
        .iter()
        .zip(so_far)
        .filter(|(q, _)| (start..now).contains(&q.arrival_ns))
        .map(|(q, r)| TraceRecord {
            arrival_ns: r.arrival_ns,
            admit_ns: r.admitted_ns.unwrap_or(TraceRecord::PENDING),
            finish_ns: r.finish_ns.unwrap_or(TraceRecord::PENDING),
            cpu_ns: r.received_ns,
            query_id: 0,
            group: r.group,
            procs: q.procs,
            pinned_priority: q.pinned_priority.unwrap_or(0),
            flags: 0,
            userid: 0,
            acct: Accounting::default(),
        })
        .collect();
    Trace::from_records(&records, start, now)
}
