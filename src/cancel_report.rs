//! `emit_log_hook`: a query cancel that a runaway-query rule sent (to a statement
//! without yield points, or one that reached none within a second: `worker::rules`)
//! reports the rule, as the error a statement raises itself at a yield point does
//! (`cpu::runaway`), instead of "canceling statement due to user request": the client
//! and the server log learn why the statement ended.

use crate::{cpu, pg};
use pgrx::pg_sys;

static mut PREV_EMIT_LOG: pg_sys::emit_log_hook_type = None;

/// Installs the hook, chained to the one installed before it.
pub fn install() {
    // SAFETY: _PG_init runs single-threaded in the postmaster, before any report is
    // emitted by a backend; the hook cannot panic.
    unsafe {
        PREV_EMIT_LOG = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(emit_log);
    }
}

/// Every report of every process passes here: for any other than a query cancel it
/// costs two compares. Called inside the report, outside pgrx's error boundary: it
/// raises nothing (a shared lock of the group directory at most, which a query cancel,
/// raised with no lightweight lock held, cannot be waiting for).
unsafe extern "C-unwind" fn emit_log(edata: *mut pg_sys::ErrorData) {
    // SAFETY: PostgreSQL passes the report it is emitting.
    if unsafe { pg::is_query_cancel(edata) } {
        if let Some((message, hint)) = cpu::rule_cancel_report() {
            // SAFETY: as above.
            unsafe { pg::set_message(edata, &message, hint) };
        }
    }
    // SAFETY: PREV_EMIT_LOG was written once, in _PG_init; the hook installed before
    // ours is given the report it expects.
    unsafe {
        if let Some(prev) = PREV_EMIT_LOG {
            prev(edata);
        }
    }
}
