//! The pool's settings (docs/configuration.md). Registered on every major, so that a
//! configuration carries over between majors; read only where the pool runs.

use crate::cpu;
use crate::gucs::Setting;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Largest accepted `pg_stride.pool_size`: the pool's slots in shared memory, shared by
/// every database.
const MAX_POOL_SIZE: i32 = 32;
static POOL_SIZE: Setting<i32> = Setting::new(GucSetting::<i32>::new(-1));
static POOL_IDLE_TIMEOUT_MS: Setting<i32> = Setting::new(GucSetting::<i32>::new(300_000));

/// Pool workers a database gets: `pg_stride.pool_size`, or the CPU slots plus 2 when it
/// is -1 (docs/design.md §6), never more than the pool has.
pub fn pool_size() -> usize {
    let size = match POOL_SIZE.get() {
        -1 => cpu::effective_cpu_slots().saturating_add(2),
        n => n.max(0) as u32,
    };
    size.min(MAX_POOL_SIZE as u32) as usize
}

/// `pg_stride.pool_idle_timeout` in ms; 0 keeps idle workers.
pub fn idle_timeout_ms() -> i32 {
    POOL_IDLE_TIMEOUT_MS.get()
}

/// Registers the pool's settings. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_stride.pool_size",
        c"Pool workers per database for parallel_mode = pool; -1 for the CPU slots plus 2.",
        c"The extra workers let fragments wait at yield points while others run. The pool stays within caps derived from max_worker_processes and max_parallel_workers.",
        POOL_SIZE.inner(),
        -1,
        MAX_POOL_SIZE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.pool_idle_timeout",
        c"A pool worker that served no fragment for this long exits; 0 keeps it.",
        c"",
        POOL_IDLE_TIMEOUT_MS.inner(),
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
}
