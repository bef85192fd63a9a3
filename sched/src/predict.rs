//! Predicting a statement's CPU from the history of its fingerprint, and the priority a
//! prediction starts it at.
//!
//! Decaying priorities (wagner2021 §3.2) find a long statement only after it has used
//! `d_start` quanta; until then a long one competes as if it were short. Most statements
//! of an application repeat: the same fingerprint (PostgreSQL's query identifier, the
//! `queryid` of `pg_stat_statements`) runs again with other parameters and needs about
//! the CPU it needed before. Redshift's short query acceleration routes statements by a
//! predicted run time in the same way; patra2022 shows that size-based policies keep
//! most of their gain with estimated sizes, as long as a misestimated job cannot starve.
//!
//! * [`History`] — one fingerprint's executions: a decayed mean and spread of the CPU
//!   per execution, their count and when it was last seen.
//! * [`CostModel`] — the prior for a fingerprint never seen: the planner's total cost
//!   times a CPU-per-cost ratio, calibrated online from every execution recorded
//!   (geometric mean, since the ratio spans orders of magnitude between plans).
//! * [`Table`] and [`View`] — a bounded, set-associative table of histories, meant for
//!   shared memory under one lock: [`WAYS`] slots per set, the least recently seen one
//!   evicted; recorded into through a `Table`, read through a `View`.
//! * [`Quality`] — how good the predictions were: short statements predicted short,
//!   long ones predicted long, and the distribution of log2(actual / predicted).
//! * [`start_policy`] — what a prediction does to a statement's priority.
//!
//! Only executions that reached CPU scheduling are recorded (the extension joins a
//! statement to scheduling at its first check-in), and those its history let skip the
//! slots for their first slice ([`History::runs_unscheduled`]): a history is that of
//! the statements the scheduler had to place, or chose not to.

use crate::decay::{DecayParams, PriorityRange};

/// Slots per set of a [`Table`]: a lookup reads at most this many keys.
pub const WAYS: usize = 8;

/// Fingerprints the extension's table holds (pg_stat_statements keeps 5000 by default;
/// this table keeps only statements that reached CPU scheduling): 112 kB of shared memory.
pub const CAPACITY: usize = 2048;

/// Executions averaged exactly before a history becomes an exponentially weighted mean
/// with this window: recent executions count most once a fingerprint has run often, so
/// a table that grew or an index that was added shows within tens of executions.
pub const WINDOW: u64 = 32;

/// An execution counts in its fingerprint's mean and variance for at most this many
/// times the mean (its own value still sets `max_us`): one run a thousand times the
/// usual (a lock wait, a cold cache, a parameter that selects everything) would
/// otherwise hold the mean up for about a hundred executions, each starting at the
/// priority of a statement it is not. A lasting change still shows: with the window
/// full an execution raises the mean by up to 15/32 of itself, sixteenfold in seven.
pub const OUTLIER: f64 = 16.0;

/// The cap of [`OUTLIER`] counts from the mean or from this (µs), whichever is higher: a
/// mean of a few microseconds says little about what the next execution may use.
const OUTLIER_FLOOR_US: f64 = 1000.0;

/// One fingerprint's history. Plain data, so that a [`Table`] can live in shared
/// memory; `key == 0` marks an empty slot (PostgreSQL never assigns query identifier 0
/// to a statement it computed one for).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct History {
    /// The fingerprint (query identifier); 0 when the slot is empty.
    pub key: u64,
    /// Whose statements they are: for the extension, its database and the role that
    /// runs them (0 for callers with one scope, the simulator's). One query identifier
    /// in two databases is two statements: their tables may be of any size, and
    /// databases made from one schema script give their tables the same OIDs, which
    /// PostgreSQL's identifiers hash (from 18, relation names). One in two roles' hands
    /// is two histories too, as pg_stat_statements keeps them: one role's executions
    /// (its constants, its data) never change how another's are predicted.
    pub scope: u64,
    /// Executions recorded.
    pub executions: u64,
    /// When it was last recorded, in the caller's clock (the extension's is the wall
    /// clock, which the view shows: after a step back, the entries recorded meanwhile
    /// look older and are evicted a little early).
    pub last_seen: u64,
    /// Decayed mean CPU per execution, µs.
    pub mean_us: f64,
    /// Decayed variance of the CPU per execution, µs².
    pub var_us2: f64,
    /// Largest CPU of one execution, µs (bounds the p95 estimate).
    pub max_us: f64,
    /// CPU of the latest execution, µs, uncapped ([`History::runs_unscheduled`]).
    pub last_us: f64,
}

impl History {
    /// Adds one execution of `cpu_us` µs at time `now`.
    ///
    /// Incremental weighted mean and variance (West 1979): with weight `w` for the new
    /// value, `mean += w·δ` and `var = (1 − w)·(var + w·δ²)`, where `δ` is the new value
    /// minus the old mean. `w = 1/n` for the first [`WINDOW`] executions (the exact mean
    /// and population variance), `1/WINDOW` after. From the second execution on, the
    /// value counts for at most [`OUTLIER`] times the mean.
    pub fn add(&mut self, cpu_us: f64, now: u64) {
        let cpu_us = if cpu_us.is_finite() {
            cpu_us.max(0.0)
        } else {
            0.0
        };
        let counted = if self.executions > 0 {
            cpu_us.min(OUTLIER * self.mean_us.max(OUTLIER_FLOOR_US))
        } else {
            cpu_us
        };
        self.executions += 1;
        let w = 1.0 / self.executions.min(WINDOW) as f64;
        let delta = counted - self.mean_us;
        self.mean_us += w * delta;
        self.var_us2 = (1.0 - w) * (self.var_us2 + w * delta * delta);
        self.max_us = self.max_us.max(cpu_us);
        self.last_us = cpu_us;
        self.last_seen = now;
    }

    /// Standard deviation of the CPU per execution, µs.
    pub fn sd_us(&self) -> f64 {
        self.var_us2.max(0.0).sqrt()
    }

    /// Estimated 95th percentile of the CPU per execution, µs: mean + 1.645 standard
    /// deviations (the normal quantile), never above the largest execution seen.
    pub fn p95_us(&self) -> f64 {
        (self.mean_us + 1.645 * self.sd_us()).min(self.max_us)
    }

    /// Whether the fingerprint's next execution may skip the CPU slots for its first
    /// slice (the extension joins it to scheduling only past that), where a slice is
    /// `slice_us`: it ran at least [`UNSCHEDULED_AFTER`] times, its executions
    /// all but the rarest ([`History::p95_us`]) and its latest used at most
    /// [`UNSCHEDULED_SLICE_SHARE`] of a slice.
    ///
    /// Such a statement ends within its first quantum once it holds a slot, so
    /// scheduling it changes nothing but its wait for that slot, which a long statement
    /// holds up to a slice between two yield points: the wait of a 0.3-ms statement
    /// beside long ones is mostly that
    /// (bench/results/short-beside-long/synthetic_s03_20261205.md). Unscheduled, it
    /// takes at most that share of a slice from the holders, through the kernel's
    /// scheduler, as a plan too small to schedule does. The latest execution counts on
    /// its own so that one that grew (its table did, or its parameters select more) is
    /// scheduled from its start from the next execution on, before its mean has caught
    /// up; the caller records these executions too, so that the history keeps
    /// following them.
    pub fn runs_unscheduled(&self, slice_us: f64) -> bool {
        let bound = UNSCHEDULED_SLICE_SHARE * slice_us;
        self.executions >= UNSCHEDULED_AFTER && self.p95_us() <= bound && self.last_us <= bound
    }
}

/// Executions a fingerprint's history needs before [`History::runs_unscheduled`] trusts
/// it: one or two say little about the spread.
pub const UNSCHEDULED_AFTER: u64 = 3;

/// The share of a slice below which a fingerprint's executions run without CPU
/// scheduling ([`History::runs_unscheduled`]): half, so that the latest execution may
/// double before one runs past the slice that scheduling would have given it at once.
pub const UNSCHEDULED_SLICE_SHARE: f64 = 0.5;

/// The prior for a fingerprint without history: CPU ≈ planner cost × ratio, with the
/// ratio's logarithm averaged over the executions recorded ([`WINDOW`]-weighted like a
/// [`History`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostModel {
    /// Executions the ratio was calibrated from.
    pub samples: u64,
    /// Decayed mean of ln(CPU µs / planner cost).
    pub mean_ln_ratio: f64,
}

/// Plans cheaper than this many cost units are not used to calibrate or predict: the
/// ratio of a near-zero cost says nothing about the CPU.
const MIN_COST: f64 = 1.0;

/// PostgreSQL before 18 adds this to a plan's cost for each node of a kind the planner
/// was told not to use (`enable_nestloop = off` and the like; costsize.c's
/// `disable_cost`): such a cost says nothing about the CPU, and one calibration from it
/// would move the shared ratio by orders of magnitude.
const DISABLED_COST: f64 = 1.0e10;

/// Whether a plan's `cost` says something about its CPU.
fn informative(cost: f64) -> bool {
    cost.is_finite() && (MIN_COST..DISABLED_COST).contains(&cost)
}

impl CostModel {
    /// Calibrates from one execution of a plan of `cost` that used `cpu_us`. Once the
    /// window is full, one execution's ratio counts for at most [`OUTLIER`] times the
    /// mean's either way: the model is shared by every role, and no session's plans
    /// (made with costs of its own choosing) move it by more than a little each.
    pub fn calibrate(&mut self, cost: f64, cpu_us: f64) {
        if !(informative(cost) && cpu_us.is_finite() && cpu_us > 0.0) {
            return;
        }
        let ln_ratio = (cpu_us / cost).ln();
        let counted = if self.samples >= WINDOW {
            let bound = OUTLIER.ln();
            ln_ratio.clamp(self.mean_ln_ratio - bound, self.mean_ln_ratio + bound)
        } else {
            ln_ratio
        };
        self.samples += 1;
        let w = 1.0 / self.samples.min(WINDOW) as f64;
        self.mean_ln_ratio += w * (counted - self.mean_ln_ratio);
    }

    /// The CPU a plan of `cost` is expected to use, µs; `None` before any calibration or
    /// for a cost that says nothing.
    pub fn predict_us(&self, cost: f64) -> Option<f64> {
        (self.samples > 0 && informative(cost)).then(|| cost * self.mean_ln_ratio.exp())
    }
}

/// Where a prediction came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The fingerprint's own history.
    History,
    /// The planner's cost through the calibrated [`CostModel`].
    Cost,
}

/// A statement's predicted CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Predicted CPU of the whole execution, µs.
    pub cpu_us: f64,
    /// What it is based on.
    pub source: Source,
}

/// A statement's class under a threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Predicted to need at most the threshold.
    Short,
    /// Predicted to need more.
    Long,
}

impl Class {
    /// The class of `cpu_us` under `short_us`.
    pub fn of(cpu_us: f64, short_us: f64) -> Class {
        if cpu_us <= short_us {
            Class::Short
        } else {
            Class::Long
        }
    }
}

/// Buckets of [`Quality::log2_error`]: bucket `i` counts predictions whose
/// log2(actual / predicted) rounds to `i − ERROR_SPAN`; the outer buckets take
/// everything beyond.
pub const ERROR_BUCKETS: usize = 2 * ERROR_SPAN + 1;
/// Largest |log2 error| with a bucket of its own (2^8 = 256× off).
pub const ERROR_SPAN: usize = 8;

/// How good the predictions were, counted when the executions they were for ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Quality {
    /// Short statements predicted short.
    pub short_as_short: u64,
    /// Short statements predicted long.
    pub short_as_long: u64,
    /// Long statements predicted short.
    pub long_as_short: u64,
    /// Long statements predicted long.
    pub long_as_long: u64,
    /// Statements without a prediction (no history and no calibrated cost model).
    pub unpredicted: u64,
    /// Predictions from a fingerprint's history (the rest came from the cost model).
    pub from_history: u64,
    /// Distribution of log2(actual / predicted), see [`ERROR_BUCKETS`].
    pub log2_error: [u64; ERROR_BUCKETS],
}

impl Quality {
    /// Counts one execution that used `actual_us` after `prediction`, under the
    /// threshold `short_us`.
    pub fn count(&mut self, prediction: Option<Prediction>, actual_us: f64, short_us: f64) {
        let Some(p) = prediction else {
            self.unpredicted += 1;
            return;
        };
        if p.source == Source::History {
            self.from_history += 1;
        }
        match (
            Class::of(actual_us, short_us),
            Class::of(p.cpu_us, short_us),
        ) {
            (Class::Short, Class::Short) => self.short_as_short += 1,
            (Class::Short, Class::Long) => self.short_as_long += 1,
            (Class::Long, Class::Short) => self.long_as_short += 1,
            (Class::Long, Class::Long) => self.long_as_long += 1,
        }
        // 1 µs floors keep a zero on either side finite
        let err = (actual_us.max(1.0) / p.cpu_us.max(1.0)).log2().round();
        let bucket = (err + ERROR_SPAN as f64).clamp(0.0, (ERROR_BUCKETS - 1) as f64);
        self.log2_error[bucket as usize] += 1;
    }

    /// Short statements predicted short, as a share of the short statements predicted.
    pub fn short_recall(&self) -> Option<f64> {
        let short = self.short_as_short + self.short_as_long;
        (short > 0).then(|| self.short_as_short as f64 / short as f64)
    }

    /// Long statements predicted long, as a share of the long statements predicted.
    pub fn long_recall(&self) -> Option<f64> {
        let long = self.long_as_short + self.long_as_long;
        (long > 0).then(|| self.long_as_long as f64 / long as f64)
    }
}

/// A reading of the bounded table of histories with its cost model and quality counts.
/// It borrows its parts so that they can live in shared memory, read under a shared lock.
#[derive(Clone, Copy)]
pub struct View<'a> {
    slots: &'a [History],
    model: &'a CostModel,
    quality: &'a Quality,
}

/// The table to record into: [`View`]'s parts, borrowed mutably (an exclusive lock).
pub struct Table<'a> {
    slots: &'a mut [History],
    model: &'a mut CostModel,
    quality: &'a mut Quality,
}

/// The slots of the set of `key` in a table of `len` slots: whole sets of [`WAYS`].
fn set_of(key: u64, scope: u64, len: usize) -> std::ops::Range<usize> {
    let sets = (len / WAYS).max(1);
    // Query identifiers are already hashes, but spread the bits anyway (a fingerprint
    // scheme of a later major could be less uniform): Fibonacci hashing, of the
    // identifier and its scope, so that one statement of many databases spreads too.
    let mixed = (key ^ scope.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let start = ((mixed >> 32) as usize % sets) * WAYS;
    start..(start + WAYS).min(len)
}

/// The CPU up to which a statement counts as short under decay `params`, µs: what the
/// decay lets it use at its initial priority (`d_start` quanta, at least one). The
/// classification and the decay therefore move together, and tuning `d_start`
/// (wagner2021 §4) tunes the threshold.
pub fn short_threshold_us(params: DecayParams) -> f64 {
    params.d_start.max(1) as f64 * params.quantum_ns as f64 / 1000.0
}

/// What [`start_policy`] decided for a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartPolicy {
    /// Priority it starts at.
    pub p0: u32,
    /// Quanta it receives before its priority starts to decay.
    pub d_start: u32,
}

/// The start of a statement predicted to use `predicted_us` of CPU, in a group of
/// priority `range` under decay `params`, where statements up to `short_us` count as
/// short.
///
/// * No prediction: the decay as configured.
/// * Predicted short: the group's initial priority, held until the statement has used
///   twice its prediction (a mean underestimates about half the executions), and never
///   for fewer quanta than the configured `d_start`.
/// * Predicted long: an initial priority scaled down by `short_us / predicted_us`
///   (a statement predicted ten times the threshold starts at a tenth), never below the
///   group's lowest, held, like a short one's, until it has used twice its prediction.
///   Held, the priorities rank the statements by predicted size, shortest first, as
///   size-based policies do (patra2022 §2.2.3): a statement of 240 ms among ones of
///   seconds keeps most of its share instead of sinking to the floor with them within
///   a few quanta, as it did when predicted long meant decay from the first quantum
///   (bench/results/prediction).
///
/// A statement wrongly predicted short decays once it has used twice its prediction, so
/// that misprediction lasts no longer than decay allows. One wrongly predicted long
/// keeps its lower start, never below `p_min`, for its whole run when it is in fact
/// short: the price of ranking by an estimate (patra2022 §2.2.3), which the history's
/// cap on outliers ([`OUTLIER`]) and the cost model's on plans it cannot read keep
/// rare.
pub fn start_policy(
    predicted_us: Option<f64>,
    range: PriorityRange,
    params: DecayParams,
    short_us: f64,
) -> StartPolicy {
    let configured = StartPolicy {
        p0: range.p0,
        d_start: params.d_start,
    };
    let Some(predicted_us) = predicted_us.filter(|p| p.is_finite() && *p >= 0.0) else {
        return configured;
    };
    let quantum_us = (params.quantum_ns as f64 / 1000.0).max(1.0);
    let hold = (2.0 * predicted_us / quantum_us)
        .ceil()
        .min(u32::MAX as f64) as u32;
    match Class::of(predicted_us, short_us) {
        Class::Short => StartPolicy {
            p0: range.p0,
            d_start: params.d_start.max(hold),
        },
        Class::Long => {
            let scaled = range.p0 as f64 * (short_us.max(0.0) / predicted_us);
            StartPolicy {
                p0: (scaled as u32).clamp(range.p_min, range.p0),
                d_start: hold,
            }
        }
    }
}

impl<'a> View<'a> {
    /// A reading of `slots` (any length; sets of [`WAYS`]), with the cost model and the
    /// quality counts.
    pub fn new(slots: &'a [History], model: &'a CostModel, quality: &'a Quality) -> Self {
        View {
            slots,
            model,
            quality,
        }
    }

    /// The history of `key` in scope 0, if the table holds it.
    pub fn history(&self, key: u64) -> Option<&'a History> {
        self.history_in(key, 0)
    }

    /// The history of `key` in `scope`, if the table holds it.
    pub fn history_in(&self, key: u64, scope: u64) -> Option<&'a History> {
        if key == 0 {
            return None;
        }
        self.slots[set_of(key, scope, self.slots.len())]
            .iter()
            .find(|h| h.key == key && h.scope == scope)
    }

    /// [`Self::predict_in`] scope 0.
    pub fn predict(&self, key: u64, cost: f64) -> Option<Prediction> {
        self.predict_in(key, 0, cost)
    }

    /// The predicted CPU of a statement with fingerprint `key` (0: none) in `scope` and
    /// planner cost `cost`: its history's mean if it has one, else the calibrated cost
    /// model's (one for every scope: it learns how this machine turns cost into CPU).
    pub fn predict_in(&self, key: u64, scope: u64, cost: f64) -> Option<Prediction> {
        if let Some(h) = self.history_in(key, scope) {
            return Some(Prediction {
                cpu_us: h.mean_us,
                source: Source::History,
            });
        }
        self.model.predict_us(cost).map(|cpu_us| Prediction {
            cpu_us,
            source: Source::Cost,
        })
    }

    /// Every history held, in slot order.
    pub fn histories(&self) -> impl Iterator<Item = &'a History> {
        self.slots.iter().filter(|h| h.key != 0)
    }

    /// The cost model.
    pub fn model(&self) -> &'a CostModel {
        self.model
    }

    /// The quality counts.
    pub fn quality(&self) -> &'a Quality {
        self.quality
    }
}

impl<'a> Table<'a> {
    /// The table over `slots`, the cost model and the quality counts.
    pub fn new(
        slots: &'a mut [History],
        model: &'a mut CostModel,
        quality: &'a mut Quality,
    ) -> Self {
        Table {
            slots,
            model,
            quality,
        }
    }

    /// Slots a table of `capacity` fingerprints uses: whole sets of [`WAYS`].
    pub fn slots_for(capacity: usize) -> usize {
        capacity.div_ceil(WAYS).max(1) * WAYS
    }

    /// A reading of the table as it is.
    pub fn view(&self) -> View<'_> {
        View::new(self.slots, self.model, self.quality)
    }

    /// Records an execution of fingerprint `key` (0: none, then only the cost model
    /// learns) with planner cost `cost` that used `cpu_us` µs and ended at `now`, after
    /// it was predicted as `prediction`; `short_us` is the threshold its prediction is
    /// judged by. A fingerprint not in the table takes an empty slot of its set, else
    /// the least recently seen one-off's (a fingerprint recorded once), else the least
    /// recently seen one's: a stream of statements that never repeat (ad hoc reports, a
    /// tool that writes each query anew) cycles through the set's one-offs and leaves
    /// the fingerprints that repeat, which are the ones a history predicts, in place;
    /// the first newcomer into a set that holds no one-off still evicts, so a set never
    /// closes to new fingerprints (the probation of 2Q, Johnson and Shasha 1994).
    pub fn record(
        &mut self,
        key: u64,
        cost: f64,
        cpu_us: f64,
        now: u64,
        prediction: Option<Prediction>,
        short_us: f64,
    ) {
        self.record_in((key, 0), cost, cpu_us, now, prediction, short_us);
    }

    /// [`Self::record`] of fingerprint `key` in `scope`.
    pub fn record_in(
        &mut self,
        (key, scope): (u64, u64),
        cost: f64,
        cpu_us: f64,
        now: u64,
        prediction: Option<Prediction>,
        short_us: f64,
    ) {
        self.quality.count(prediction, cpu_us, short_us);
        self.model.calibrate(cost, cpu_us);
        if key == 0 {
            return;
        }
        let set = set_of(key, scope, self.slots.len());
        let slots = &mut self.slots[set];
        let found = slots.iter().position(|h| h.key == key && h.scope == scope);
        let at = found.unwrap_or_else(|| {
            // an empty slot has key 0, so it goes first
            let victim = (0..slots.len())
                .min_by_key(|&i| {
                    let h = &slots[i];
                    (h.key != 0, h.executions > 1, h.last_seen)
                })
                .unwrap_or(0);
            slots[victim] = History {
                key,
                scope,
                ..History::default()
            };
            victim
        });
        slots[at].add(cpu_us, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Parts {
        slots: Vec<History>,
        model: CostModel,
        quality: Quality,
    }

    impl Parts {
        fn new(capacity: usize) -> Self {
            Parts {
                slots: vec![History::default(); Table::slots_for(capacity)],
                model: CostModel::default(),
                quality: Quality::default(),
            }
        }
        fn table(&mut self) -> Table<'_> {
            Table::new(&mut self.slots, &mut self.model, &mut self.quality)
        }
    }

    #[test]
    fn history_is_the_exact_mean_and_variance_at_first() {
        let mut h = History::default();
        for (i, v) in [10.0, 20.0, 30.0, 40.0].into_iter().enumerate() {
            h.add(v, i as u64 + 1);
        }
        assert_eq!(h.executions, 4);
        assert!((h.mean_us - 25.0).abs() < 1e-9, "{h:?}");
        // population variance of 10, 20, 30, 40
        assert!((h.var_us2 - 125.0).abs() < 1e-9, "{h:?}");
        assert_eq!(h.max_us, 40.0);
        assert_eq!(h.last_seen, 4);
        assert!(h.p95_us() <= 40.0 && h.p95_us() > 25.0);
    }

    #[test]
    fn history_follows_a_change_within_a_few_windows() {
        let mut h = History::default();
        for t in 0..1000 {
            h.add(100.0, t);
        }
        for t in 1000..(1000 + 3 * WINDOW) {
            h.add(10_000.0, t);
        }
        // after three windows, (1 - 1/32)^96 ≈ 5 % of the old level remains
        assert!(h.mean_us > 9_000.0, "{h:?}");
    }

    #[test]
    fn bad_cpu_values_do_not_poison_a_history() {
        let mut h = History::default();
        h.add(f64::NAN, 1);
        h.add(-5.0, 2);
        h.add(f64::INFINITY, 3);
        assert!(h.mean_us.is_finite() && h.var_us2.is_finite() && h.mean_us == 0.0);
    }

    #[test]
    fn one_outlier_does_not_hold_a_history_up_but_a_lasting_change_shows() {
        let mut h = History::default();
        for t in 0..100 {
            h.add(5_000.0, t);
        }
        // one execution a thousand times the usual counts as sixteen times the mean
        // (uncapped, it would have raised the mean to about 161,000 µs)
        h.add(5_000_000.0, 100);
        assert!(
            h.mean_us <= 5_000.0 * (1.0 + 15.0 / WINDOW as f64) + 1e-6,
            "{h:?}"
        );
        assert_eq!(h.max_us, 5_000_000.0);
        let mut t = 101;
        for _ in 0..WINDOW {
            h.add(5_000.0, t);
            t += 1;
        }
        assert!(h.mean_us < 6_000.0, "{h:?}");
        // a table that grew a thousandfold: the mean follows within a few windows
        for _ in 0..3 * WINDOW {
            h.add(5_000_000.0, t);
            t += 1;
        }
        assert!(h.mean_us > 4_000_000.0, "{h:?}");
        // a mean of microseconds caps from a millisecond, not from itself
        let mut tiny = History::default();
        tiny.add(2.0, 1);
        tiny.add(10_000.0, 2);
        assert_eq!(tiny.max_us, 10_000.0);
        assert!(
            (tiny.mean_us - (2.0 + 10_000.0) / 2.0).abs() < 1e-6,
            "{tiny:?}"
        );
    }

    #[test]
    fn a_fingerprint_runs_unscheduled_once_its_executions_stay_under_half_a_slice() {
        let slice_us = 2_000.0;
        let mut h = History::default();
        // 0.3 ms each: trusted from the third execution on, not before
        for t in 0..UNSCHEDULED_AFTER {
            assert!(!h.runs_unscheduled(slice_us), "after {t}: {h:?}");
            h.add(300.0, t);
        }
        assert!(h.runs_unscheduled(slice_us), "{h:?}");
        // the same executions are scheduled under a slice of half a millisecond
        assert!(!h.runs_unscheduled(500.0), "{h:?}");
        // once the window is full, one that ran past half a slice schedules the next
        // at once, although neither the mean nor the p95 estimate has caught up
        let mut t = UNSCHEDULED_AFTER;
        while t < 2 * WINDOW {
            h.add(300.0, t);
            t += 1;
        }
        h.add(1_500.0, t);
        assert!(
            h.p95_us() < 1_000.0 && !h.runs_unscheduled(slice_us),
            "{h:?}"
        );
        // short again: unscheduled from the next execution on
        h.add(300.0, t + 1);
        assert!(h.runs_unscheduled(slice_us), "{h:?}");
    }

    #[test]
    fn a_fingerprint_whose_executions_vary_widely_stays_scheduled() {
        // a mean of 0.95 ms made of runs of 0.1 and 1.8 ms: its p95 is above the bound
        // although its latest run and its mean are below
        let mut h = History::default();
        for t in 0..20 {
            h.add(if t % 2 == 0 { 1_800.0 } else { 100.0 }, t);
        }
        assert!(h.last_us <= 1_000.0 && h.mean_us <= 1_000.0, "{h:?}");
        assert!(!h.runs_unscheduled(2_000.0), "{h:?}");
    }

    #[test]
    fn the_cost_model_ignores_disabled_plans_and_bounds_each_sample() {
        let mut m = CostModel::default();
        for _ in 0..WINDOW {
            m.calibrate(1000.0, 3000.0);
        }
        // a plan with a disabled node (enable_nestloop = off before PostgreSQL 18)
        m.calibrate(1.0e10 + 500.0, 3000.0);
        assert_eq!(m.samples, WINDOW);
        assert_eq!(m.predict_us(2.0e10), None);
        // a session whose plans look hundreds of millions of times cheaper than they are
        // (cost 2, 3,000 s of CPU) moves the shared ratio by at most a window's share of
        // sixteenfold each
        let before = m.mean_ln_ratio;
        m.calibrate(2.0, 3.0e9);
        let moved = m.mean_ln_ratio - before;
        assert!(
            moved > 0.0 && moved <= OUTLIER.ln() / WINDOW as f64 + 1e-12,
            "{moved}"
        );
        let p = m.predict_us(1000.0).unwrap();
        assert!(p < 3000.0 * 1.1, "{p}");
    }

    #[test]
    fn cost_model_learns_a_constant_ratio_and_ignores_useless_costs() {
        let mut m = CostModel::default();
        assert_eq!(m.predict_us(1000.0), None);
        for cost in [10.0, 100.0, 1000.0, 1e5] {
            m.calibrate(cost, cost * 3.0);
        }
        m.calibrate(0.01, 1e9); // too cheap to say anything
        m.calibrate(100.0, 0.0); // no CPU measured
        m.calibrate(f64::NAN, 5.0);
        assert_eq!(m.samples, 4);
        let p = m.predict_us(500.0).unwrap();
        assert!((p - 1500.0).abs() < 1e-6, "{p}");
        assert_eq!(m.predict_us(0.5), None);
    }

    #[test]
    fn prediction_prefers_the_history_over_the_cost() {
        let mut parts = Parts::new(64);
        let mut t = parts.table();
        assert_eq!(t.view().predict(7, 100.0), None, "nothing learnt yet");
        t.record(7, 100.0, 50.0, 1, None, 1000.0);
        // fingerprint 7 has a history; 8 only the cost model (50 µs per 100 cost)
        assert_eq!(
            t.view().predict(7, 1e6),
            Some(Prediction {
                cpu_us: 50.0,
                source: Source::History
            })
        );
        let p8 = t.view().predict(8, 1000.0).unwrap();
        assert_eq!(p8.source, Source::Cost);
        assert!((p8.cpu_us - 500.0).abs() < 1e-6);
        // fingerprint 0 (none computed) never gets a history
        t.record(0, 100.0, 50.0, 2, None, 1000.0);
        assert_eq!(t.view().histories().count(), 1);
        assert_eq!(t.view().predict(0, 0.0), None);
    }

    #[test]
    fn one_identifier_in_two_scopes_has_two_histories() {
        let mut parts = Parts::new(64);
        let mut t = parts.table();
        // The same query identifier in a database of small tables and one of large.
        for now in 0..3 {
            t.record_in((7, 1), 100.0, 50.0, now, None, 1000.0);
            t.record_in((7, 2), 100.0, 90_000.0, now, None, 1000.0);
        }
        let mean = |scope| t.view().history_in(7, scope).map(|h| h.mean_us);
        assert_eq!(mean(1), Some(50.0));
        assert_eq!(mean(2), Some(90_000.0));
        assert_eq!(mean(3), None, "a third database has none");
        assert_eq!(
            t.view().predict_in(7, 3, 100.0).map(|p| p.source),
            Some(Source::Cost)
        );
        assert_eq!(t.view().histories().count(), 2);
    }

    #[test]
    fn eviction_takes_the_least_recently_seen_of_a_full_set() {
        let mut parts = Parts::new(WAYS); // one set
        let mut t = parts.table();
        for k in 1..=WAYS as u64 {
            t.record(k, 0.0, 1.0, k, None, 1.0);
        }
        t.record(1, 0.0, 1.0, 100, None, 1.0); // 1 is now the most recent
        t.record(99, 0.0, 1.0, 101, None, 1.0); // evicts 2, the least recent
        assert!(t.view().history(2).is_none());
        for k in [1, 3, 99] {
            assert!(t.view().history(k).is_some(), "{k} was evicted");
        }
        assert_eq!(t.view().histories().count(), WAYS);
    }

    #[test]
    fn statements_that_never_repeat_leave_the_repeating_ones_in_place() {
        let mut parts = Parts::new(WAYS); // one set
        let mut t = parts.table();
        for k in 1..=WAYS as u64 {
            t.record(k, 0.0, 1.0, k, None, 1.0);
            t.record(k, 0.0, 1.0, k, None, 1.0);
        }
        // a hundred one-offs, each newer than every repeating fingerprint: the first
        // takes the least recent one's slot (1), the rest take each other's
        for k in 1000..1100 {
            t.record(k, 0.0, 1.0, k, None, 1.0);
        }
        assert!(t.view().history(1).is_none());
        for k in 2..=WAYS as u64 {
            assert!(t.view().history(k).is_some(), "{k} was evicted by one-offs");
        }
        assert!(t.view().history(1099).is_some());
        assert!(t.view().history(1098).is_none());
        // a newcomer that repeats before the next one-off arrives is kept as well
        t.record(2000, 0.0, 1.0, 2000, None, 1.0);
        t.record(2000, 0.0, 1.0, 2001, None, 1.0);
        t.record(3000, 0.0, 1.0, 3000, None, 1.0);
        assert_eq!(t.view().history(2000).map(|h| h.executions), Some(2));
        assert!(
            t.view().history(2).is_none(),
            "the least recent repeating one goes"
        );
    }

    #[test]
    fn quality_counts_classes_and_errors() {
        let mut q = Quality::default();
        let p = |cpu_us, source| Some(Prediction { cpu_us, source });
        q.count(p(100.0, Source::History), 120.0, 1000.0); // short as short, err 0
        q.count(p(100.0, Source::Cost), 4000.0, 1000.0); // long as short, err +5
        q.count(p(5000.0, Source::History), 500.0, 1000.0); // short as long, err -3
        q.count(p(5000.0, Source::History), 1e9, 1000.0); // long as long, beyond +8
        q.count(None, 10.0, 1000.0);
        assert_eq!(
            (
                q.short_as_short,
                q.short_as_long,
                q.long_as_short,
                q.long_as_long
            ),
            (1, 1, 1, 1)
        );
        assert_eq!((q.unpredicted, q.from_history), (1, 3));
        assert_eq!(q.log2_error[ERROR_SPAN], 1);
        assert_eq!(q.log2_error[ERROR_SPAN + 5], 1);
        assert_eq!(q.log2_error[ERROR_SPAN - 3], 1);
        assert_eq!(q.log2_error[ERROR_BUCKETS - 1], 1);
        assert_eq!(q.short_recall(), Some(0.5));
        assert_eq!(q.long_recall(), Some(0.5));
    }

    const RANGE: PriorityRange = PriorityRange {
        p0: 10_000,
        p_min: 100,
    };
    const PARAMS: DecayParams = DecayParams {
        lambda: 0.9,
        d_start: 8,
        quantum_ns: 2_000_000,
    };

    #[test]
    fn the_threshold_is_the_undecayed_cpu() {
        assert_eq!(short_threshold_us(PARAMS), 16_000.0);
        let at_once = DecayParams {
            d_start: 0,
            ..PARAMS
        };
        assert_eq!(short_threshold_us(at_once), 2_000.0);
    }

    #[test]
    fn start_policy_by_class() {
        let configured = StartPolicy {
            p0: 10_000,
            d_start: 8,
        };
        assert_eq!(start_policy(None, RANGE, PARAMS, 16_000.0), configured);
        assert_eq!(
            start_policy(Some(f64::NAN), RANGE, PARAMS, 16_000.0),
            configured
        );
        // short and small: the configured start
        assert_eq!(
            start_policy(Some(1_000.0), RANGE, PARAMS, 16_000.0),
            configured
        );
        // short but near the threshold: held for twice 15 ms = 15 quanta of 2 ms
        assert_eq!(
            start_policy(Some(15_000.0), RANGE, PARAMS, 16_000.0),
            StartPolicy {
                p0: 10_000,
                d_start: 15
            }
        );
        // ten times the threshold: a tenth of p0, held for twice 160 ms = 160 quanta
        assert_eq!(
            start_policy(Some(160_000.0), RANGE, PARAMS, 16_000.0),
            StartPolicy {
                p0: 1_000,
                d_start: 160
            }
        );
        // far beyond: never below p_min
        assert_eq!(
            start_policy(Some(1e12), RANGE, PARAMS, 16_000.0),
            StartPolicy {
                p0: 100,
                d_start: 1_000_000_000
            }
        );
    }

    proptest::proptest! {
        /// Whatever is recorded, the table never holds more fingerprints than slots,
        /// never holds one twice, and the fingerprint recorded last is always found
        /// with its execution counted.
        #[test]
        fn table_stays_bounded_and_finds_the_latest(
            capacity in 1usize..40,
            records in proptest::collection::vec((0u64..60, 0.0f64..1e7, 0.0f64..1e6), 1..300),
        ) {
            let mut parts = Parts::new(capacity);
            let slots = parts.slots.len();
            let mut t = parts.table();
            for (now, &(key, cost, cpu)) in records.iter().enumerate() {
                let before = t.view().history(key).map_or(0, |h| h.executions);
                let p = t.view().predict(key, cost);
                t.record(key, cost, cpu, now as u64 + 1, p, 16_000.0);
                if key != 0 {
                    let h = t.view().history(key).copied().expect("just recorded");
                    proptest::prop_assert_eq!(h.executions, before + 1);
                    proptest::prop_assert!(h.mean_us >= 0.0 && h.mean_us <= 1e6 + 1e-6);
                }
                let mut keys: Vec<u64> = t.view().histories().map(|h| h.key).collect();
                proptest::prop_assert!(keys.len() <= slots);
                keys.sort_unstable();
                keys.dedup();
                proptest::prop_assert_eq!(keys.len(), t.view().histories().count());
            }
            let q = t.view().quality();
            let judged = q.short_as_short + q.short_as_long + q.long_as_short + q.long_as_long;
            proptest::prop_assert_eq!(judged + q.unpredicted, records.len() as u64);
            proptest::prop_assert_eq!(q.log2_error.iter().sum::<u64>(), judged);
        }

        /// The start policy never leaves the group's range, never starts a statement
        /// above the configured start, and a longer prediction never starts higher.
        #[test]
        fn start_policy_is_bounded_and_monotone(
            a in 0.0f64..1e9, b in 0.0f64..1e9, short_us in 1.0f64..1e6,
            p0 in 1u32..100_000, p_min in 1u32..100_000,
        ) {
            let range = PriorityRange::new(p0, p_min);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let s_lo = start_policy(Some(lo), range, PARAMS, short_us);
            let s_hi = start_policy(Some(hi), range, PARAMS, short_us);
            for s in [s_lo, s_hi] {
                proptest::prop_assert!(s.p0 >= range.p_min && s.p0 <= range.p0);
            }
            proptest::prop_assert!(s_hi.p0 <= s_lo.p0);
        }
    }
}
