//! SQL functions behind pg_stride's views (DESIGN.md §5). Each view is a plain SQL view
//! over a set-returning function that reads live shared memory.

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

#[pg_schema]
mod pg_stride {
    use crate::{gucs, shmem};
    use pgrx::pg_sys::panic::ErrorReport;
    use pgrx::prelude::*;
    use std::sync::atomic::Ordering;

    /// The version of the loaded pg_stride library.
    #[pg_extern(parallel_safe)]
    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    /// One row describing the scheduler; the `pg_stride.scheduler` view.
    #[pg_extern(parallel_restricted)]
    fn scheduler_state() -> TableIterator<
        'static,
        (
            name!(cpu_slots, i32),
            name!(running, i64),
            name!(queued, i64),
            name!(enabled, bool),
            name!(scheduler_pid, Option<i32>),
        ),
    > {
        let shared = require_shared();
        let (mut running, mut queued) = (0i64, 0i64);
        for (procno, entry) in shared.procs().iter().enumerate() {
            if shared.is_live(procno) {
                running += i64::from(entry.running.load(Ordering::Acquire));
                queued += i64::from(entry.queued.load(Ordering::Acquire));
            }
        }
        let scheduler_pid = match shared.scheduler_pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        };
        TableIterator::once((
            shared.cpu_slots.load(Ordering::Acquire) as i32,
            running,
            queued,
            gucs::ENABLED.get(),
            scheduler_pid,
        ))
    }

    /// The shared region, or an error telling the DBA how to load pg_stride properly.
    fn require_shared() -> &'static shmem::Shared {
        match shmem::shared() {
            Some(shared) => shared,
            None => {
                ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "pg_stride must be loaded via \"shared_preload_libraries\"",
                    "pg_stride.scheduler_state",
                )
                .set_hint("Add pg_stride to shared_preload_libraries in postgresql.conf and restart the server.")
                .report(PgLogLevel::ERROR);
                unreachable!("an ERROR report does not return")
            }
        }
    }
}

extension_sql!(
    r#"
CREATE VIEW pg_stride.scheduler AS
    SELECT * FROM pg_stride.scheduler_state();
COMMENT ON VIEW pg_stride.scheduler IS
    'pg_stride scheduler: CPU slots, running and queued statements, whether enabled';
GRANT USAGE ON SCHEMA pg_stride TO PUBLIC;
GRANT SELECT ON pg_stride.scheduler TO PUBLIC;
"#,
    name = "scheduler_view",
    requires = [pg_stride::scheduler_state],
);
