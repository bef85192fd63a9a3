//! The `pg_stride scheduler` background worker (DESIGN.md §2).
//!
//! One static worker per server. It loads the resource groups from
//! `pg_stride.database` at start and whenever they change, applies configuration
//! reloads, runs the CPU watchdog (`pg_stride.watchdog_interval`), samples the
//! concurrency hint (`pg_stride.hint_interval`), reclaims the shared entries of
//! processes that are gone (DESIGN.md §4 rule 8) and admits queued backends that block
//! admitted ones (rule 5).

use crate::{admission, cpu, groups, gucs, shmem};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys;
use pgrx::spi::Spi;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Name and `backend_type` of the worker, as `pg_stat_activity` shows it.
pub const WORKER_NAME: &str = "pg_stride scheduler";

/// How often the worker sweeps the shared entries and looks for queued backends that
/// block admitted ones.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// The worker's periodic tasks and when each is due next.
struct Timers {
    watchdog: Instant,
    hint: Instant,
    sweep: Instant,
}

impl Timers {
    /// Whether the task due at `*due` is due; if so, schedules its next run `every` later.
    fn take(due: &mut Instant, every: Duration) -> bool {
        let now = Instant::now();
        if now < *due {
            return false;
        }
        *due = now + every;
        true
    }

    /// Time until the next task is due.
    fn sleep(&self) -> Duration {
        let next = self.watchdog.min(self.hint).min(self.sweep);
        next.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }
}

fn interval_ms(setting: &pgrx::guc::GucSetting<i32>) -> Duration {
    Duration::from_millis(setting.get().max(1) as u64)
}

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
    let mut blocked_before = Vec::new();
    let now = Instant::now();
    let mut timers = Timers {
        watchdog: now,
        hint: now,
        sweep: now,
    };
    while BackgroundWorker::wait_latch(Some(timers.sleep())) {
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background worker to reload its config.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
            admission::apply_limits(shared);
            if let Some(sched) = shared.sched() {
                cpu::apply_settings(sched);
            }
        }
        if shared.groups.pending_reload().is_some() {
            reload_groups(shared);
        }
        if Timers::take(
            &mut timers.watchdog,
            interval_ms(&gucs::WATCHDOG_INTERVAL_MS),
        ) {
            cpu::watchdog(shared, &mut blocked_before);
        }
        if Timers::take(&mut timers.hint, interval_ms(&gucs::HINT_INTERVAL_MS)) {
            if let Some(sched) = shared.sched() {
                sched.sample_hint(gucs::HINT_ALPHA.get());
            }
        }
        if Timers::take(&mut timers.sweep, SWEEP_INTERVAL) {
            reclaim_entries(shared);
            cpu::reclaim(shared);
            admit_lock_holders(shared);
        }
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
        groups::reload(&shared.groups, shared, true)
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

/// DESIGN.md §4 rule 5: a queued backend may hold locks (taken by its transaction's
/// earlier statements, or by its own statement while it was planned) that an admitted
/// backend waits for; if the admitted ones cannot finish, the queued one would never be
/// admitted. Each such queued backend is admitted ahead of its turn.
fn admit_lock_holders(shared: &shmem::Shared) {
    if shared.admission.waiting() == 0 {
        return;
    }
    let mut running = Vec::new();
    let mut queued = Vec::new();
    for (procno, entry) in shared.procs().iter().enumerate() {
        if !shared.is_live(procno) {
            continue;
        }
        let pid = entry.pid.load(Ordering::Acquire);
        if entry.queued.load(Ordering::Acquire) > 0 {
            queued.push((pid, procno));
        } else if entry.running.load(Ordering::Acquire) > 0 {
            running.push(pid);
        }
    }
    if queued.is_empty() || running.is_empty() {
        return;
    }
    let queued_pids: Vec<i32> = queued.iter().map(|&(pid, _)| pid).collect();
    let blockers: Vec<(i32, i32)> = BackgroundWorker::transaction(|| {
        Spi::connect(|client| {
            let args = [running.clone().into(), queued_pids.clone().into()];
            let rows = client.select(
                "SELECT DISTINCT b, r FROM unnest($1::int4[]) AS r, \
                        unnest(pg_catalog.pg_blocking_pids(r)) AS b \
                  WHERE b = ANY ($2::int4[])",
                None,
                &args,
            )?;
            let mut found = Vec::new();
            for row in rows {
                if let (Some(b), Some(r)) = (row.get::<i32>(1)?, row.get::<i32>(2)?) {
                    found.push((b, r));
                }
            }
            Ok::<_, pgrx::spi::SpiError>(found)
        })
        .unwrap_or_else(|e| {
            pgrx::warning!("pg_stride: cannot look for queued backends that block others: {e}");
            Vec::new()
        })
    });
    for (blocker, waiter) in blockers {
        if let Some(&(_, procno)) = queued.iter().find(|&&(pid, _)| pid == blocker) {
            if admission::force_admit(shared, procno) {
                pgrx::log!(
                    "pg_stride: admitted process {blocker} ahead of its turn: it holds a lock that admitted process {waiter} waits for"
                );
            }
        }
    }
}
