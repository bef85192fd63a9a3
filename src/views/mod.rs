//! SQL functions behind pg_stride's views (docs/design.md §5). Each view is a plain SQL view
//! over a set-returning function that reads live shared memory.
//!
//! The views' functions live in one file per view family; `pg_stride` below creates the
//! schema they name (`schema = "pg_stride"`) and holds the functions of no family.

use pgrx::prelude::*;

// PostgreSQL reserves schema names starting with "pg_" for itself; a superuser may
// create one with allow_system_table_mods, which the extension script turns on just for
// the CREATE SCHEMA that pgrx emits next and resets at the end (`finalize` below).
extension_sql!(
    "SET LOCAL allow_system_table_mods = on;",
    name = "allow_pg_schema_name",
    bootstrap
);
extension_sql!(
    "RESET allow_system_table_mods;",
    name = "reset_system_table_mods",
    finalize
);

mod activity;
mod groups;
mod numa;
mod pool;
mod queue_times;
mod rules;
mod scheduler;
mod shared_access;
mod statements;
mod tuner;

#[pg_schema]
mod pg_stride {
    use super::shared_access::require_shared;
    use pgrx::prelude::*;
    use std::sync::atomic::Ordering;

    /// The version of the loaded pg_stride library.
    #[pg_extern(parallel_safe)]
    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    /// Zeroes the cumulative counters of every group, the per-node CPU times and the
    /// counts of `pg_stride.prediction_quality`.
    #[pg_extern(volatile, parallel_unsafe)]
    fn reset_stats() {
        let shared = require_shared();
        for (slot, _) in shared.groups.groups() {
            shared.groups.counters(slot).reset();
        }
        for entry in shared.procs() {
            entry.admitted_pending.store(0, Ordering::Relaxed);
        }
        shared.nodes.reset();
        shared.histories.reset_quality();
    }
}
