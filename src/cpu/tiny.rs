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
//! A plan is an estimate. A statement that was called tiny but whose ExecutorRuns took
//! more than [`RAN_LONG_SLICES`] slices (stale statistics, a function that returns far
//! more rows than it declares), twice, leaves its fingerprint here, and the backend
//! schedules that fingerprint's statements from then on. The fingerprint is the
//! statement's text with its constants left out (`pg_stride_sched::fingerprint`), not
//! its query identifier: PostgreSQL computes those only on request, at a cost larger
//! than all of pg_stride's for a short statement sent as text, and the text is read
//! only for a statement that ran long, or once a fingerprint is scheduled. Process-local:
//! an application's connections run the same statements over and over, and the check
//! costs a few compares where a shared table would cost a lock.

use crate::backend_local::BackendLocal;
use std::cell::Cell;

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

/// Long runs after which a fingerprint is scheduled: two, because the first run of a
/// statement in a backend also fills the catalog caches it needs, and may read its
/// pages from disk.
const LONG_RUNS: u8 = 2;

/// Fingerprints of tiny-estimated statements that ran long, with how often; 0 is
/// empty. A new one takes the next entry, round robin from [`NEXT`], that is not
/// scheduled yet ([`ran_long`]).
static RAN_LONG: BackendLocal<Cell<[(u64, u8); 8]>> = BackendLocal::new(Cell::new([(0, 0); 8]));
static NEXT: BackendLocal<Cell<usize>> = BackendLocal::new(Cell::new(0));
/// Whether a fingerprint of [`RAN_LONG`] ever reached [`LONG_RUNS`]: until one has, which
/// is the common case, no statement needs to look the table up, nor its fingerprint be
/// computed.
static ANY_SCHEDULED: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Whether a serial statement whose plan's total cost is `plan_cost` is too small to
/// schedule. `fingerprint` gives the statement's fingerprint, asked for only once a
/// fingerprint is scheduled in this backend ([`fingerprints_scheduled`]). The bound is
/// for PostgreSQL's default CPU costs: a session that lowered them (to 0, say) lowers it
/// alike (`plan_costs::scale`), and gets no unscheduled statements by it.
pub fn is_tiny(plan_cost: f64, fingerprint: impl FnOnce() -> u64) -> bool {
    below_bound(plan_cost)
        && !(fingerprints_scheduled() && {
            let fingerprint = fingerprint();
            RAN_LONG
                .get()
                .iter()
                .any(|&(id, runs)| id == fingerprint && runs >= LONG_RUNS)
        })
}

/// Whether a plan whose total cost is `plan_cost` is below the bound of a tiny one. With
/// [`fingerprints_scheduled`] false, this alone is [`is_tiny`]. Plain arithmetic on
/// settings, which cannot fail: asked outside pgrx's error boundary.
#[inline]
pub fn below_bound(plan_cost: f64) -> bool {
    plan_cost < COST_PER_SLICE_MS * super::settings::slice_ms() * crate::plan_costs::scale()
}

/// Whether this backend schedules a fingerprint that ran long: until it does, which is
/// the common case, no statement needs its fingerprint computed to be called tiny.
#[inline]
pub fn fingerprints_scheduled() -> bool {
    ANY_SCHEDULED.get()
}

/// Whether a statement called tiny whose ExecutorRuns took `ran_ns` of wall time in all
/// (not the time its portal stayed open, which includes the client's) ran long: its
/// fingerprint is then passed to [`ran_long`].
pub fn counts_as_long(ran_ns: u64) -> bool {
    // Below the shortest slice's bound, the setting need not be read (nor converted).
    ran_ns > super::settings::SLICE_MIN_NS * RAN_LONG_SLICES
        && ran_ns > super::settings::slice_ns().saturating_mul(RAN_LONG_SLICES)
}

/// A statement called tiny with fingerprint `fingerprint` ran long: once it has
/// [`LONG_RUNS`] times, its fingerprint is scheduled from now on. A new one replaces
/// one that has not been scheduled yet where it can, so that a burst of slow runs does
/// not forget the fingerprints already learned.
pub fn ran_long(fingerprint: u64) {
    let mut seen = RAN_LONG.get();
    match seen.iter_mut().find(|(id, _)| *id == fingerprint) {
        Some((_, runs)) => *runs = runs.saturating_add(1),
        None => {
            let next = NEXT.get();
            let slot = (0..seen.len())
                .map(|i| (next + i) % seen.len())
                .find(|&i| seen[i].1 < LONG_RUNS)
                .unwrap_or(next);
            seen[slot] = (fingerprint, 1);
            NEXT.set((slot + 1) % seen.len());
        }
    }
    if seen.iter().any(|&(_, runs)| runs >= LONG_RUNS) {
        ANY_SCHEDULED.set(true);
    }
    RAN_LONG.set(seen);
}
