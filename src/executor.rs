//! Executor hooks.
//!
//! Every hook chains to the one installed before it (pg_stat_statements, auto_explain …)
//! and, when pg_stride is disabled or was not preloaded, does nothing else
//! (DESIGN.md §4 rule 7). The executor hooks decide which statements are scheduled:
//! top-level statements of client backends only (rule 4). Nested statements (functions,
//! SPI) run while an outer statement is inside ExecutorRun or ExecutorFinish, which the
//! nesting depth below tracks, as pg_stat_statements does.
//!
//! The hooks run on every statement, so they are kept thin and cost next to nothing for
//! a statement pg_stride does not schedule (most of OLTP: writes, and reads of a
//! transaction that wrote). A hook calls the previous hook, or the standard function,
//! directly, the way C code does: an ERROR raised below it longjmps through its frame,
//! which therefore holds nothing with a destructor across that call, and its own code
//! is plain reads and stores that cannot panic. What pg_stride does for a statement runs
//! in guarded functions (`#[pg_guard]`, pgrx's error boundary: a Rust panic becomes an
//! ERROR, an ERROR below unwinds Rust frames), called only when there is something to
//! do. Guarding every hook and every call it makes cost more than all the rest of
//! pg_stride's work on a TPC-B statement (bench/instructions.py).
//!
//! pg_stat_statements restores its nesting level with PG_TRY/PG_FINALLY around each
//! call; here the depth is restored where PostgreSQL resumes after an ERROR instead:
//! PostgreSQL catches an ERROR only to re-throw it, or to abort the transaction (no
//! statement is running any more: depth 0) or a subtransaction (a PL/pgSQL exception
//! block: the depth the subtransaction started at, kept below). The depth is counted
//! with saturating arithmetic, so that no hook can panic over it.

use crate::backend_local::BackendLocal;
use crate::{cpu, gucs, shmem, statements};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// PostgreSQL's standard executor functions, declared here to be called without pgrx's
/// error boundary (see the module comment): they may raise an ERROR, which longjmps
/// through the calling hook.
mod raw {
    use pgrx::pg_sys;

    extern "C-unwind" {
        pub fn standard_ExecutorStart(desc: *mut pg_sys::QueryDesc, eflags: i32);
        pub fn standard_ExecutorRun(
            desc: *mut pg_sys::QueryDesc,
            direction: pg_sys::ScanDirection::Type,
            count: u64,
            execute_once: bool,
        );
        pub fn standard_ExecutorFinish(desc: *mut pg_sys::QueryDesc);
        pub fn standard_ExecutorEnd(desc: *mut pg_sys::QueryDesc);
    }
}

static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREV_EXECUTOR_RUN: pg_sys::ExecutorRun_hook_type = None;
static mut PREV_EXECUTOR_FINISH: pg_sys::ExecutorFinish_hook_type = None;
static mut PREV_EXECUTOR_END: pg_sys::ExecutorEnd_hook_type = None;

/// Depth of ExecutorRun/ExecutorFinish calls in progress in this backend.
static NESTING: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));
/// The depth each open subtransaction started at, innermost last, by SubTransactionId.
static SUBXACT_DEPTHS: BackendLocal<RefCell<Vec<(pg_sys::SubTransactionId, u32)>>> =
    BackendLocal::new(RefCell::new(Vec::new()));

/// Installs the hooks, remembering the previous ones, and the transaction callbacks that
/// restore the nesting depth after an ERROR. Called once from `_PG_init`.
pub fn install() {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any query; the
    // callbacks cannot panic.
    unsafe {
        PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        PREV_EXECUTOR_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
        PREV_EXECUTOR_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(executor_finish);
        PREV_EXECUTOR_END = pg_sys::ExecutorEnd_hook;
        pg_sys::ExecutorEnd_hook = Some(executor_end);
        pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact_event), std::ptr::null_mut());
    }
}

/// Whether pg_stride is active and the statement the executor is starting runs: a
/// top-level statement, not one that EXPLAIN only plans.
fn runs_top_level(eflags: i32) -> bool {
    shmem::shared().is_some()
        && gucs::enabled()
        && NESTING.get() == 0
        && eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0
}

/// Whether the statement the executor is starting is one pg_stride schedules.
fn is_scheduled(eflags: i32) -> bool {
    // SAFETY: plain read of a process-local global.
    let client_backend = unsafe { pg_sys::MyBackendType } == pg_sys::BackendType::B_BACKEND;
    client_backend && runs_top_level(eflags)
}

/// IsParallelWorker(): this process is one of PostgreSQL's parallel workers.
fn is_parallel_worker() -> bool {
    // SAFETY: plain read of a process-local global.
    unsafe { pg_sys::ParallelWorkerNumber >= 0 }
}

/// A parallel worker (PostgreSQL's own) running part of a statement: it joins its
/// leader's query, if there is one (DESIGN.md §2).
fn is_parallel_worker_of_scheduled_leader(eflags: i32) -> bool {
    is_parallel_worker() && runs_top_level(eflags)
}

/// Whether `desc` takes part in CPU scheduling: a pausable top-level statement of this
/// backend, or the part of one that this parallel worker runs.
fn runs_on_cpu_slots(desc: *const pg_sys::QueryDesc) -> bool {
    cpu::is_member() && (is_parallel_worker() || statements::on_cpu(desc))
}

unsafe extern "C-unwind" fn executor_start(desc: *mut pg_sys::QueryDesc, eflags: i32) {
    // Admission comes first, so that a queued statement holds no executor resources
    // (and launches no parallel workers) while it waits. If starting the executor then
    // fails, the statement's resource owner gives the admission back.
    let scheduled = is_scheduled(eflags);
    // SAFETY (all calls below): guarded functions and the executor's own entry points,
    // called with the executor's own arguments, as PostgreSQL would call them.
    if scheduled {
        unsafe { register_statement(desc) };
    }
    match unsafe { PREV_EXECUTOR_START } {
        Some(prev) => unsafe { prev(desc, eflags) },
        None => unsafe { raw::standard_ExecutorStart(desc, eflags) },
    }
    // With the plan tree built, yield points can be placed in it: in a statement that
    // may be paused (DESIGN.md §4 rule 2: writes are never paused).
    if scheduled {
        if cpu::is_pausable(desc) {
            unsafe { join_cpu_scheduling(desc) };
        }
    } else if is_parallel_worker_of_scheduled_leader(eflags) {
        unsafe { join_leader(desc) };
    }
}

unsafe extern "C-unwind" fn executor_run(
    desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    // A top-level scheduled statement holds a CPU slot while it runs, and only then:
    // between the FETCHes of a cursor it holds none. After an error the statement's
    // cleanup gives the slot back.
    let on_cpu = NESTING.get() == 0 && runs_on_cpu_slots(desc);
    // SAFETY (all calls below): as in executor_start.
    if on_cpu {
        unsafe { begin_run() };
    }
    NESTING.set(NESTING.get().saturating_add(1));
    match unsafe { PREV_EXECUTOR_RUN } {
        Some(prev) => unsafe { prev(desc, direction, count, execute_once) },
        None => unsafe { raw::standard_ExecutorRun(desc, direction, count, execute_once) },
    }
    NESTING.set(NESTING.get().saturating_sub(1));
    if on_cpu {
        unsafe { end_run() };
    }
}

unsafe extern "C-unwind" fn executor_finish(desc: *mut pg_sys::QueryDesc) {
    NESTING.set(NESTING.get().saturating_add(1));
    // SAFETY: as in executor_start.
    match unsafe { PREV_EXECUTOR_FINISH } {
        Some(prev) => unsafe { prev(desc) },
        None => unsafe { raw::standard_ExecutorFinish(desc) },
    }
    NESTING.set(NESTING.get().saturating_sub(1));
}

unsafe extern "C-unwind" fn executor_end(desc: *mut pg_sys::QueryDesc) {
    // SAFETY (all calls below): as in executor_start.
    if statements::any_registered() || cpu::is_member() {
        unsafe { end_statement(desc) };
    }
    match unsafe { PREV_EXECUTOR_END } {
        Some(prev) => unsafe { prev(desc) },
        None => unsafe { raw::standard_ExecutorEnd(desc) },
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn register_statement(desc: *mut pg_sys::QueryDesc) {
    statements::start(desc);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn join_cpu_scheduling(desc: *mut pg_sys::QueryDesc) {
    statements::started(desc);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn join_leader(desc: *mut pg_sys::QueryDesc) {
    if let Some(shared) = shmem::shared() {
        cpu::start_worker(shared, desc);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn begin_run() {
    if let Some(shared) = shmem::shared() {
        cpu::begin_run(shared);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn end_run() {
    if let Some(shared) = shmem::shared() {
        cpu::end_run(shared);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn end_statement(desc: *mut pg_sys::QueryDesc) {
    if !statements::unregister(desc) && is_parallel_worker() && cpu::is_member() {
        // A parallel worker's part of a statement ends.
        if let Some(shared) = shmem::shared() {
            cpu::end_statement(shared, Some(desc));
        }
    }
}

/// At the end of a transaction no statement runs: an ERROR that aborted it left the
/// depth of the statements it interrupted behind.
unsafe extern "C-unwind" fn on_xact_event(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PARALLEL_ABORT
    ) {
        NESTING.set(0);
        SUBXACT_DEPTHS.try_with_borrow_mut(|depths| depths.clear());
    }
}

/// A subtransaction that aborts returns to the depth it started at; the statements
/// started inside it and interrupted by the ERROR are gone.
unsafe extern "C-unwind" fn on_subxact_event(
    event: pg_sys::SubXactEvent::Type,
    subid: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    SUBXACT_DEPTHS.try_with_borrow_mut(|depths| match event {
        SUBXACT_EVENT_START_SUB => depths.push((subid, NESTING.get())),
        SUBXACT_EVENT_COMMIT_SUB | SUBXACT_EVENT_ABORT_SUB => {
            // Subtransactions end innermost first; any inner one still listed ended
            // with this one.
            while let Some(&(id, depth)) = depths.last() {
                if id < subid {
                    break;
                }
                depths.pop();
                if id == subid && event == SUBXACT_EVENT_ABORT_SUB {
                    NESTING.set(depth);
                }
            }
        }
        _ => {}
    });
}
