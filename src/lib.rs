//! pg_stride: query scheduling and admission control for PostgreSQL.
//!
//! `_PG_init` wires the parts together. Loaded through `shared_preload_libraries`, it
//! registers the GUCs, asks for the shared-memory region, registers the scheduler
//! worker and installs the hooks. Loaded any other way (`LOAD`, or a function call
//! before the library was preloaded) it warns and installs nothing, so every statement
//! runs exactly as without pg_stride (DESIGN.md §4 rule 7).

use pgrx::prelude::*;

mod admission;
mod backend_local;
mod cpu;
mod executor;
mod group_admin;
mod groups;
mod gucs;
mod parallel;
mod pg_nothrow;
mod shmem;
mod statements;
mod views;
mod worker;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: plain read of a global PostgreSQL sets while loading preload libraries.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_stride is not active: it must be loaded via \"shared_preload_libraries\"",
            "_PG_init",
        )
        .set_hint(
            "Add pg_stride to shared_preload_libraries in postgresql.conf and restart the server.",
        )
        .report(PgLogLevel::WARNING);
        return;
    }
    gucs::register();
    shmem::install();
    statements::install();
    groups::install();
    worker::register();
    executor::install();
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

/// Required by `cargo pgrx test`: settings for the test server.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_stride'"]
    }
}
