//! Pooled parallel execution (docs/design.md §6).
//!
//! With `pg_stride.parallel_mode = pool`, the Gathers of a client backend's statements
//! run their parallel part in persistent per-database pool workers (dynamic background
//! workers, `backend_type` "pg_stride pool") instead of freshly forked parallel workers;
//! a Gather the pool cannot take runs with PostgreSQL's own workers, and the reason is
//! counted (the `pg_stride.pool_fallbacks` view).
//!
//! * [`shared`]: the slots and counters in shared memory;
//! * [`worker`]: the pool worker (restores a fragment's state, runs it, undoes it);
//! * [`worker_settings`]: which settings a pool worker has in force: its own, or those
//!   of the leader it last served;
//! * [`leader`]: the Gather's ExecProcNode, its rounds and its tuples;
//! * [`tickets`]: the leader's side of the hand-off: posting tickets, reading the
//!   workers' queues, ending a round on every path;
//! * [`failure_watch`]: a worker's ERROR reaches the leader while it runs its own part
//!   of the round;
//! * [`gather_merge`]: a Gather Merge's merged reading of the same queues;
//! * [`gathers`]: the pool's state of each Gather (Merge) of the statement;
//! * [`lifecycle`]: starting pool workers, their caps, and ending them for commands
//!   that need their database to themselves;
//! * [`identity`]: the leader's identity in a pool worker, and back;
//! * [`compat`]: whether this server can run the pool at all;
//! * [`stride_gather`]: the custom scan that stands for a Gather in plans made for the
//!   pool, so that EXPLAIN shows it;
//! * [`ffi`]: parallel.c's private definitions, per major, and unbound functions;
//! * [`port`]: PostgreSQL's inline functions and macros, in Rust.
//!
//! PostgreSQL 15, 17 and 18: the private definitions are checked per major; on the
//! others `pool` behaves as `native`.

mod compat;
mod failure_watch;
mod ffi;
mod gather_merge;
mod gathers;
mod identity;
mod leader;
mod lifecycle;
mod messages;
mod port;
mod settings;
mod shared;
mod stride_gather;
mod tickets;
mod worker;
mod worker_row;
mod worker_settings;

pub use worker_row::WorkerRow;

use crate::{gucs, parallel, pg};
use pgrx::pg_sys;

pub use lifecycle::{
    mark_closing, may_serve, prestart, publish_server_settings, release_database,
    subtransaction_aborted, unmark_closing,
};
pub use settings::register_settings;

/// The backend's transaction ended: the pool forgets its Gathers, and the closing marks
/// of the database commands this backend ran.
pub fn transaction_ended() {
    gathers::transaction_ended();
    lifecycle::unmark_closing();
}
use shared::{State, COUNTER_NAMES, FALLBACK_NAMES};
use std::sync::atomic::Ordering;

/// The pool's shared memory, which `_PG_init` gives to `shmem::install`.
pub const SHMEM_BLOCKS: &[crate::shmem::Block] = &[shared::SHMEM_BLOCK];

/// Dynamic shared memory set aside at start for a server started in pool mode whose
/// configuration leaves `min_dynamic_shared_memory` alone. A Gather's parallel context
/// is then carved from memory every process has mapped, instead of a new segment that
/// the leader creates and each pool worker maps and unmaps: that is most of what a
/// pooled Gather costs beyond its work. A context that does not fit gets a segment of
/// its own, as without it.
const DYNAMIC_SHARED_MEMORY: &std::ffi::CStr = c"8MB";

/// Registers the pool's custom scans and, in pool mode, its default for
/// `min_dynamic_shared_memory`. Called from `_PG_init`, after the settings.
pub fn install() {
    stride_gather::register();
    if parallel::pool_mode() {
        pg::set_dynamic_default(c"min_dynamic_shared_memory", DYNAMIC_SHARED_MEMORY);
    }
}

/// Whether the plans this backend makes now are made for the pool: their Gathers
/// become Stride Gathers. Cannot panic: asked outside pgrx's boundary for every plan.
pub fn plans_for_pool() -> bool {
    parallel::pool_mode()
        && gucs::enabled()
        && shared::shared().is_some()
        && !pg::is_parallel_worker()
        && pg::is_client_backend()
}

/// Puts a Stride Gather in place of each Gather and Gather Merge of the plan the
/// planner has just made.
///
/// # Safety
/// `stmt` is that plan, and the planner's memory context is the current one.
pub unsafe fn plan_made(stmt: *mut pg_sys::PlannedStmt) {
    // SAFETY: the caller's promise.
    unsafe { stride_gather::replace_gathers(stmt) }
}

/// Whether the statement ExecutorStart just set up may have Gathers for the pool.
/// Cannot panic: asked outside pgrx's boundary for every statement.
pub fn wanted(eflags: i32) -> bool {
    plans_for_pool() && eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0
}

/// See [`leader::executor_started`].
pub fn executor_started(desc: *mut pg_sys::QueryDesc) {
    leader::executor_started(desc);
}

/// The pool workers there are (started, or being started).
pub fn workers() -> Vec<WorkerRow> {
    let Some(pool) = shared::shared() else {
        return Vec::new();
    };
    pool.slots
        .iter()
        .filter_map(|slot| {
            let (_, state) = slot.load();
            let state = match state {
                State::Free => return None,
                State::Retiring => "retiring",
                _ if slot.retire.load(Ordering::Acquire) => "retiring",
                State::Starting | State::Connecting => "starting",
                State::Idle | State::Reserved => "idle",
                State::Posted | State::Running | State::Cancel | State::Restoring => "busy",
            };
            let fragments = slot.fragments.load(Ordering::Relaxed) as i64;
            let leader = slot.leader_pid.load(Ordering::Relaxed);
            Some(WorkerRow {
                pid: slot.pid.load(Ordering::Acquire),
                database: slot.database.load(Ordering::Acquire).into(),
                state,
                leader_pid: (leader != 0).then_some(leader),
                fragments,
                errors: slot.errors.load(Ordering::Relaxed) as i64,
                last_setup_us: (fragments > 0)
                    .then(|| slot.last_setup_ns.load(Ordering::Relaxed) as f64 / 1e3),
                serves: slot.served[0].load(Ordering::Acquire).into(),
            })
        })
        .collect()
}

/// Gathers that ran without the pool, by database (0: databases beyond the counted
/// ones) and reason; reasons never seen are left out.
pub fn fallbacks() -> Vec<(pg_sys::Oid, &'static str, i64)> {
    let Some(pool) = shared::shared() else {
        return Vec::new();
    };
    pool.fallbacks
        .iter()
        .chain(std::iter::once(&pool.other_databases))
        .flat_map(|entry| {
            let database = entry.database.load(Ordering::Acquire);
            FALLBACK_NAMES
                .iter()
                .zip(&entry.counts)
                .map(move |(name, n)| (database.into(), *name, n.load(Ordering::Relaxed) as i64))
        })
        .filter(|&(_, _, n)| n > 0)
        .collect()
}

/// The counters, by name.
pub fn counters() -> Vec<(&'static str, i64)> {
    let Some(pool) = shared::shared() else {
        return Vec::new();
    };
    COUNTER_NAMES
        .iter()
        .zip(pool.counters.iter())
        .map(|(n, c)| (*n, c.load(std::sync::atomic::Ordering::Relaxed) as i64))
        .collect()
}
