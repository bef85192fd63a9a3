//! The pool on the majors whose parallel.c definitions are not checked (13, 14, 16):
//! `pg_stride.parallel_mode = pool` then works as `native`, and the pool's views are
//! empty.

use pgrx::pg_sys;

// Registered here too, unread (see the module).
#[allow(dead_code)]
#[path = "settings.rs"]
mod settings;
#[path = "worker_row.rs"]
mod worker_row;

pub use settings::register_settings;
pub use worker_row::WorkerRow;

/// No shared memory: nothing is pooled.
pub const SHMEM_BLOCKS: &[crate::shmem::Block] = &[];

pub fn install() {}

pub fn plans_for_pool() -> bool {
    false
}

/// # Safety
/// None: does nothing.
pub unsafe fn plan_made(_stmt: *mut pg_sys::PlannedStmt) {}

pub fn wanted(_eflags: i32) -> bool {
    false
}

pub fn executor_started(_desc: *mut pg_sys::QueryDesc) {}

pub fn release_database(_database: pg_sys::Oid, _forced: bool) {}

pub fn transaction_ended() {}

pub fn mark_closing(_database: pg_sys::Oid) {}

pub fn may_serve(_database: pg_sys::Oid) -> bool {
    false
}

pub fn unmark_closing() {}

pub fn subtransaction_aborted(_subid: pg_sys::SubTransactionId) {}

pub fn workers() -> Vec<WorkerRow> {
    Vec::new()
}

pub fn fallbacks() -> Vec<(pg_sys::Oid, &'static str, i64)> {
    Vec::new()
}

pub fn counters() -> Vec<(&'static str, i64)> {
    Vec::new()
}
pub fn prestart() {}
