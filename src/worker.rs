//! The `pg_stride scheduler` background worker (DESIGN.md §2).
//!
//! One static worker per server. It publishes the CPU-slot count after configuration
//! reloads and reclaims the shared entries of processes that are gone (DESIGN.md §4
//! rule 8). Later parts add the watchdog, the concurrency hint and the tuner here.

use crate::{gucs, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Name and `backend_type` of the worker, as `pg_stat_activity` shows it.
pub const WORKER_NAME: &str = "pg_stride scheduler";

/// How often the worker sweeps the shared entries.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Registers the static worker. Called from `_PG_init` while preloading.
pub fn register() {
    BackgroundWorkerBuilder::new(WORKER_NAME)
        .set_type(WORKER_NAME)
        .set_library("pg_stride")
        .set_function("pg_stride_scheduler_main")
        .enable_spi_access()
        // Read-only queries on a hot standby are scheduled too, so start as soon as
        // the server accepts connections, not only after recovery.
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_stride_scheduler_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // Connecting to no database gives the worker a pg_stat_activity row (with its
    // backend_type) without tying it to one database.
    BackgroundWorker::connect_worker_to_spi(None, None);
    let Some(shared) = shmem::shared() else {
        return;
    };
    // SAFETY: plain read of a process-local global.
    shared
        .scheduler_pid
        .store(unsafe { pg_sys::MyProcPid }, Ordering::Release);
    while BackgroundWorker::wait_latch(Some(SWEEP_INTERVAL)) {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background worker to reload its config.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            shared
                .cpu_slots
                .store(gucs::effective_cpu_slots(), Ordering::Release);
        }
        reclaim_entries(shared);
    }
    shared.scheduler_pid.store(0, Ordering::Release);
}

/// Frees entries whose process is gone. Only the pid is cleared (with a compare-and-swap,
/// so an entry a new process has just claimed is left alone); counters are reset by the
/// next process that claims the entry, and readers ignore entries that are not live.
fn reclaim_entries(shared: &shmem::Shared) {
    for (procno, entry) in shared.procs().iter().enumerate() {
        let pid = entry.pid.load(Ordering::Acquire);
        if pid != 0 && !shared.is_live(procno) {
            let _ = entry
                .pid
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}
