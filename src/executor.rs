//! Executor hooks.
//!
//! Every hook chains to the one installed before it (pg_stat_statements, auto_explain …)
//! and, when pg_stride is disabled or was not preloaded, does nothing else
//! (DESIGN.md §4 rule 7). The executor hooks decide which statements are scheduled:
//! top-level statements of client backends only (rule 4). Nested statements (functions,
//! SPI) run while an outer statement is inside ExecutorRun or ExecutorFinish, which the
//! nesting depth below tracks, as pg_stat_statements does.
//!
//! A previous hook is a C function pointer: it is called through
//! `pg_guard_ffi_boundary`, so that an ERROR raised inside it unwinds through our frames
//! as a Rust panic (running `finally` blocks and destructors) instead of longjmp-ing
//! over them. pgrx does the same for every `pg_sys` function it binds.

use crate::backend_local::BackendLocal;
use crate::{cpu, gucs, shmem, statements};
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use std::cell::Cell;

static mut PREV_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;
static mut PREV_EXECUTOR_RUN: pg_sys::ExecutorRun_hook_type = None;
static mut PREV_EXECUTOR_FINISH: pg_sys::ExecutorFinish_hook_type = None;
static mut PREV_EXECUTOR_END: pg_sys::ExecutorEnd_hook_type = None;

/// Depth of ExecutorRun/ExecutorFinish calls in progress in this backend.
static NESTING: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));

/// Installs the hooks, remembering the previous ones. Called once from `_PG_init`.
pub fn install() {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any query.
    unsafe {
        PREV_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
        PREV_EXECUTOR_RUN = pg_sys::ExecutorRun_hook;
        pg_sys::ExecutorRun_hook = Some(executor_run);
        PREV_EXECUTOR_FINISH = pg_sys::ExecutorFinish_hook;
        pg_sys::ExecutorFinish_hook = Some(executor_finish);
        PREV_EXECUTOR_END = pg_sys::ExecutorEnd_hook;
        pg_sys::ExecutorEnd_hook = Some(executor_end);
    }
}

/// Whether the statement the executor is starting is one pg_stride schedules.
fn is_scheduled(eflags: i32) -> bool {
    // SAFETY: plain read of a process-local global.
    let client_backend = unsafe { pg_sys::MyBackendType } == pg_sys::BackendType::B_BACKEND;
    shmem::shared().is_some()
        && gucs::ENABLED.get()
        && client_backend
        && NESTING.get() == 0
        && eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0
}

/// Runs `body` one executor level deeper, restoring the depth even when it errors: an
/// ERROR raised below unwinds through here as a Rust panic (see the module comment), and
/// the guard's drop runs then as on a normal return.
fn nested<R>(body: impl FnOnce() -> R) -> R {
    struct Level;
    impl Drop for Level {
        fn drop(&mut self) {
            NESTING.set(NESTING.get() - 1);
        }
    }
    NESTING.set(NESTING.get() + 1);
    let _level = Level;
    body()
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn executor_start(desc: *mut pg_sys::QueryDesc, eflags: i32) {
    // Admission comes first, so that a queued statement holds no executor resources
    // (and launches no parallel workers) while it waits. If starting the executor then
    // fails, the statement's resource owner gives the admission back.
    let scheduled = is_scheduled(eflags);
    if scheduled {
        statements::start(desc);
    }
    // SAFETY: forwarding the executor's own arguments to the previous hook or to the
    // standard implementation, exactly as PostgreSQL would have called it.
    unsafe {
        match PREV_EXECUTOR_START {
            Some(prev) => pg_guard_ffi_boundary(|| prev(desc, eflags)),
            None => pg_sys::standard_ExecutorStart(desc, eflags),
        }
    }
    // With the plan tree built, yield points can be placed in it.
    if scheduled {
        statements::started(desc);
    } else if is_parallel_worker_of_scheduled_leader(eflags) {
        if let Some(shared) = shmem::shared() {
            cpu::start_worker(shared, desc);
        }
    }
}

/// IsParallelWorker(): this process is one of PostgreSQL's parallel workers.
fn is_parallel_worker() -> bool {
    // SAFETY: plain read of a process-local global.
    unsafe { pg_sys::ParallelWorkerNumber >= 0 }
}

/// Whether `desc` takes part in CPU scheduling: a pausable top-level statement of this
/// backend, or the part of one that this parallel worker runs.
fn runs_on_cpu_slots(desc: *const pg_sys::QueryDesc) -> bool {
    cpu::is_member() && (is_parallel_worker() || statements::on_cpu(desc))
}

/// A parallel worker (PostgreSQL's own) running part of a statement: it joins its
/// leader's query, if there is one (DESIGN.md §2).
fn is_parallel_worker_of_scheduled_leader(eflags: i32) -> bool {
    is_parallel_worker()
        && gucs::ENABLED.get()
        && NESTING.get() == 0
        && eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn executor_run(
    desc: *mut pg_sys::QueryDesc,
    direction: pg_sys::ScanDirection::Type,
    count: u64,
    execute_once: bool,
) {
    // A top-level scheduled statement holds a CPU slot while it runs, and only then:
    // between the FETCHes of a cursor it holds none.
    let shared = shmem::shared().filter(|_| NESTING.get() == 0 && runs_on_cpu_slots(desc));
    if let Some(shared) = shared {
        cpu::begin_run(shared);
    }
    // SAFETY: as in executor_start.
    nested(|| unsafe {
        match PREV_EXECUTOR_RUN {
            Some(prev) => pg_guard_ffi_boundary(|| prev(desc, direction, count, execute_once)),
            None => pg_sys::standard_ExecutorRun(desc, direction, count, execute_once),
        }
    });
    // After an error the statement's cleanup gives the slot back.
    if let Some(shared) = shared {
        cpu::end_run(shared);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn executor_finish(desc: *mut pg_sys::QueryDesc) {
    // SAFETY: as in executor_start.
    nested(|| unsafe {
        match PREV_EXECUTOR_FINISH {
            Some(prev) => pg_guard_ffi_boundary(|| prev(desc)),
            None => pg_sys::standard_ExecutorFinish(desc),
        }
    })
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn executor_end(desc: *mut pg_sys::QueryDesc) {
    if !statements::unregister(desc) && is_parallel_worker() && cpu::is_member() {
        // A parallel worker's part of a statement ends.
        if let Some(shared) = shmem::shared() {
            cpu::end_statement(shared, Some(desc));
        }
    }
    // SAFETY: as in executor_start.
    unsafe {
        match PREV_EXECUTOR_END {
            Some(prev) => pg_guard_ffi_boundary(|| prev(desc)),
            None => pg_sys::standard_ExecutorEnd(desc),
        }
    }
}
