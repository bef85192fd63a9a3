//! pg_stride: query scheduling and admission control for PostgreSQL.
//!
//! `_PG_init` wires the parts together. Loaded through `shared_preload_libraries`, it
//! registers the GUCs, asks for the shared-memory region, registers the scheduler
//! worker and installs the hooks. Loaded any other way (`LOAD`, or a function call
//! before the library was preloaded) it warns and installs nothing, so every statement
//! runs exactly as without pg_stride (docs/design.md §4 rule 7).

use pgrx::prelude::*;

// Layers (docs/design.md §7; `scripts/layers` checks that each module uses only layers
// below its own): 1 helpers, 2 settings, 3 shared-memory layout, 4 the machine (NUMA
// topology and per-node accounting), 5 mechanisms, 6 coordination, 7 processes and SQL
// functions, 8 hooks and _PG_init.
mod backend_local;
mod os;
mod pg;
mod plan_tree;

mod gucs;
mod plan_costs;

mod shmem;

mod numa;

mod admission;
mod cpu;
mod groups;
mod monitoring;
mod parallel;

mod config;
// The pool needs parallel.c's private definitions, checked for these majors only.
#[cfg(any(feature = "pg15", feature = "pg17", feature = "pg18"))]
mod pool;
#[cfg(not(any(feature = "pg15", feature = "pg17", feature = "pg18")))]
#[path = "pool/unsupported.rs"]
mod pool;
mod statements;

mod group_admin;
mod views;
mod worker;

mod executor;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pg_upgrade's server runs no queries worth scheduling and must not start workers
    // (pg_cron does the same).
    // SAFETY: plain read of a global set before libraries are loaded.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return;
    }
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
    // An ERROR that pgrx turns into a Rust panic and back carries a Rust backtrace in
    // its DETAIL when backtraces are enabled in the server's environment; errors must
    // look the same whatever that environment is. RUST_LIB_BACKTRACE governs captured
    // backtraces only, not the default panic hook's output.
    // SAFETY (set_var): the postmaster is single-threaded while it loads libraries, and
    // every process forked from it inherits the setting.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    // Every setting, each module registering its own; then the prefix is reserved.
    gucs::register();
    admission::register_settings();
    cpu::register_settings();
    numa::register_settings();
    groups::register_settings();
    parallel::register_settings();
    pool::register_settings();
    statements::register_settings();
    worker::register_settings();
    monitoring::register_settings();
    gucs::reserve_prefix();
    // Everything pg_stride hooks into, each hook chained to the one installed before it:
    // shared memory (shmem_request_hook, shmem_startup_hook: pg_stride's regions and the
    // pool's block), the pool's custom scans, the three background workers, and the planner,
    // executor and utility hooks with the transaction callbacks, the relation and catalog
    // cache callbacks of statements and monitoring; the object-access hook
    // only while a DROP DATABASE runs, and the resource-release callback that ends a
    // failed statement from a backend's first admitted statement on (statements::ending::claim).
    shmem::install(pool::SHMEM_BLOCKS, || shmem::Initial {
        max_active_queries: admission::max_active_queries(),
        memory_budget_kb: admission::memory_budget_kb(),
        cpu_slots: cpu::effective_cpu_slots(),
        decay: cpu::decay_params(),
        tuner: cpu::tuner_on(),
    });
    pool::install();
    statements::install();
    monitoring::install();
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
