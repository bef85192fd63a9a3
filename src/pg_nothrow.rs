//! PostgreSQL functions that never raise an ERROR, declared here to be called without
//! pgrx's error boundary. pgrx wraps every function of `pg_sys` in a `sigsetjmp` so that
//! an ERROR becomes a Rust panic; for these plain reads and stores of process-local
//! state that costs more than the call itself, on paths every statement takes.

use pgrx::pg_sys;

mod ffi {
    use pgrx::pg_sys;

    extern "C" {
        pub fn GetTopTransactionIdIfAny() -> pg_sys::TransactionId;
        pub fn GetCurrentStatementStartTimestamp() -> pg_sys::TimestampTz;
        pub fn ExecSetExecProcNode(node: *mut pg_sys::PlanState, function: pg_sys::ExecProcNodeMtd);
    }
}

/// The top-level transaction's ID, or InvalidTransactionId when it has none yet (it has
/// written nothing and locked no rows).
pub fn top_transaction_id_if_any() -> pg_sys::TransactionId {
    // SAFETY: returns a field of the backend's transaction state (xact.c); no ERROR.
    unsafe { ffi::GetTopTransactionIdIfAny() }
}

/// When the current statement started (TimestampTz).
pub fn statement_start_timestamp() -> pg_sys::TimestampTz {
    // SAFETY: returns a variable of xact.c; no ERROR.
    unsafe { ffi::GetCurrentStatementStartTimestamp() }
}

/// Makes `function` the function PostgreSQL calls to get `node`'s next tuple.
///
/// # Safety
/// `node` is a PlanState of a plan tree being set up or run by this backend.
pub unsafe fn set_exec_proc_node(node: *mut pg_sys::PlanState, function: pg_sys::ExecProcNodeMtd) {
    // SAFETY: the caller's promise; the function only stores two pointers (execProcnode.c).
    unsafe { ffi::ExecSetExecProcNode(node, function) }
}
