//! A scheduled statement's CPU, predicted from its fingerprint's history when it joins
//! CPU scheduling, the priority it starts at by that prediction, and what it used,
//! recorded when it ends (`pg_stride_sched::predict`; docs/design.md §2).
//!
//! Only statements that reach a check-in are predicted and recorded: the rest never
//! compete for a slot. Once a history says a fingerprint's executions stay under half a
//! slice, they take no slot before they used a whole one (`tiny::tiny_by_history`) and
//! are still recorded, so that the history follows them.

use crate::{pg, shmem};
use pg_stride_sched::predict::{Prediction, Source, StartPolicy};
use pg_stride_sched::SchedShared;

/// The prediction for a statement of group slot `group` with query identifier
/// `query_id` (0: none) and planner cost `plan_cost`, published in this process's entry
/// for `pg_stride.activity`, and the start it gives the statement while
/// `pg_stride.predict` is on. With it off the prediction is still made, so that the
/// views show what it would do and `pg_stride.prediction_quality` how good it would be.
/// Nothing before anything was learnt.
// Out of line, so that bench/instructions.py can count its instructions.
#[inline(never)]
pub(super) fn predict(
    shared: &shmem::Shared,
    sched: &SchedShared,
    group: usize,
    query_id: u64,
    plan_cost: f64,
) -> Option<(Prediction, Option<StartPolicy>)> {
    let prediction = shared.histories.predict(query_id, plan_cost)?;
    let short = prediction.cpu_us <= sched.short_threshold_us(group);
    if let Some(entry) = shared.my_entry() {
        entry.publish_prediction(prediction.cpu_us as u64, short);
    }
    let start =
        super::settings::predicts().then(|| sched.predicted_start(group, prediction.cpu_us));
    Some((prediction, start))
}

/// Records the CPU, `cpu_ns`, that a statement of group slot `group` used, after it was
/// predicted as `prediction`: one that ran scheduled (its query entry's CPU as it left
/// it), or one tiny by its history ([`record_unscheduled`], whether it joined or not).
/// A failed statement (an error, a cancel, a timeout) is not recorded: it used less than
/// it would have; its caller does not call this.
// Out of line, as predict.
#[inline(never)]
pub(super) fn record(
    shared: &shmem::Shared,
    sched: &SchedShared,
    (query_id, plan_cost): (u64, f64),
    prediction: Option<Prediction>,
    group: usize,
    cpu_ns: u64,
) {
    let cpu_us = cpu_ns as f64 / 1000.0;
    let short_us = sched.short_threshold_us(group);
    let now = pg::now_timestamp().max(0) as u64;
    shared.histories.locked().record_in(
        (query_id, shmem::history_scope()),
        plan_cost,
        cpu_us,
        now,
        prediction,
        short_us,
    );
}

/// A statement of group slot `group` tiny by its history (`tiny::tiny_by_history`,
/// which predicted `predicted_us`; it took no slot for its first slice, and one if it
/// grew past it) ended normally after its own ExecutorRuns used `cpu_ns` of CPU:
/// recorded as a scheduled one is, also beside another statement, so that its
/// history follows it. `plan_cost` is its plan's cost at the default CPU costs
/// (`plan_costs::at_defaults`, taken when it started, as a scheduled one's is).
pub fn record_unscheduled(
    shared: &shmem::Shared,
    group: usize,
    (query_id, plan_cost): (u64, f64),
    predicted_us: f64,
    cpu_ns: u64,
) {
    let Some(sched) = shared.sched() else { return };
    let prediction = Prediction {
        cpu_us: predicted_us,
        source: Source::History,
    };
    record(
        shared,
        sched,
        (query_id, plan_cost),
        Some(prediction),
        group,
        cpu_ns,
    );
}
