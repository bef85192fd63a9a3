//! Statements too small to admit (docs/design.md §4 rule 4): a SELECT, INSERT, UPDATE or
//! DELETE the client sends whose plan is tiny and does no more than its cost says (for a
//! write, on a table that does no more per row than the plan shows: `write_targets`)
//! runs at once, unregistered, outside admission and CPU scheduling. Only its
//! ExecutorRuns are timed, and a fingerprint that ran long twice is admitted from then
//! on. Everything here is a plain read or store
//! that cannot panic: the executor hooks call it outside pgrx's error boundary, except
//! [`learn_long_run`].

use super::{client_utility, write_targets};
use crate::backend_local::BackendLocal;
use crate::{cpu, os, pg, plan_tree, shmem};
use pgrx::pg_sys;
use std::cell::Cell;

/// The last statement that arrived too small to admit ([`runs_unadmitted`]), while it
/// may still run: its QueryDesc, and the wall time its ExecutorRuns took so far, ns, to
/// learn a plan that was estimated too small. Not registered: nothing of it is shared,
/// and nothing needs giving back if it fails. One at a time: the next statement that
/// arrives replaces it (a tiny cursor left open is no longer timed), and an abort
/// forgets it; the pointer is only compared, never followed, until the executor ends
/// the statement it names.
static UNADMITTED: BackendLocal<Cell<Option<(*const pg_sys::QueryDesc, u64)>>> =
    BackendLocal::new(Cell::new(None));

/// Whether `desc`, a top-level statement arriving, is too small to admit: a serial read
/// or write whose plan is tiny (`cpu::is_tiny`) and does no more than its cost says
/// (`plan_tree::is_plain_read`: relations, operators, casts, no function called by name
/// but a few quick built-ins; for a write `plan_tree::plain_write_target` and
/// `write_targets`), sent by the client itself rather than run by a utility (a cursor's DECLARE,
/// a DO block's loop, CREATE TABLE AS: their queries stay open while others run, or
/// write), while no memory budget is set. It ends long before a place in the queue
/// could matter to the statements it would wait behind, so it runs at once, outside
/// admission and CPU scheduling, as a monitoring query does (docs/design.md §4 rule 4);
/// only its ExecutorRuns are timed, and a fingerprint that ran long twice is admitted
/// and scheduled from then on. Whichever way it answers, it forgets the statement it
/// named before.
///
/// Plain reads of the plan and of settings, which cannot panic: the ExecutorStart hook
/// asks it outside pgrx's error boundary. Once this backend schedules a fingerprint that
/// ran long, telling a tiny plan needs the statement's fingerprint, and it answers no:
/// `arrive`, guarded, decides.
pub fn runs_unadmitted(desc: *const pg_sys::QueryDesc) -> bool {
    UNADMITTED.set(None);
    write_targets::forget_miss();
    // SAFETY: `desc` is the statement the executor is about to start.
    let small = !cpu::fingerprints_scheduled()
        && unsafe { too_small_to_admit(desc, cpu::below_bound, write_targets::known) };
    if small {
        UNADMITTED.set(Some((desc, 0)));
    }
    small
}

/// Whether `desc` is too small to admit ([`runs_unadmitted`]), its plan's cost judged by
/// `tiny`, and, for a write, the table it writes by `writable` (`write_targets`).
///
/// # Safety
/// `desc` is the QueryDesc of a statement about to start, with its PlannedStmt.
pub(super) unsafe fn too_small_to_admit(
    desc: *const pg_sys::QueryDesc,
    tiny: impl FnOnce(f64) -> bool,
    writable: impl Fn(pg_sys::Oid, pg_sys::CmdType::Type) -> bool,
) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        let stmt = (*desc).plannedstmt;
        !(*stmt).parallelModeNeeded
            && !client_utility::running()
            && shmem::shared().is_some_and(|shared| !shared.admission.memory_accounting())
            && tiny(pg::query_id_and_cost(stmt).1)
            && if plan_tree::reads_only(stmt) {
                plan_tree::is_plain_read(stmt)
            } else {
                plan_tree::plain_write_target(stmt).is_some_and(|(table, command, upserts)| {
                    writable(table, command)
                        && (!upserts || writable(table, pg_sys::CmdType::CMD_UPDATE))
                })
            }
    }
}

/// `desc`, arriving, was found too small to admit once its fingerprint was looked at
/// (`arrive`): it runs unadmitted, as if [`runs_unadmitted`] had said so.
pub(super) fn runs_after_all(desc: *const pg_sys::QueryDesc) {
    UNADMITTED.set(Some((desc, 0)));
}

/// An ExecutorRun of `desc` begins: returns when, if `desc` runs unadmitted (its runs
/// are timed). Cannot panic: the executor hooks call it outside pgrx's error boundary.
pub fn unadmitted_run_begins(desc: *const pg_sys::QueryDesc) -> Option<u64> {
    match UNADMITTED.get() {
        Some((unadmitted, _)) if unadmitted == desc => Some(os::monotonic_ns()),
        _ => None,
    }
}

/// The ExecutorRun of `desc`, which runs unadmitted, that began at `started` ended: adds
/// its time. Cannot panic, as above. A run that ends with an ERROR is not counted.
pub fn unadmitted_run_ended(desc: *const pg_sys::QueryDesc, started: u64) {
    if let Some((unadmitted, ran)) = UNADMITTED.get() {
        if unadmitted == desc {
            let took = os::monotonic_ns().saturating_sub(started);
            UNADMITTED.set(Some((desc, ran.saturating_add(took))));
        }
    }
}

/// ExecutorEnd of `desc`: if it is the statement that runs unadmitted
/// ([`runs_unadmitted`]), forgets it, and returns whether its runs took long enough that
/// its fingerprint should be learned ([`learn_long_run`]); `None` for another statement.
/// Cannot panic: the ExecutorEnd hook asks it outside pgrx's error boundary.
pub fn unadmitted_ended(desc: *const pg_sys::QueryDesc) -> Option<bool> {
    match UNADMITTED.get() {
        Some((unadmitted, ran)) if unadmitted == desc => {
            UNADMITTED.set(None);
            // SAFETY: the executor's QueryDesc at ExecutorEnd, its state not freed yet.
            Some(cpu::counts_as_long(ran) && unsafe { did_more_than_planned(desc) })
        }
        _ => None,
    }
}

/// How many times the rows its plan expected (at least one) a write must have written
/// for its long runs to count ([`did_more_than_planned`]).
const MISESTIMATED_ROWS: f64 = 10.0;

/// Whether `desc`, which ran long unadmitted, did more than its plan said: a read always
/// (its time is its work); a write only if it wrote over [`MISESTIMATED_ROWS`] times the
/// rows its plan expected. A write's runs are timed in wall time, which counts its
/// waits for other transactions' row locks: an UPDATE by key that waited behind a busy
/// row did what its plan said, and stays unadmitted, where its waits hold no admission.
/// Plain reads, which cannot panic.
///
/// # Safety
/// `desc` is the executor's QueryDesc at ExecutorEnd, its executor state not freed yet.
unsafe fn did_more_than_planned(desc: *const pg_sys::QueryDesc) -> bool {
    // SAFETY: the caller's promise; a ModifyTable's subplan is its left tree (whose rows
    // it writes: its own row estimate is 0 without RETURNING).
    unsafe {
        let (stmt, estate) = ((*desc).plannedstmt, (*desc).estate);
        if (*stmt).commandType == pg_sys::CmdType::CMD_SELECT || estate.is_null() {
            return true;
        }
        let plan = (*stmt).planTree;
        let sub = if plan.is_null() {
            plan
        } else {
            (*plan).lefttree
        };
        let expected = if sub.is_null() {
            1.0
        } else {
            (*sub).plan_rows.max(1.0)
        };
        (*estate).es_processed as f64 > MISESTIMATED_ROWS * expected
    }
}

/// `desc`, a statement that ran unadmitted, ran long: its fingerprint counts one long
/// run, as a registered tiny statement's does when it ends.
pub fn learn_long_run(desc: *const pg_sys::QueryDesc) {
    // SAFETY: the executor's QueryDesc of a statement ending at ExecutorEnd, text included.
    cpu::ran_long(unsafe { pg::statement_fingerprint(desc) });
}

/// The transaction or a subtransaction aborted: a statement that ran unadmitted and
/// failed is forgotten (its QueryDesc is gone, and no ExecutorEnd will name it).
pub fn unadmitted_aborted() {
    UNADMITTED.set(None);
}
