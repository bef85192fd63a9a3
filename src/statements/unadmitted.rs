//! Statements too small to admit (docs/design.md §4 rule 4): a SELECT, INSERT, UPDATE or
//! DELETE the client sends whose plan is tiny and does no more than its cost says (for a
//! write, on a table that does no more per row than the plan shows: `write_targets`)
//! runs at once, unregistered, outside admission and CPU scheduling. Only its
//! ExecutorRuns are timed, and the blocks it touched from its arrival to its end read
//! if they were long; a fingerprint that ran long twice, in any backend, having done far
//! more than its plan said, is admitted in every backend for the next ten minutes
//! (`cpu::ran_long`). Everything here is a plain read or store that cannot
//! panic: the executor hooks call it outside pgrx's error boundary.

use super::plan_shapes::{self, Shape};
use super::{client_utility, write_targets};
use crate::backend_local::BackendLocal;
use crate::{cpu, os, pg, shmem};
use pgrx::pg_sys;
use std::cell::Cell;

/// The last statement that arrived too small to admit ([`runs_unadmitted`]), while it
/// may still run. Not registered: nothing of it is shared, and nothing needs giving back
/// if it fails. One at a time: the next statement that arrives replaces it (a tiny
/// cursor left open is no longer timed), and an abort forgets it, once it learned what
/// a long run cut short teaches ([`unadmitted_aborted`]).
static UNADMITTED: BackendLocal<Cell<Option<Unadmitted>>> = BackendLocal::new(Cell::new(None));

#[derive(Clone, Copy)]
struct Unadmitted {
    /// Its QueryDesc: only compared, never followed, until the executor ends the
    /// statement it names.
    desc: *const pg_sys::QueryDesc,
    /// The wall time its ExecutorRuns took so far, ns, to learn a plan that was
    /// estimated too small, and when the one running began (0: none runs).
    ran_ns: u64,
    run_began_ns: u64,
    /// What an abort needs to learn a long run, when the plan may be freed already: its
    /// relation key, text, cost, and whether it is a SELECT.
    relation: u32,
    text: pg::StatementText,
    cost: f64,
    select: bool,
}

/// The blocks this backend had touched (`pg::blocks_touched`) when the statement of
/// [`UNADMITTED`] arrived: what it touched by its end is read only if it ran long.
static BLOCKS_AT_ARRIVAL: BackendLocal<Cell<i64>> = BackendLocal::new(Cell::new(0));

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
/// and scheduled for a while ([`did_more_than_planned`], `cpu::ran_long`). Whichever
/// way it answers, it forgets the statement it named before.
///
/// Plain reads of the plan and of settings, which cannot panic: the ExecutorStart hook
/// asks it outside pgrx's error boundary. Once a fingerprint that ran long may have the
/// statement's relation key (`cpu::may_have_run_long`), telling a tiny plan needs the
/// statement's fingerprint, and it answers no: `arrive`, guarded, decides.
pub fn runs_unadmitted(desc: *const pg_sys::QueryDesc) -> bool {
    UNADMITTED.set(None);
    write_targets::forget_miss();
    // SAFETY: `desc` is the statement the executor is about to start.
    let relation = || unsafe { pg::statement_relation((*desc).plannedstmt) };
    let small = !cpu::may_have_run_long(relation)
        // SAFETY: as above.
        && unsafe { too_small_to_admit(desc, cpu::below_bound, write_targets::known) };
    if small {
        runs_after_all(desc);
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
            && match plan_shapes::shape(stmt) {
                Shape::Read => true,
                Shape::Write {
                    table,
                    command,
                    upserts,
                } => {
                    writable(table, command)
                        && (!upserts || writable(table, pg_sys::CmdType::CMD_UPDATE))
                }
                Shape::Neither => false,
            }
    }
}

/// `desc`, arriving, was found too small to admit once its fingerprint was looked at
/// (`arrive`): it runs unadmitted, as if [`runs_unadmitted`] had said so.
pub(super) fn runs_after_all(desc: *const pg_sys::QueryDesc) {
    // SAFETY: `desc` is the statement the executor is about to start, with its plan.
    let (stmt, text) = unsafe { ((*desc).plannedstmt, pg::StatementText::of(desc)) };
    // SAFETY: as above; a finished plan has its plan tree.
    let (relation, cost, select) = unsafe {
        (
            pg::statement_relation(stmt),
            (*(*stmt).planTree).total_cost,
            (*stmt).commandType == pg_sys::CmdType::CMD_SELECT,
        )
    };
    UNADMITTED.set(Some(Unadmitted {
        desc,
        ran_ns: 0,
        run_began_ns: 0,
        relation,
        text,
        cost,
        select,
    }));
    BLOCKS_AT_ARRIVAL.set(pg::blocks_touched());
}

/// An ExecutorRun of `desc` begins: returns when, if `desc` runs unadmitted (its runs
/// are timed). Cannot panic: the executor hooks call it outside pgrx's error boundary.
pub fn unadmitted_run_begins(desc: *const pg_sys::QueryDesc) -> Option<u64> {
    let mut u = UNADMITTED.get().filter(|u| u.desc == desc)?;
    u.run_began_ns = os::monotonic_ns();
    UNADMITTED.set(Some(u));
    Some(u.run_began_ns)
}

/// The ExecutorRun of `desc`, which runs unadmitted, that began at `started` ended: adds
/// its time. Cannot panic, as above. A run that ends with an ERROR ends in
/// [`unadmitted_aborted`] instead.
pub fn unadmitted_run_ended(desc: *const pg_sys::QueryDesc, started: u64) {
    if let Some(mut u) = UNADMITTED.get().filter(|u| u.desc == desc) {
        let took = os::monotonic_ns().saturating_sub(started);
        u.ran_ns = u.ran_ns.saturating_add(took);
        u.run_began_ns = 0;
        UNADMITTED.set(Some(u));
    }
}

/// ExecutorEnd of `desc`: if it is the statement that runs unadmitted
/// ([`runs_unadmitted`]), forgets it, and returns whether its runs took long enough that
/// its fingerprint should be learned ([`learn_long_run`]); `None` for another statement.
/// Cannot panic: the ExecutorEnd hook asks it outside pgrx's error boundary.
pub fn unadmitted_ended(desc: *const pg_sys::QueryDesc) -> Option<bool> {
    let u = UNADMITTED.get().filter(|u| u.desc == desc)?;
    UNADMITTED.set(None);
    Some(
        cpu::counts_as_long(u.ran_ns) && {
            // SAFETY: the executor's QueryDesc at ExecutorEnd, its state not freed yet.
            unsafe { did_more_than_planned(desc, u.ran_ns, blocks_since_arrival()) }
        },
    )
}

/// The blocks this backend touched since the statement of [`UNADMITTED`] arrived.
fn blocks_since_arrival() -> i64 {
    pg::blocks_touched().wrapping_sub(BLOCKS_AT_ARRIVAL.get())
}

/// How many times what its plan expected a statement must have done for its long runs
/// to count ([`did_more_than_planned`]): the blocks its cost stands for (planner cost
/// units are page reads), or for a write the rows it expected (at least one).
const MISESTIMATED: f64 = 10.0;

/// Blocks a statement may touch beyond [`MISESTIMATED`] times its plan's cost and still
/// have done what its plan said: the free-space and visibility maps, a relation
/// extended, a lookup's few pages when its cost is next to nothing.
const UNCOSTED_BLOCKS: f64 = 100.0;

/// Blocks a write touches for each row it writes that its plan does not cost (PostgreSQL
/// costs a ModifyTable as its subplan alone): the page the row goes to, and for each
/// index it inserts into, a descent of a B-tree (three or four levels) and now and then
/// a page split.
const BLOCKS_PER_ROW: f64 = 1.0;
const BLOCKS_PER_INDEX_ENTRY: f64 = 4.0;

/// Blocks a write may touch for each row it writes and each trigger of its table: the
/// triggers a write too small to admit may have are foreign keys' (`write_targets`),
/// whose check of a row, in ExecutorFinish, looks up the referenced key. Every trigger
/// of the table counts, also those that do not fire on the command (the other
/// command's check, the referenced side's actions): generous, never short.
const BLOCKS_PER_TRIGGER: f64 = 5.0;

/// Blocks a write touches for each index of its table the first time a backend writes
/// it: the catalog pages of the index's relation-cache entry, built when it first opens
/// the index, inside its ExecutorRun.
const BLOCKS_PER_INDEX_OPENED: f64 = 30.0;

/// Whether `desc`, whose runs took `ran_ns` (long), did more than its plan said: it
/// touched `blocks` blocks from its arrival to its end, more than [`MISESTIMATED`] times
/// its plan's cost, beyond [`UNCOSTED_BLOCKS`] and what writing its rows costs that its
/// plan does not; or, a write, it wrote over [`MISESTIMATED`] times the rows its plan
/// expected; or, a read, its runs were far too long (`cpu::counts_as_far_too_long`)
/// whatever it touched. Its runs are timed in wall
/// time, which counts waits that are no misestimate: pages read from disk after a
/// restart, a CPU shared with many others, another transaction's row lock. A
/// primary-key lookup slowed by a busy machine, or an UPDATE that waited behind a busy
/// row, did what its plan said, and stays unadmitted, where its waits hold no
/// admission. Plain reads, which cannot panic.
///
/// # Safety
/// `desc` is the executor's QueryDesc at ExecutorEnd, its executor state not freed yet.
unsafe fn did_more_than_planned(desc: *const pg_sys::QueryDesc, ran_ns: u64, blocks: i64) -> bool {
    // SAFETY: the caller's promise; a ModifyTable's subplan is its left tree (whose rows
    // it writes: its own row estimate is 0 without RETURNING); the ResultRelInfo of the
    // one table a write too small to admit writes is the first of the estate's opened
    // result relations, its indexes open for INSERT and UPDATE (not DELETE), with its
    // triggers (for such a write, foreign keys' checks).
    unsafe {
        let (stmt, estate, plan) = (
            (*desc).plannedstmt,
            (*desc).estate,
            (*(*desc).plannedstmt).planTree,
        );
        if estate.is_null() || plan.is_null() {
            return true;
        }
        if (*stmt).commandType == pg_sys::CmdType::CMD_SELECT {
            return read_did_more_than_planned((*plan).total_cost, ran_ns, blocks);
        }
        let planned_blocks = planned_blocks((*plan).total_cost);
        let blocks = blocks as f64;
        let sub = (*plan).lefttree;
        let expected = if sub.is_null() {
            1.0
        } else {
            (*sub).plan_rows.max(1.0)
        };
        let opened = (*estate).es_opened_result_relations;
        let info = match opened.as_ref() {
            Some(list) => (*list.elements).ptr_value.cast::<pg_sys::ResultRelInfo>(),
            None => std::ptr::null_mut(),
        };
        let (indexes, triggers) = info.as_ref().map_or((0.0, 0.0), |info| {
            let triggers = info.ri_TrigDesc.as_ref().map_or(0, |t| t.numtriggers);
            (
                f64::from(info.ri_NumIndices.max(0)),
                f64::from(triggers.max(0)),
            )
        });
        let written = (*estate).es_processed as f64;
        let per_row =
            BLOCKS_PER_ROW + BLOCKS_PER_INDEX_ENTRY * indexes + BLOCKS_PER_TRIGGER * triggers;
        written > MISESTIMATED * expected
            || blocks > planned_blocks + written * per_row + BLOCKS_PER_INDEX_OPENED * indexes
    }
}

/// The blocks a plan of `cost` may touch and still have done what it said.
fn planned_blocks(cost: f64) -> f64 {
    MISESTIMATED * cost + UNCOSTED_BLOCKS
}

/// [`did_more_than_planned`] for a read of plan cost `cost`.
fn read_did_more_than_planned(cost: f64, ran_ns: u64, blocks: i64) -> bool {
    blocks as f64 > planned_blocks(cost) || cpu::counts_as_far_too_long(ran_ns)
}

/// `desc`, a statement called tiny (one that ran unadmitted, or a registered tiny one
/// ending), ran long: its fingerprint counts one long run.
pub fn learn_long_run(desc: *const pg_sys::QueryDesc) {
    // SAFETY: the executor's QueryDesc of a statement ending at ExecutorEnd, text included.
    unsafe {
        cpu::ran_long(
            pg::statement_relation((*desc).plannedstmt),
            pg::statement_fingerprint(desc),
        )
    };
}

/// The transaction or a subtransaction aborted: a statement that ran unadmitted and
/// failed is forgotten (its QueryDesc is gone, and no ExecutorEnd will name it), once
/// its runs, the one the ERROR cut short included, are learned as ExecutorEnd would
/// learn them: a client whose `statement_timeout` or cancel always ends a misestimated
/// read would otherwise run it unadmitted for ever. A write is judged by its blocks
/// alone: the rows it wrote are in its executor state, freed by now, and its wall time
/// may be a wait for a row lock. Cannot panic: the transaction callbacks call it outside
/// pgrx's error boundary.
pub fn unadmitted_aborted() {
    let Some(u) = UNADMITTED.replace(None) else {
        return;
    };
    // Only an ERROR that cut a run short: an abort of other work while the statement
    // waits (a suspended portal beside a failing savepoint) says nothing of it, and its
    // blocks since arrival are not its own.
    if u.run_began_ns == 0 {
        return;
    }
    let ran = u
        .ran_ns
        .saturating_add(os::monotonic_ns().saturating_sub(u.run_began_ns));
    if !cpu::counts_as_long(ran) {
        return;
    }
    let blocks = blocks_since_arrival();
    let more = if u.select {
        read_did_more_than_planned(u.cost, ran, blocks)
    } else {
        blocks as f64 > planned_blocks(u.cost)
    };
    if more {
        // SAFETY: the query string outlives the abort callbacks: a simple query's is in
        // MessageContext, reset once the error is handled; a protocol-level one's is the
        // portal's copy, freed when the portal is dropped at the transaction's (or
        // subtransaction's) cleanup, after them. A statement whose portal was dropped
        // before is no longer here (its ExecutorEnd, or the next arrival, took it).
        let fingerprint = unsafe { u.text.fingerprint() };
        cpu::ran_long(u.relation, fingerprint);
    }
}
