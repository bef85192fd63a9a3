//! Executor, planner and utility hooks, and the transaction callbacks.
//!
//! Every hook chains to the one installed before it (pg_stat_statements, auto_explain …)
//! and, when pg_stride is disabled or was not preloaded, does nothing else
//! (docs/design.md §4 rule 7). The hooks decide which statements are scheduled (rule 4):
//!
//! * the statements a client sends, run by a portal of a client backend, at nesting
//!   depth 0, cursors included;
//! * the query that a utility runs at the client's request is one of them: EXPLAIN
//!   ANALYZE, COPY … TO, CREATE TABLE AS / SELECT INTO / CREATE MATERIALIZED VIEW,
//!   DECLARE / FETCH / MOVE / CLOSE of a cursor, EXECUTE, and the statements of DO
//!   blocks and procedures (CALL), each admitted and scheduled on its own;
//! * a cursor that a function opened (PL/pgSQL's OPEN), whose query started nested,
//!   arrives when its portal first runs it at depth 0: the client's FETCH or MOVE,
//!   PL/pgSQL's FETCH in a DO block or procedure, or COMMIT for a holdable one;
//! * everything else runs nested, never queued or paused: statements of functions and
//!   triggers (inside ExecutorRun or ExecutorFinish of their statement), the queries
//!   any other utility runs internally (the foreign-key check of ALTER TABLE … ADD
//!   FOREIGN KEY, REFRESH MATERIALIZED VIEW, the triggers and foreign-key checks of the
//!   rows COPY … FROM inserts), and the queries PostgreSQL runs by itself when a
//!   transaction commits — deferred constraint triggers and foreign-key checks —, which
//!   run with no portal active, or, at a COMMIT inside a procedure or DO block, inside a
//!   trigger (`pg::in_trigger`); the transaction holds its locks meanwhile.
//!
//! The nesting depth counts ExecutorRun, ExecutorFinish and the utilities of the last
//! kind, like pg_stat_statements' nesting level (which counts every ProcessUtility).
//!
//! The hooks run on every statement, so they are kept thin and cost next to nothing for
//! a statement pg_stride does not schedule (most of OLTP: writes, and reads of a
//! transaction that wrote). A hook calls the previous hook, or the standard function,
//! directly, the way C code does: an ERROR raised below it longjmps through its frame,
//! which therefore holds nothing with a destructor across that call, and its own code
//! is plain reads and stores that cannot panic. What pg_stride does for a statement runs
//! in guarded functions (`#[pg_guard]`, pgrx's error boundary: a Rust panic becomes an
//! ERROR, an ERROR below unwinds Rust frames), called only when there is something to
//! do, and kept out of line: inlined, a boundary's frame (its jump buffer) would be set
//! up by every call of the hook. Guarding every hook and every call it makes cost more
//! than all the rest of pg_stride's work on a TPC-B statement (bench/instructions.py).
//!
//! pg_stat_statements restores its nesting level with PG_TRY/PG_FINALLY around each
//! call; here the depth is restored where PostgreSQL resumes after an ERROR instead:
//! PostgreSQL catches an ERROR only to re-throw it, or to abort the transaction (no
//! statement is running any more: depth 0) or a subtransaction (a PL/pgSQL exception
//! block: the depth the subtransaction started at, kept below). The depth is counted
//! with saturating arithmetic, so that no hook can panic over it.

use crate::backend_local::BackendLocal;
use crate::statements::{self, Ending};
use crate::{groups, gucs, monitoring, pg, plan_costs, pool, shmem};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// PostgreSQL's standard executor functions, declared here to be called without pgrx's
/// error boundary (see the module comment): they may raise an ERROR, which longjmps
/// through the calling hook.
mod raw {
    use pgrx::pg_sys;

    extern "C-unwind" {
        pub fn standard_planner(
            parse: *mut pg_sys::Query,
            query_string: *const std::ffi::c_char,
            cursor_options: i32,
            bound_params: pg_sys::ParamListInfo,
        ) -> *mut pg_sys::PlannedStmt;
        pub fn standard_ExecutorStart(desc: *mut pg_sys::QueryDesc, eflags: i32);
        #[cfg(not(feature = "pg18"))]
        pub fn standard_ExecutorRun(
            desc: *mut pg_sys::QueryDesc,
            direction: pg_sys::ScanDirection::Type,
            count: u64,
            execute_once: bool,
        );
        // PostgreSQL 18 dropped the execute_once argument.
        #[cfg(feature = "pg18")]
        pub fn standard_ExecutorRun(
            desc: *mut pg_sys::QueryDesc,
            direction: pg_sys::ScanDirection::Type,
            count: u64,
        );
        pub fn standard_ExecutorFinish(desc: *mut pg_sys::QueryDesc);
        pub fn standard_ExecutorEnd(desc: *mut pg_sys::QueryDesc);
        #[allow(clippy::too_many_arguments)]
        pub fn standard_ProcessUtility(
            pstmt: *mut pg_sys::PlannedStmt,
            query_string: *const std::ffi::c_char,
            read_only_tree: bool,
            context: pg_sys::ProcessUtilityContext::Type,
            params: pg_sys::ParamListInfo,
            query_env: *mut pg_sys::QueryEnvironment,
            dest: *mut pg_sys::DestReceiver,
            qc: *mut pg_sys::QueryCompletion,
        );
    }

    // The declarations above must be the functions the hooks replace: a signature that
    // differs in another major fails to build here instead of misbehaving at run time.
    const _: () = {
        let _: pg_sys::planner_hook_type = Some(standard_planner);
        let _: pg_sys::ExecutorStart_hook_type = Some(standard_ExecutorStart);
        let _: pg_sys::ExecutorRun_hook_type = Some(standard_ExecutorRun);
        let _: pg_sys::ExecutorFinish_hook_type = Some(standard_ExecutorFinish);
        let _: pg_sys::ExecutorEnd_hook_type = Some(standard_ExecutorEnd);
        let _: pg_sys::ProcessUtility_hook_type = Some(standard_ProcessUtility);
    };
}

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;
static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREV_EXECUTOR_RUN: pg_sys::ExecutorRun_hook_type = None;
static mut PREV_EXECUTOR_FINISH: pg_sys::ExecutorFinish_hook_type = None;
static mut PREV_EXECUTOR_END: pg_sys::ExecutorEnd_hook_type = None;
static mut PREV_PROCESS_UTILITY: pg_sys::ProcessUtility_hook_type = None;
/// The object-access hook that was in place when a DROP DATABASE started, while
/// pg_stride's stands in for it (see [`object_access`]).
static mut PREV_OBJECT_ACCESS: pg_sys::object_access_hook_type = None;
/// While pg_stride's object-access hook is in place: the subtransaction that was current
/// when the DROP DATABASE started (if that one aborts, the command ended with it).
static WATCHING_DROPS: BackendLocal<Cell<Option<pg_sys::SubTransactionId>>> =
    BackendLocal::new(Cell::new(None));

/// Whether the DROP DATABASE running asks `WITH (FORCE)`: its drop hook then also ends
/// the pool workers of leaders the caller may terminate (`pool::release_database`).
static DROP_FORCED: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Depth of ExecutorRun/ExecutorFinish calls, and of utilities whose queries are not
/// scheduled, in progress in this backend: the hooks' own state, which tells a
/// top-level statement from a nested one before any statement is registered.
static NESTING: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));
/// Depth of the planner calls in progress for a client's statement before a portal runs
/// it (at depth 0, no portal active): the functions the planner runs to fold constants
/// or estimate selectivities run their queries then, which are scheduled as the client's
/// own (see [`is_scheduled`]). Kept with [`NESTING`] across errors.
static CLIENT_PLANNING: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));
/// The depths ([`NESTING`], [`CLIENT_PLANNING`]) each open subtransaction started at,
/// innermost last, by SubTransactionId.
#[allow(clippy::type_complexity)]
static SUBXACT_DEPTHS: BackendLocal<RefCell<Vec<(pg_sys::SubTransactionId, u32, u32)>>> =
    BackendLocal::new(RefCell::new(Vec::new()));

/// Installs the hooks, remembering the previous ones, and the transaction callbacks that
/// restore the nesting depth after an ERROR. Called once from `_PG_init`.
pub fn install() {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any query; the
    // callbacks cannot panic.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
        PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        PREV_EXECUTOR_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
        PREV_EXECUTOR_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(executor_finish);
        PREV_EXECUTOR_END = pg_sys::ExecutorEnd_hook;
        pg_sys::ExecutorEnd_hook = Some(executor_end);
        PREV_PROCESS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

/// Whether pg_stride is active and the statement the executor is starting runs at
/// depth 0, not one that EXPLAIN only plans.
fn runs_top_level(eflags: i32) -> bool {
    shmem::shared().is_some()
        && gucs::enabled()
        && NESTING.get() == 0
        && eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0
}

/// Whether the statement the executor is starting is one pg_stride schedules (see the
/// module comment): one a portal of a client backend runs at depth 0, or that a function
/// runs while the planner folds a client's statement before its portal exists
/// ([`CLIENT_PLANNING`]), outside any trigger. The depth alone misses triggers
/// PostgreSQL fires outside the executor's hooks while a portal runs: those of a COMMIT
/// inside a procedure or DO block.
fn is_scheduled(eflags: i32) -> bool {
    pg::is_client_backend()
        && runs_top_level(eflags)
        && (pg::portal_active() || CLIENT_PLANNING.get() > 0)
        && !pg::in_trigger()
}

/// A parallel worker (PostgreSQL's own) running part of a statement: it joins its
/// leader's query, if there is one (docs/design.md §2).
fn is_parallel_worker_of_scheduled_leader(eflags: i32) -> bool {
    pg::is_parallel_worker() && runs_top_level(eflags)
}

/// The type of utility statement `stmt`, `None` for a null one.
///
/// # Safety
/// `stmt` is null or a valid utility statement node.
unsafe fn utility_tag(stmt: *const pg_sys::Node) -> Option<pg_sys::NodeTag> {
    // SAFETY: the caller's promise; a node's tag tells its type.
    unsafe { stmt.as_ref() }.map(|n| n.type_)
}

/// Whether the queries the utility `stmt`, of type `tag`, runs are the client's,
/// scheduled like top-level statements (see the module comment), rather than nested.
/// COPY … TO reads what the client asked for; COPY … FROM runs no query of the client's,
/// only the triggers and foreign-key checks of the rows it inserts, which it fires
/// itself, outside the executor's hooks: they run nested, inside the command.
///
/// # Safety
/// `stmt` is the valid utility statement node whose type is `tag`.
unsafe fn runs_client_queries(stmt: *const pg_sys::Node, tag: Option<pg_sys::NodeTag>) -> bool {
    use pg_sys::NodeTag::*;
    let Some(tag) = tag else {
        return false;
    };
    if tag == T_CopyStmt {
        // SAFETY: the caller's promise: a node of type T_CopyStmt is a CopyStmt.
        return unsafe { !(*stmt.cast::<pg_sys::CopyStmt>()).is_from };
    }
    matches!(
        tag,
        T_ExplainStmt
            | T_CreateTableAsStmt
            | T_DeclareCursorStmt
            | T_FetchStmt
            | T_ClosePortalStmt
            | T_ExecuteStmt
            | T_DoStmt
            | T_CallStmt
    )
}

/// Plans made for the pool get a Stride Gather in place of each Gather (pool.rs).
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: i32,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // The cost settings the plan is made with, which a cached plan keeps.
    plan_costs::planning();
    // A client's statement planned before its portal runs: the queries of the functions
    // the planner calls are the client's, in the group its tag names and judged as the
    // role that sent it (recorded as a client utility's are, for a SECURITY DEFINER
    // function folded here runs as its owner), and never too small to admit. An ERROR
    // leaves the depth and the record to the transaction callbacks.
    let client = NESTING.get() == 0 && !pg::portal_active() && pg::is_client_backend();
    let outermost = client && CLIENT_PLANNING.get() == 0;
    if client {
        CLIENT_PLANNING.set(CLIENT_PLANNING.get().saturating_add(1));
    }
    if outermost {
        // SAFETY: the planner's own arguments: the query string stays valid while the
        // statement is planned, and the record is cleared when planning returns.
        let text = unsafe {
            pg::StatementText::new(query_string, (*parse).stmt_location, (*parse).stmt_len)
        };
        statements::client_utility_started(text);
    }
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    let stmt = unsafe {
        PREV_PLANNER.unwrap_or(raw::standard_planner)(
            parse,
            query_string,
            cursor_options,
            bound_params,
        )
    };
    if client {
        CLIENT_PLANNING.set(CLIENT_PLANNING.get().saturating_sub(1));
    }
    if outermost {
        statements::client_utility_ended();
    }
    // A serial plan has nothing for the pool: the pool's settings are not even read.
    // SAFETY: the planner's result, a valid PlannedStmt, or null from a broken hook.
    if !stmt.is_null() && unsafe { (*stmt).parallelModeNeeded } && pool::plans_for_pool() {
        // SAFETY: a guarded function, given the plan just made, in the planner's context.
        unsafe { pool_plan(stmt) };
    }
    stmt
}

unsafe extern "C-unwind" fn executor_start(desc: *mut pg_sys::QueryDesc, eflags: i32) {
    // Admission comes first, so that a queued statement holds no executor resources
    // (and launches no parallel workers) while it waits. If starting the executor then
    // fails, the statement's resource owner gives the admission back.
    // SAFETY: a guarded function, given the executor's own QueryDesc.
    // A read or write too small to admit runs at once, unregistered, without entering
    // pgrx's error boundary (`statements::runs_unadmitted`).
    let joinable = is_scheduled(eflags)
        && !statements::runs_unadmitted(desc)
        && unsafe { arrive_unless_monitoring(desc) };
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    unsafe { PREV_EXECUTOR_START.unwrap_or(raw::standard_ExecutorStart)(desc, eflags) }
    // Stride Gathers are only in plans made for the pool, which need parallel mode.
    // SAFETY: ExecutorStart's QueryDesc holds its PlannedStmt.
    if unsafe { (*(*desc).plannedstmt).parallelModeNeeded } && pool::wanted(eflags) {
        // SAFETY: a guarded function, given the executor's own QueryDesc.
        unsafe { pool_gathers(desc) };
    }
    // With the plan tree built, yield points can be placed in it: in a statement that
    // may be paused (docs/design.md §4 rule 2: writes are never paused) and is not too
    // small to schedule, as its arrival found.
    if joinable {
        // SAFETY: a guarded function, given the executor's own QueryDesc.
        unsafe { join_cpu_scheduling(desc) };
    } else if is_parallel_worker_of_scheduled_leader(eflags) {
        // SAFETY: a guarded function, given the executor's own QueryDesc.
        unsafe { join_leader(desc) };
    }
}

#[cfg(not(feature = "pg18"))]
unsafe extern "C-unwind" fn executor_run(
    desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    let moves = direction != pg_sys::ScanDirection::NoMovementScanDirection;
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    run_on_cpu_slot(desc, moves, || unsafe {
        PREV_EXECUTOR_RUN.unwrap_or(raw::standard_ExecutorRun)(desc, direction, count, execute_once)
    })
}

#[cfg(feature = "pg18")]
unsafe extern "C-unwind" fn executor_run(
    desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
) {
    let moves = direction != pg_sys::ScanDirection::NoMovementScanDirection;
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    run_on_cpu_slot(desc, moves, || unsafe {
        PREV_EXECUTOR_RUN.unwrap_or(raw::standard_ExecutorRun)(desc, direction, count)
    })
}

/// The body of the ExecutorRun hook, whose signature differs between majors: `run` calls
/// the previous hook or the standard function; `moves`: the run's direction is not
/// NoMovement.
fn run_on_cpu_slot(desc: *mut pg_sys::QueryDesc, moves: bool, run: impl FnOnce()) {
    let top_level = NESTING.get() == 0;
    // A statement that runs unadmitted, told first, is not registered: it holds no slot
    // and lent no admission. Its runs are timed, to learn a plan estimated too small.
    if top_level {
        if let Some(started) = statements::unadmitted_run_begins(desc) {
            run_nested(run);
            statements::unadmitted_run_ended(desc, started);
            return;
        }
    }
    // A cursor that a function opened, started nested, arrives at its first run at depth
    // 0 that moves (a FETCH past its end runs it without moving). The cheap test first:
    // only a cursor's portal asks more.
    if top_level && moves && statements::cursor_arrives(desc) && is_scheduled(0) {
        // SAFETY: a guarded function, given the executor's own QueryDesc.
        unsafe { arrive_started(desc) };
    }
    // A top-level scheduled statement holds a CPU slot while it runs, and only then:
    // between the FETCHes of a cursor it holds none. After an error the statement's
    // cleanup gives the slot back.
    let on_cpu = top_level && statements::runs_on_cpu_slots(desc);
    if on_cpu || (top_level && statements::runs_on_lent_admission(desc)) {
        // SAFETY: a guarded function.
        unsafe { begin_run(desc, on_cpu) };
    }
    // A tiny registered statement's runs are timed too, and those of one tiny by its
    // history, which runs on a CPU slot once it has used a slice.
    let timed = if top_level {
        statements::timed_run_begins(on_cpu)
    } else {
        None
    };
    run_nested(run);
    if on_cpu {
        // SAFETY: a guarded function.
        unsafe { end_run(desc) };
    }
    if let Some(started) = timed {
        statements::timed_run_ended(desc, started);
    }
}

/// Runs `run`, ExecutorRun, one level deeper: the statements it starts are nested.
#[inline(always)]
fn run_nested(run: impl FnOnce()) {
    NESTING.set(NESTING.get().saturating_add(1));
    run();
    NESTING.set(NESTING.get().saturating_sub(1));
}

unsafe extern "C-unwind" fn executor_finish(desc: *mut pg_sys::QueryDesc) {
    NESTING.set(NESTING.get().saturating_add(1));
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    unsafe { PREV_EXECUTOR_FINISH.unwrap_or(raw::standard_ExecutorFinish)(desc) }
    NESTING.set(NESTING.get().saturating_sub(1));
}

unsafe extern "C-unwind" fn executor_end(desc: *mut pg_sys::QueryDesc) {
    statements::cursor_ended(Some(desc));
    // A statement that ran unadmitted, told first, is not registered.
    match statements::unadmitted_ended(desc) {
        // SAFETY: a guarded function, given the executor's own QueryDesc.
        Some(true) => unsafe { learn_long_run(desc) },
        Some(false) => {}
        None => match statements::end_at_once(desc) {
            Ending::Ended | Ending::NotRegistered => {}
            // SAFETY: a guarded function.
            Ending::EndedWithWaiters => unsafe { let_waiters_in() },
            // SAFETY: a guarded function, given the executor's own QueryDesc.
            Ending::NeedsEnd => unsafe { end_statement(desc) },
        },
    }
    // SAFETY: the previous hook, or the standard function, with the hook's arguments.
    unsafe { PREV_EXECUTOR_END.unwrap_or(raw::standard_ExecutorEnd)(desc) }
}

/// Runs a utility. Unless it is one whose queries are the client's, it runs nested:
/// queries it runs internally are never queued or paused, however long it holds its
/// locks.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: ProcessUtility's PlannedStmt wraps a valid utility statement.
    let (stmt, tag) = unsafe { ((*pstmt).utilityStmt, utility_tag((*pstmt).utilityStmt)) };
    // SAFETY: `tag` is the type of `stmt`.
    let nested = unsafe { !runs_client_queries(stmt, tag) };
    let drops_database = tag == Some(pg_sys::NodeTag::T_DropdbStmt);
    // DROP EXTENSION (or DROP SCHEMA … CASCADE) drops the groups table without firing its
    // trigger.
    // SAFETY: a DropStmt's removeType is a plain field.
    let drops_extension = tag == Some(pg_sys::NodeTag::T_DropStmt)
        && matches!(
            unsafe { (*stmt.cast::<pg_sys::DropStmt>()).removeType },
            pg_sys::ObjectType::OBJECT_EXTENSION | pg_sys::ObjectType::OBJECT_SCHEMA
        );
    if drops_database {
        // SAFETY: `stmt` is a DropdbStmt (its tag says so).
        DROP_FORCED.set(unsafe { pg::drop_database_forces(stmt.cast()) });
        watch_object_drops();
    }
    use pg_sys::NodeTag::{T_AlterDatabaseStmt, T_CreatedbStmt, T_RenameStmt};
    let top_level = context == pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL;
    let empties_database = match tag {
        // SAFETY: `tag` is the type of `stmt`, in ProcessUtility's transaction.
        Some(tag @ (T_RenameStmt | T_AlterDatabaseStmt | T_CreatedbStmt)) => unsafe {
            mark_database_emptied(stmt, tag, top_level)
        },
        _ => false,
    };
    // The statement the client sent: the queries it runs read their group tag in it.
    let client = !nested
        && NESTING.get() == 0
        && context == pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL;
    if client {
        // SAFETY: the query string stays valid while the utility runs; the value is
        // cleared when it returns, or when an ERROR aborts the transaction.
        let text = unsafe {
            pg::StatementText::new(query_string, (*pstmt).stmt_location, (*pstmt).stmt_len)
        };
        statements::client_utility_started(text);
    }
    if nested {
        NESTING.set(NESTING.get().saturating_add(1));
    }
    // SAFETY: the hook's own arguments, passed on as PostgreSQL would.
    unsafe {
        PREV_PROCESS_UTILITY.unwrap_or(raw::standard_ProcessUtility)(
            pstmt,
            query_string,
            read_only_tree,
            context,
            params,
            query_env,
            dest,
            qc,
        )
    }
    if nested {
        NESTING.set(NESTING.get().saturating_sub(1));
    }
    if client {
        statements::client_utility_ended();
    }
    if drops_database {
        DROP_FORCED.set(false);
        stop_watching_object_drops();
    }
    if empties_database {
        pool::unmark_closing();
    }
    if drops_extension {
        // The groups loader reloads when the transaction ends: without the table, only
        // `default` stays in effect.
        groups::mark_changed();
    }
}

/// Puts pg_stride's object-access hook in place for the DROP DATABASE about to run. Only
/// then: with a hook in place, PostgreSQL calls it for every function an expression
/// runs (InvokeFunctionExecuteHook), about 40 instructions of each OLTP statement, and
/// DROP DATABASE is the only access pg_stride watches. The command cannot run inside a
/// transaction block or a function (it fails there, before dropping anything), so no
/// other statement runs meanwhile.
pub(crate) fn watch_object_drops() {
    if WATCHING_DROPS.get().is_none() {
        WATCHING_DROPS.set(Some(pg::current_subtransaction()));
        // SAFETY: process-local hook variables, read and written by this process only.
        unsafe {
            PREV_OBJECT_ACCESS = pg_sys::object_access_hook;
            pg_sys::object_access_hook = Some(object_access);
        }
    }
}

/// The DROP DATABASE returned, or the (sub)transaction it ran in ended: the hook that was
/// in place before it is again. Unless a library loaded meanwhile put its own hook in
/// front of pg_stride's: taking pg_stride's out would take that one out of the chain
/// too, so pg_stride's stays where it is, for good, chaining on as before.
pub(crate) fn stop_watching_object_drops() {
    if WATCHING_DROPS.get().is_none() {
        return;
    }
    // SAFETY: as above.
    unsafe {
        if watches_object_drops() {
            pg_sys::object_access_hook = PREV_OBJECT_ACCESS;
            WATCHING_DROPS.set(None);
        }
    }
}

/// Whether pg_stride's object-access hook is the one PostgreSQL calls.
pub(crate) fn watches_object_drops() -> bool {
    // SAFETY: a process-local hook variable.
    let installed = unsafe { pg_sys::object_access_hook };
    installed.map(|hook| hook as usize) == Some(object_access as *const () as usize)
}

/// A top-level statement arrives: registers it (`statements::arrive`) unless it is a
/// monitoring query; returns whether it may join CPU scheduling once started (not a
/// monitoring query, nor one too small to schedule). One guarded call for both steps:
/// each entry into pgrx's error boundary costs about as much as the check itself.
#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn arrive_unless_monitoring(desc: *mut pg_sys::QueryDesc) -> bool {
    // SAFETY: the executor's QueryDesc, inside a guarded function.
    if unsafe { monitoring::bypasses_scheduling(desc) } {
        return false;
    }
    statements::arrive(desc)
}

/// A statement the executor started nested arrives at its first top-level run
/// (`statements::cursor_arrives`): admitted and registered, then, unless it is a
/// monitoring query or too small to schedule, joining CPU scheduling, as a top-level
/// statement does around its ExecutorStart.
#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn arrive_started(desc: *mut pg_sys::QueryDesc) {
    // SAFETY: the executor's QueryDesc, inside a guarded function.
    if unsafe { arrive_unless_monitoring(desc) } {
        statements::executor_started(desc);
    }
    statements::cursor_judged(desc);
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn pool_plan(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: the caller's plan, in the planner's context.
    unsafe { pool::plan_made(stmt) };
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn pool_gathers(desc: *mut pg_sys::QueryDesc) {
    pool::executor_started(desc);
}

/// The object-access hook, in place while a DROP DATABASE runs: once the caller passed
/// its ownership check, the command ends that database's pool workers (pool::lifecycle).
/// Chains to the previous hook first; cannot panic before the guarded call.
pub(crate) unsafe extern "C-unwind" fn object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: the hook's own arguments, passed on as PostgreSQL would.
    unsafe {
        if let Some(prev) = PREV_OBJECT_ACCESS {
            prev(access, class_id, object_id, sub_id, arg);
        }
    }
    if access == pg_sys::ObjectAccessType::OAT_DROP
        && class_id == pg_sys::DatabaseRelationId
        && shmem::shared().is_some()
    {
        // SAFETY: a guarded function.
        unsafe { release_pool_database(object_id, DROP_FORCED.get()) };
    }
}

/// For a utility that needs a database without other backends (other than DROP
/// DATABASE, whose drop hook does it): marks that database's pool closing, once the
/// utility's lock on it is taken, until the utility returns or its (sub)transaction
/// aborts (pool::lifecycle). Returns whether it did.
#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn mark_database_emptied(
    stmt: *mut pg_sys::Node,
    tag: pg_sys::NodeTag,
    top_level: bool,
) -> bool {
    // SAFETY: the caller's promise: `stmt` is of type `tag`, in a transaction.
    let database = unsafe { pg::database_emptied_by(stmt, tag, top_level, pool::may_serve) };
    database
        .inspect(|&database| pool::mark_closing(database))
        .is_some()
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn release_pool_database(database: pg_sys::Oid, forced: bool) {
    pool::release_database(database, forced);
}

// The guarded entry points into `statements` (see the module comment), one per step of
// a statement's life.

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn join_cpu_scheduling(desc: *mut pg_sys::QueryDesc) {
    statements::executor_started(desc);
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn join_leader(desc: *mut pg_sys::QueryDesc) {
    statements::worker_started(desc);
}

/// A top-level ExecutorRun begins: takes back an admission lent while the client was
/// away, then, for a statement on CPU slots, takes a slot. One guarded call for both.
#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn begin_run(desc: *mut pg_sys::QueryDesc, on_cpu_slot: bool) {
    statements::resume();
    if on_cpu_slot {
        statements::run_begins(desc);
    }
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn end_run(desc: *mut pg_sys::QueryDesc) {
    statements::run_ends(desc);
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn end_statement(desc: *mut pg_sys::QueryDesc) {
    statements::end(desc);
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn let_waiters_in() {
    statements::let_waiters_in();
}

#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn learn_long_run(desc: *mut pg_sys::QueryDesc) {
    statements::learn_long_run(desc);
}

/// The one transaction callback of pg_stride. When an ERROR aborts a transaction no
/// statement runs any more: it left the depth of the statements it interrupted behind.
/// (A procedure's or DO block's ROLLBACK aborts one too, between two of its statements,
/// and the CALL or DO runs on.) A commit leaves the depth alone: a utility that commits
/// on its way (CREATE INDEX CONCURRENTLY, ALTER TABLE … DETACH PARTITION CONCURRENTLY,
/// VACUUM) is still running, and its later queries are still its own. A transaction that
/// changed the groups table cannot be prepared (`groups` has them reloaded once its locks
/// are released). Cannot panic: it returns before pgrx's error boundary on every event,
/// and raises that ERROR through a guarded function.
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT) {
        NESTING.set(0);
        CLIENT_PLANNING.set(0);
        // A procedure's or DO block's ROLLBACK aborts the transaction while its CALL or
        // DO runs on: its later queries are still the client utility's, never too small
        // to admit.
        if !pg::portal_running() {
            statements::client_utility_ended();
        }
        statements::unadmitted_aborted();
        statements::cursor_ended(None);
    }
    // No planning spans a commit: a count left by an ERROR that something caught without
    // a subtransaction goes with the transaction.
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_PREPARE) {
        CLIENT_PLANNING.set(0);
    }
    if event == XACT_EVENT_PRE_PREPARE && groups::changed_in_transaction() {
        // SAFETY: a guarded function.
        unsafe { refuse_to_prepare_group_changes() };
    }
    // PREPARE TRANSACTION ends the backend's transaction as a commit would: what this
    // process kept for it goes (the pool's Gathers point into its memory, gone now).
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        SUBXACT_DEPTHS.try_with_borrow_mut(|depths| depths.clear());
        // A DROP DATABASE that failed, or one a commit outlived (it cannot: the
        // command returns before its transaction commits).
        stop_watching_object_drops();
        pool::transaction_ended();
    }
}

/// A transaction that changed the groups table cannot be prepared: the groups loader
/// reloads the table when a transaction ends in this backend, and COMMIT PREPARED may
/// come from any session, later, with nothing to tell the loader. PostgreSQL refuses
/// to prepare work it cannot hand over in the same way (temporary tables, WITH HOLD
/// cursors).
#[pgrx::pg_guard]
#[inline(never)]
unsafe extern "C-unwind" fn refuse_to_prepare_group_changes() {
    pg::raise(
        pgrx::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        "cannot PREPARE a transaction that changed pg_stride resource groups".into(),
        Some("Change resource groups in a transaction of their own, committed at once."),
    )
}

/// A subtransaction that aborts returns to the depth it started at; the statements
/// started inside it and interrupted by the ERROR are gone, and so is a client's utility
/// that started inside it.
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    if event == SUBXACT_EVENT_ABORT_SUB {
        statements::subtransaction_aborted(subid);
        statements::unadmitted_aborted();
        statements::cursor_ended(None);
        // A DROP DATABASE inside the savepoint failed (it cannot run in a transaction
        // block): only the subtransaction aborts.
        if WATCHING_DROPS
            .get()
            .is_some_and(|started_in| subid <= started_in)
        {
            stop_watching_object_drops();
        }
        // A database command that failed inside the savepoint: its database's pool
        // serves again.
        pool::subtransaction_aborted(subid);
    }
    SUBXACT_DEPTHS.try_with_borrow_mut(|depths| match event {
        SUBXACT_EVENT_START_SUB => depths.push((subid, NESTING.get(), CLIENT_PLANNING.get())),
        SUBXACT_EVENT_COMMIT_SUB | SUBXACT_EVENT_ABORT_SUB => {
            // Subtransactions end innermost first; any inner one still listed ended
            // with this one.
            while let Some(&(id, depth, planning)) = depths.last() {
                if id < subid {
                    break;
                }
                depths.pop();
                if id == subid && event == SUBXACT_EVENT_ABORT_SUB {
                    NESTING.set(depth);
                    CLIENT_PLANNING.set(planning);
                }
            }
        }
        _ => {}
    });
}
