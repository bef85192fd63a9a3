//! pg_stride's configuration parameters (GUCs), registered from `_PG_init`.
//!
//! Names, units and ranges follow DESIGN.md §5 and PostgreSQL's own conventions: times
//! carry a unit, `0` means "automatic" where PostgreSQL uses that idiom, and settings
//! that let a session take more than its share are superuser-only (`PGC_SUSET`), so a
//! role's values come from `ALTER ROLE … SET` / `ALTER DATABASE … SET`.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

/// Largest accepted `pg_stride.cpu_slots`; far above any core count PostgreSQL runs on.
pub const MAX_CPU_SLOTS: i32 = 4096;

pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static CPU_SLOTS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static MAX_ACTIVE_QUERIES: GucSetting<i32> = GucSetting::<i32>::new(128);
pub static SLICE_MS: GucSetting<f64> = GucSetting::<f64>::new(2.0);
pub static GROUP: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"default"));

/// Registers every GUC. Called once, from `_PG_init` while
/// `shared_preload_libraries` is being processed (some are `PGC_POSTMASTER`-like in
/// spirit and must exist before the shared-memory size is computed).
pub fn register() {
    GucRegistry::define_bool_guc(
        c"pg_stride.enabled",
        c"Enables pg_stride's admission control and CPU scheduling.",
        c"When off, every pg_stride hook passes straight through to the previous one.",
        &ENABLED,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.cpu_slots",
        c"Number of processes that may execute scheduled query work at once.",
        c"0 means the number of CPUs this server may use.",
        &CPU_SLOTS,
        0,
        MAX_CPU_SLOTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.max_active_queries",
        c"Maximum number of admitted top-level statements; further ones wait.",
        c"",
        &MAX_ACTIVE_QUERIES,
        1,
        pgrx::pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"pg_stride.slice",
        c"Target CPU time a process runs between two scheduling checks.",
        c"Yield points are placed so that the work between two checks takes about this long.",
        &SLICE_MS,
        0.1,
        1000.0,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_string_guc(
        c"pg_stride.group",
        c"Resource group whose share and limits this session's statements get.",
        c"Settable by superusers and through ALTER ROLE/DATABASE ... SET.",
        &GROUP,
        GucContext::Suset,
        GucFlags::IS_NAME,
    );
}

/// CPU slots in effect: `pg_stride.cpu_slots`, or the CPUs available to this server
/// when it is 0 (DESIGN.md §1: one slot per core, wagner2021 §2).
pub fn effective_cpu_slots() -> u32 {
    match CPU_SLOTS.get() {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        n => n as u32,
    }
}
