//! Rust versions of PostgreSQL's inline functions and macros that the pool needs and
//! pgrx cannot call (they are not functions in the server binary), each naming what it
//! mirrors, and the pool's way to raise an ERROR from code outside pgrx's boundary.
//!
//! Like ffi.rs's functions they run without pgrx's error boundary: an ERROR longjmps
//! through their callers, whose frames hold nothing with a destructor.

use super::ffi::*;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_long};

/// CHECK_FOR_INTERRUPTS(), without pgrx's boundary.
///
/// # Safety
/// May raise an ERROR or FATAL: the caller's frames must hold nothing with a destructor.
#[inline]
pub unsafe fn check_for_interrupts() {
    // SAFETY: plain read of a process-local flag; ProcessInterrupts as C code calls it.
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::InterruptPending) != 0 {
            ProcessInterrupts();
        }
    }
}

/// One wait on the process's own latch, until it is set or, with `timeout_ms`, that many
/// milliseconds have passed; exits on postmaster death; resets the latch. Returns
/// WaitLatch's events. Interrupts are the caller's to check.
///
/// # Safety
/// Called outside pgrx's error boundary, as the other functions here.
pub unsafe fn wait_latch(timeout_ms: Option<c_long>, wait_event: u32) -> c_int {
    let mut events = pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH;
    if timeout_ms.is_some() {
        events |= pg_sys::WL_TIMEOUT;
    }
    // SAFETY: the standard wait of a backend on its own latch.
    unsafe {
        let rc = WaitLatch(
            pg_sys::MyLatch,
            events as c_int,
            timeout_ms.unwrap_or(0),
            wait_event,
        );
        ResetLatch(pg_sys::MyLatch);
        rc
    }
}

/// HOLD_INTERRUPTS() / RESUME_INTERRUPTS().
pub fn hold_interrupts() {
    // SAFETY: a process-local counter, as the C macro changes it.
    unsafe { pg_sys::InterruptHoldoffCount += 1 };
}
pub fn resume_interrupts() {
    // SAFETY: as above.
    unsafe { pg_sys::InterruptHoldoffCount = pg_sys::InterruptHoldoffCount.saturating_sub(1) };
}

/// The lock-manager partition lock that protects `proc`'s lock-group fields
/// (`LockHashPartitionLockByProc`: by PGPROC number, not contents).
///
/// # Safety
/// `proc_` points into ProcGlobal->allProcs.
pub unsafe fn lock_group_lwlock(proc_: *mut pg_sys::PGPROC) -> *mut pg_sys::LWLock {
    // SAFETY: the caller's promise; MainLWLockArray has the lock-manager partitions at
    // LOCK_MANAGER_LWLOCK_OFFSET.
    unsafe {
        let procno = proc_.offset_from((*pg_sys::ProcGlobal).allProcs) as u32;
        let index = pg_sys::LOCK_MANAGER_LWLOCK_OFFSET + procno % pg_sys::NUM_LOCK_PARTITIONS;
        &raw mut (*pg_sys::MainLWLockArray.add(index as usize)).lock
    }
}

/// `dlist_delete`.
///
/// # Safety
/// `node` is in a list.
pub unsafe fn dlist_delete(node: *mut pg_sys::dlist_node) {
    // SAFETY: the caller's promise.
    unsafe {
        (*(*node).prev).next = (*node).next;
        (*(*node).next).prev = (*node).prev;
    }
}

/// Tells this process which backend leads its parallel work (the leader's BackendId in
/// 15, its ProcNumber from 17 on), as ParallelWorkerMain does; `None` forgets it.
///
/// # Safety
/// `fps` is null or the leader's FixedParallelState.
pub unsafe fn set_parallel_leader(fps: *const FixedParallelState) {
    // SAFETY: the caller's promise. InvalidBackendId and INVALID_PROC_NUMBER are both -1.
    let number = unsafe { fps.as_ref() }.map_or(-1, |f| f.parallel_leader_number);
    // SAFETY: a process-local global of parallel.c.
    unsafe {
        #[cfg(feature = "pg15")]
        {
            pg_sys::ParallelLeaderBackendId = number;
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            pg_sys::ParallelLeaderProcNumber = number;
        }
    }
}

pub unsafe fn tup_is_null(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: null or a valid slot.
    unsafe { slot.is_null() || (*slot).tts_flags & TTS_FLAG_EMPTY != 0 }
}

pub unsafe fn exec_clear_tuple(slot: *mut pg_sys::TupleTableSlot) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: a valid slot; ExecClearTuple is an inline call of its clear callback.
    unsafe {
        if let Some(clear) = (*(*slot).tts_ops).clear {
            clear(slot);
        }
        slot
    }
}

pub unsafe fn exec_proc_node(node: *mut pg_sys::PlanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: ExecProcNode, an inline function of executor.h.
    unsafe {
        if !(*node).chgParam.is_null() {
            ExecReScan(node);
        }
        ((*node).ExecProcNode.unwrap())(node)
    }
}

/// SQLSTATE XX000 for [`raise`]: a state the pool's own code should never reach.
pub const INTERNAL_ERROR: c_int = pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR as c_int;
/// SQLSTATE 55000 for [`raise`]: a worker that stopped or declined its part, as
/// PostgreSQL's own "lost connection to parallel worker".
pub const NOT_IN_PREREQUISITE_STATE: c_int =
    pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE as c_int;

/// Raises an ERROR with SQLSTATE `code` (a `PgSqlErrorCode`) and `message` from code
/// outside pgrx's boundary (ereport(ERROR)).
#[pgrx::pg_guard]
pub unsafe extern "C-unwind" fn raise(code: c_int, message: *const c_char) {
    // SAFETY: callers pass a NUL-terminated literal.
    let message = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy();
    crate::pg::raise(pgrx::PgSqlErrorCode::from(code), message.into_owned(), None);
}

/// ExecProject (executor.h): evaluates the projection into its
/// result slot, in the per-tuple memory of its expression context.
pub unsafe fn exec_project(projection: *mut pg_sys::ProjectionInfo) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the Gather's ProjectionInfo, built by ExecInitGather (ExecAssignProjectionInfo)
    // over its outer tuple, which the caller set.
    unsafe {
        let econtext = (*projection).pi_exprContext;
        let state = &raw mut (*projection).pi_state;
        let slot = exec_clear_tuple((*state).resultslot);
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = (*econtext).ecxt_per_tuple_memory;
        // From 18 on a projection's program ends in EEOP_DONE_NO_RETURN, which asserts a
        // null isnull (ExecEvalExprNoReturn); before, ExecProject passes a dummy.
        #[cfg(feature = "pg18")]
        let isnull = std::ptr::null_mut();
        #[cfg(not(feature = "pg18"))]
        let isnull = &mut false as *mut bool;
        ((*state).evalfunc.unwrap())(state, econtext, isnull);
        pg_sys::CurrentMemoryContext = previous;
        (*slot).tts_flags &= !TTS_FLAG_EMPTY;
        (*slot).tts_nvalid = (*(*slot).tts_tupleDescriptor).natts as pg_sys::AttrNumber;
        slot
    }
}
