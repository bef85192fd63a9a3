//! The `pg_stride scheduler` background worker (DESIGN.md §2).
//!
//! One static worker per server. It loads the resource groups from
//! `pg_stride.database` at start and whenever they change, publishes the CPU-slot count
//! after configuration reloads, and reclaims the shared entries of processes that are
//! gone (DESIGN.md §4 rule 8). Later parts add the watchdog, the concurrency hint and the tuner here.

use crate::{groups, gucs, shmem};
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
    // The worker reads the resource groups from pg_stride.database (as pg_cron reads its
    // jobs from cron.database_name); connecting also gives it a pg_stat_activity row.
    BackgroundWorker::connect_worker_to_spi(Some(&gucs::database_name()), None);
    let Some(shared) = shmem::shared() else {
        return;
    };
    // SAFETY: plain read of a process-local global.
    shared
        .scheduler_pid
        .store(unsafe { pg_sys::MyProcPid }, Ordering::Release);
    shared.groups.set_worker(shmem::my_procno());
    reload_groups(shared);
    while BackgroundWorker::wait_latch(Some(SWEEP_INTERVAL)) {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background worker to reload its config.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            shared
                .cpu_slots
                .store(gucs::effective_cpu_slots(), Ordering::Release);
        }
        if shared.groups.pending_reload().is_some() {
            reload_groups(shared);
        }
        reclaim_entries(shared);
    }
    shared.groups.set_worker(None);
    shared.scheduler_pid.store(0, Ordering::Release);
}

/// Reads the groups table into the directory, answering every request made before the
/// read started.
fn reload_groups(shared: &shmem::Shared) {
    let request = shared.groups.pending_reload();
    // The directory is only written under its lock; an error while reading the table
    // leaves it as it was.
    BackgroundWorker::transaction(std::panic::AssertUnwindSafe(|| {
        groups::reload(&shared.groups, shared)
    }));
    if let Some(request) = request {
        shared.groups.reload_done(request);
    }
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
