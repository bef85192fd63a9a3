//! Statements too small to schedule. A serial read whose plan the planner puts below
//! [`TINY_PLAN_COST`] (a few dozen pages: a primary-key lookup costs about 8) runs
//! without joining CPU scheduling: no yield points, no membership, no slot. Scheduling
//! it would change nothing but its cost, since it ends long before its first check-in
//! (C0 tuples of a scan, wagner2021 §3.1) would have let it compete for a slot; what it
//! pays pg_stride is then admission alone, as a write does (docs/design.md §4 rule 2).
//!
//! A plan is an estimate. A statement that was called tiny but ran for more than
//! [`RAN_LONG_SLICES`] slices (stale statistics, a function that returns far more rows
//! than it declares), twice, leaves its fingerprint here, and the backend schedules
//! that fingerprint's statements from then on. Process-local: an application's
//! connections run the same statements over and over, and the check costs a few
//! compares where a shared table would cost a lock.

use crate::backend_local::BackendLocal;
use crate::gucs;
use std::cell::Cell;

/// Plans estimated below this run unscheduled. Planner cost units: 50 is about 50
/// cached pages or 5,000 tuples read, well under one 2-ms slice of CPU.
const TINY_PLAN_COST: f64 = 50.0;

/// How long, in slices of wall time from its admission, a statement called tiny may run
/// before it counts as long. Wall time, because the thread's CPU clock is a system call;
/// ten slices, so that a tiny statement slowed down by a busy CPU is not taken for a
/// misestimated one.
const RAN_LONG_SLICES: u64 = 10;

/// Long runs after which a fingerprint is scheduled: two, because the first run of a
/// statement in a backend also fills the catalog caches it needs, and may read its
/// pages from disk.
const LONG_RUNS: u8 = 2;

/// Query identifiers of tiny-estimated statements that ran long, with how often, the
/// oldest replaced first (round robin); 0 is empty.
static RAN_LONG: BackendLocal<Cell<[(u64, u8); 8]>> = BackendLocal::new(Cell::new([(0, 0); 8]));
static NEXT: BackendLocal<Cell<usize>> = BackendLocal::new(Cell::new(0));

/// Whether a serial statement with query identifier `query_id` (0: none computed) and a
/// plan of total cost `plan_cost` is too small to schedule.
pub fn is_tiny(query_id: u64, plan_cost: f64) -> bool {
    plan_cost < TINY_PLAN_COST
        && (query_id == 0
            || !RAN_LONG
                .get()
                .iter()
                .any(|&(id, runs)| id == query_id && runs >= LONG_RUNS))
}

/// A statement called tiny ended `ran_ns` after its admission: a fingerprint that ran
/// long [`LONG_RUNS`] times is scheduled from now on.
pub fn tiny_statement_ended(query_id: u64, ran_ns: u64) {
    if query_id == 0 || ran_ns <= gucs::slice_ns().saturating_mul(RAN_LONG_SLICES) {
        return;
    }
    let mut seen = RAN_LONG.get();
    match seen.iter_mut().find(|(id, _)| *id == query_id) {
        Some((_, runs)) => *runs = runs.saturating_add(1),
        None => {
            let next = NEXT.get();
            seen[next] = (query_id, 1);
            NEXT.set((next + 1) % seen.len());
        }
    }
    RAN_LONG.set(seen);
}
