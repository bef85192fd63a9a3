//! The report PostgreSQL is emitting, as `emit_log_hook` is given it (`ErrorData`):
//! whether it is the ERROR of a query cancel, and a new message and hint for it. Neither
//! raises an ERROR: the hook runs inside the report.

use pgrx::{pg_sys, PgLogLevel, PgSqlErrorCode};
use std::ffi::{c_char, c_int, c_void, CStr};

extern "C" {
    // Declared here, not called through pgrx's guarded binding, whose error boundary
    // would turn an ERROR into a panic inside the report: with MCXT_ALLOC_NO_OOM it
    // returns null when memory runs out, and raises an ERROR only for a size over
    // MaxAllocSize.
    fn MemoryContextAllocExtended(
        context: pg_sys::MemoryContext,
        size: usize,
        flags: c_int,
    ) -> *mut c_void;
}

/// The untranslated message of the ERROR a query cancel raises (postgres.c,
/// ProcessInterrupts), as the report's `message_id` holds it whatever the language.
const QUERY_CANCEL: &CStr = c"canceling statement due to user request";

/// Whether `edata` is the ERROR of a query cancel (a client's cancel request,
/// `pg_cancel_backend`), not of a timeout, a recovery conflict or pg_stride's own.
///
/// # Safety
/// `edata` is the report `emit_log_hook` was given.
pub unsafe fn is_query_cancel(edata: *const pg_sys::ErrorData) -> bool {
    // SAFETY: the caller's promise; message_id is null or a static C string.
    unsafe {
        (*edata).elevel == PgLogLevel::ERROR as i32
            && (*edata).sqlerrcode == PgSqlErrorCode::ERRCODE_QUERY_CANCELED as i32
            && !(*edata).message_id.is_null()
            && CStr::from_ptr((*edata).message_id) == QUERY_CANCEL
    }
}

/// Gives `edata` a new message and hint, copied into the current memory context (the
/// ErrorContext while a report is emitted, freed with it); leaves it as it was if that
/// memory runs out.
///
/// # Safety
/// `edata` is the report `emit_log_hook` was given.
pub unsafe fn set_message(edata: *mut pg_sys::ErrorData, message: &str, hint: &str) {
    let (Some(message), Some(hint)) = (copy(message), copy(hint)) else {
        return;
    };
    // SAFETY: the caller's promise; both copies live as long as the report.
    unsafe {
        (*edata).message = message;
        (*edata).hint = hint;
    }
}

/// `text` as a C string in the current memory context; None if that memory runs out.
fn copy(text: &str) -> Option<*mut c_char> {
    // SAFETY: an allocation that returns null instead of raising an ERROR when memory
    // runs out (MCXT_ALLOC_NO_OOM), of a size far below MaxAllocSize, filled before use.
    unsafe {
        let p = MemoryContextAllocExtended(
            pg_sys::CurrentMemoryContext,
            text.len() + 1,
            pg_sys::MCXT_ALLOC_NO_OOM as i32,
        )
        .cast::<c_char>();
        if p.is_null() {
            return None;
        }
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), p, text.len());
        *p.add(text.len()) = 0;
        Some(p)
    }
}
