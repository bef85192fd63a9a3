//! Statements too small to schedule. A serial read whose plan the planner puts below
//! [`COST_PER_SLICE_MS`] per millisecond of `pg_stride.slice` (50 with the default 2 ms,
//! a few dozen pages: a primary-key lookup costs about 8) runs without joining CPU
//! scheduling: no yield points, no membership, no slot. Scheduling it would change
//! nothing but its cost, since it ends long before its first check-in (C0 tuples of a
//! scan, wagner2021 §3.1) would have let it compete for a slot. Most such reads are not
//! even admitted (`statements::runs_unadmitted`); the others — those that call a
//! user-defined function, say — pay admission alone, as a write does (docs/design.md §4
//! rule 2).
//!
//! A plan above the bound takes no slot for its first slice of CPU once its
//! fingerprint's history says its executions stay under half a slice
//! ([`tiny_by_history`]): a repeated statement of a fraction of a millisecond that reads
//! a few hundred pages would otherwise wait for a slot at its first check-in, behind
//! long statements that hold the slots a slice at a time, for longer than it runs. Its
//! scans stay yield points, so that an execution that grew joins CPU scheduling (and
//! meets the runaway-query rules) after that slice instead of running to its end
//! unscheduled.
//!
//! A plan is an estimate. A statement that was called tiny but whose ExecutorRuns took
//! more than [`RAN_LONG_SLICES`] slices (stale statistics, a function that returns far
//! more rows than it declares), twice, in any backend, is known for the next ten
//! minutes in every backend (`pg_stride_sched::long_runs`, in shared memory: a table
//! kept per backend would let such a statement escape admission for ever, one new
//! connection at a time), and its statements are admitted and scheduled; one that was
//! not admitted counts only if it also did far more than its plan said (`statements`'
//! `did_more_than_planned`: runs slowed by the disk or a busy CPU are not misestimates).
//! It is known by its relation key (`pg::statement_relation`) and its fingerprint: the
//! statement's text with its constants left out, in its database
//! (`pg::statement_fingerprint`), not its query identifier. PostgreSQL computes those
//! only on request, at a cost larger than all of pg_stride's for a short statement sent
//! as text; the text is read only for a statement that ran long, or one whose relation
//! key may be a known statement's.

use crate::{os, shmem};
use pg_stride_sched::predict::History;

/// Plans estimated below this many planner cost units per millisecond of slice run
/// unscheduled: 50 for a 2-ms slice is about 50 cached pages or 5,000 tuples read, well
/// under a slice of CPU. Tied to the slice, so that a server set to the shortest slices
/// (as the core suites run to force pauses everywhere) schedules nearly every plan.
const COST_PER_SLICE_MS: f64 = 25.0;

/// How long, in slices of wall time inside its ExecutorRuns, a statement called tiny may
/// run before it counts as long. Wall time, because the thread's CPU clock is a system call;
/// ten slices, so that a tiny statement slowed down by a busy CPU is not taken for a
/// misestimated one.
const RAN_LONG_SLICES: u64 = 10;

/// Whether a serial statement whose plan's total cost is `plan_cost`, with relation key
/// `relation`, is too small to schedule. `fingerprint` gives the statement's
/// fingerprint, asked for only if a statement that ran long may have the same relation
/// key ([`may_have_run_long`]). The bound is for PostgreSQL's default CPU costs: a
/// session that lowered them (to 0, say) lowers it alike (`plan_costs::scale`), and gets
/// no unscheduled statements by it.
pub fn is_tiny(plan_cost: f64, relation: u32, fingerprint: impl FnOnce() -> u64) -> bool {
    below_bound(plan_cost) && !ran_long_lately(relation, fingerprint)
}

/// Whether a statement with relation key `relation` and fingerprint `fingerprint()` ran
/// long twice in the last ten minutes ([`ran_long`]): scheduled, whatever its plan or
/// history say. The fingerprint is computed only if one with the same key did.
fn ran_long_lately(relation: u32, fingerprint: impl FnOnce() -> u64) -> bool {
    shmem::shared().is_some_and(|shared| {
        shared.long_runs.may_be_scheduled(relation)
            && shared
                .long_runs
                .is_scheduled(relation, fingerprint(), now_s())
    })
}

/// The CPU predicted, µs, for a serial read of group slot `group` whose plan is above
/// the bound but whose query identifier's history says its executions stay under half
/// a slice (`pg_stride_sched::predict::History::runs_unscheduled`); `None` for any
/// other. Such a statement joins CPU scheduling only at its first check-in past a
/// slice of CPU (`start_statement`'s `by_history`), its ExecutorRuns timed, and the CPU
/// they used is recorded into its history when it ends ([`super::record_unscheduled`]),
/// so that one that grows is scheduled from its start again. Only with
/// `pg_stride.predict` on, for a statement with an identifier (`query_id`, 0 for none)
/// outside pinned groups (whose statements keep their static priority and are not
/// predicted); one that ran long twice lately ([`ran_long_lately`]) is scheduled like a
/// tiny plan that did.
pub fn tiny_by_history(
    shared: &shmem::Shared,
    group: usize,
    query_id: u64,
    relation: u32,
    fingerprint: impl FnOnce() -> u64,
) -> Option<f64> {
    if query_id == 0 || !super::settings::predicts() {
        return None;
    }
    // A copy: the settings are read outside the table's lock.
    let history = shared.histories.history(query_id)?;
    if !history_runs_unscheduled(&history) {
        return None;
    }
    let pinned = shared.groups.settings_of(group).is_some_and(|s| s.pinned);
    (!pinned && !ran_long_lately(relation, fingerprint)).then_some(history.mean_us)
}

/// Whether this session would run the next execution of a fingerprint with history `h`
/// unscheduled, were it a serial read above the bound outside pinned groups that did
/// not run long lately ([`tiny_by_history`]): with `pg_stride.predict` on, under its
/// `pg_stride.slice` (`History::runs_unscheduled`). Also the `tiny` class of
/// `pg_stride.statements`.
pub fn history_runs_unscheduled(h: &History) -> bool {
    super::settings::predicts() && h.runs_unscheduled(super::settings::slice_ms() * 1000.0)
}

/// Whether a plan whose total cost is `plan_cost` is below the bound of a tiny one. With
/// [`may_have_run_long`] false, this alone is [`is_tiny`]. Plain arithmetic on
/// settings, which cannot fail: asked outside pgrx's error boundary.
#[inline]
pub fn below_bound(plan_cost: f64) -> bool {
    plan_cost < COST_PER_SLICE_MS * super::settings::slice_ms() * crate::plan_costs::scale()
}

/// Whether a statement with relation key `relation()` may be one that ran long
/// ([`ran_long`]): until one with the same key did, no statement needs its fingerprint
/// computed to be called tiny. Until any did, which is the common case, one load, and
/// the key is not asked for. Cannot panic.
#[inline]
pub fn may_have_run_long(relation: impl FnOnce() -> u32) -> bool {
    shmem::shared().is_some_and(|shared| {
        shared.long_runs.any_scheduled() && shared.long_runs.may_be_scheduled(relation())
    })
}

/// Whether a statement called tiny whose ExecutorRuns took `ran_ns` of wall time in all
/// (not the time its portal stayed open, which includes the client's) ran long: its
/// fingerprint is then passed to [`ran_long`].
pub fn counts_as_long(ran_ns: u64) -> bool {
    // Below the shortest slice's bound, the setting need not be read (nor converted).
    ran_ns > super::settings::SLICE_MIN_NS * RAN_LONG_SLICES
        && ran_ns > super::settings::slice_ns().saturating_mul(RAN_LONG_SLICES)
}

/// Slices of wall time after which a read's runs count as long whatever blocks they
/// touched (`statements`' rule for reads not admitted): a hundred, well beyond a lookup
/// slowed by a few pages read from disk or a busy CPU, so that a read that spends its
/// time on CPU, a join of small tables that returns far more rows than planned, does
/// not run unadmitted for ever.
const FAR_TOO_LONG_SLICES: u64 = 100;

/// Whether a statement called tiny whose ExecutorRuns took `ran_ns` ran far longer than
/// any wait could explain ([`FAR_TOO_LONG_SLICES`]).
pub fn counts_as_far_too_long(ran_ns: u64) -> bool {
    ran_ns > super::settings::slice_ns().saturating_mul(FAR_TOO_LONG_SLICES)
}

/// A statement called tiny, with relation key `relation` and fingerprint `fingerprint`
/// (its database's and its role's: `pg::StatementText::fingerprint`), ran long: once its
/// fingerprint has run long twice, in any backend, its statements are scheduled
/// everywhere for ten minutes (`pg_stride_sched::long_runs`).
/// Atomics only; cannot panic.
pub fn ran_long(relation: u32, fingerprint: u64) {
    if let Some(shared) = shmem::shared() {
        shared.long_runs.ran_long(relation, fingerprint, now_s());
    }
}

/// Clears the relation bits of statements that ran long whose ten minutes are over, so
/// that statements of those relations stop having their fingerprints computed, and sets
/// any a race lost. The scheduler worker's, every sweep.
pub fn sweep_long_runs(shared: &shmem::Shared) {
    shared.long_runs.sweep(now_s());
}

/// Seconds of the machine's monotonic clock, which every process shares: the clock of
/// the table of statements that ran long (`pg_stride_sched::long_runs`).
fn now_s() -> u32 {
    (os::monotonic_ns() / 1_000_000_000) as u32
}
