//! Admission control at ExecutorStart (DESIGN.md §1, §4 rules 3 and 5).
//!
//! The decisions (limits, stride order between groups, arrival order inside a group) are
//! `pg_stride_sched::admission`; this module keeps that state in shared memory — the
//! counts as atomics, the queue under the admission LWLock — makes a backend wait on its
//! latch while its statement is queued, wakes the backends that an ending statement lets
//! in, and keeps the statistics of `pg_stride.groups`. While the limits have room and
//! nobody waits, a statement is admitted and released without the lock.
//!
//! A queued backend waits in a latch loop that serves cancel, `statement_timeout`,
//! `pg_terminate_backend` (CHECK_FOR_INTERRUPTS) and postmaster death
//! (WL_EXIT_ON_PM_DEATH); `pg_stride.queue_timeout` ends the wait with an error. However
//! the wait ends, the backend leaves the queue, and an admission that raced with the end
//! of the wait is given back, so nothing is held that the statement does not run with.

use crate::groups::GroupCounters;
use crate::{gucs, pg_nothrow, shmem};
use pg_stride_sched::admission::Arrival;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Longest single sleep of a queued backend; it re-checks its state after each.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Sets the latch of process `procno`, to wake it from its wait.
fn wake(procno: usize) {
    // SAFETY: every procno handed out by the admission state names a PGPROC of
    // ProcGlobal->allProcs, which lives as long as the server; SetLatch may be called on
    // another process's latch.
    unsafe { pg_sys::SetLatch(&raw mut (*(*pg_sys::ProcGlobal).allProcs.add(procno)).procLatch) };
}

fn now_timestamp() -> i64 {
    // SAFETY: plain call; returns the current time as a TimestampTz.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// Admits a statement of this backend in group slot `group`, waiting for its turn when
/// the limits are reached. Returns normally once admitted; raises an ERROR when the wait
/// is cancelled, times out or the backend is terminated.
pub fn admit(shared: &shmem::Shared, group: usize) {
    let Some(procno) = shmem::my_procno() else {
        return;
    };
    let Some(entry) = shared.my_entry() else {
        return;
    };
    let counters = shared.groups.counters(group);
    let arrival = if shared.admission.try_enter(group) {
        Arrival::Admitted
    } else {
        shared.with_admission(|queue, waiters| {
            queue.arrive(&shared.admission, waiters, procno, group, wake)
        })
    };
    if arrival == Arrival::Admitted {
        counters.record_admission(Duration::ZERO);
        entry
            .admitted_at
            .store(pg_nothrow::statement_start_timestamp(), Ordering::Relaxed);
        return;
    }

    let started = Instant::now();
    entry
        .queued_since
        .store(pg_nothrow::statement_start_timestamp(), Ordering::Relaxed);
    entry.queued.fetch_add(1, Ordering::AcqRel);
    let outcome = PgTryBuilder::new(|| wait_for_turn(shared, procno, started))
        .catch_others(|error| {
            leave_queue(shared, procno);
            error.rethrow()
        })
        .finally(|| {
            entry.queued.fetch_sub(1, Ordering::AcqRel);
        })
        .execute();
    match outcome {
        Ok(()) => {
            counters.record_admission(started.elapsed());
            entry.admitted_at.store(now_timestamp(), Ordering::Relaxed);
        }
        Err(()) => {
            counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let group_name = shared.groups.name_of(group);
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
                format!(
                    "canceling statement after waiting {} ms for admission in resource group \"{group_name}\"",
                    gucs::QUEUE_TIMEOUT_MS.get()
                ),
                "pg_stride admission",
            )
            .set_detail("The wait reached pg_stride.queue_timeout.")
            .set_hint(format!(
                "Retry later, or raise pg_stride.queue_timeout, pg_stride.max_active_queries or the max_concurrency of group \"{}\".",
                group_name
            ))
            .report(PgLogLevel::ERROR);
        }
    }
}

/// Waits until this backend's queued statement is admitted. Returns `Err` when
/// `pg_stride.queue_timeout` ran out first (the backend has then left the queue).
fn wait_for_turn(shared: &shmem::Shared, procno: usize, started: Instant) -> Result<(), ()> {
    loop {
        if shared.with_admission(|queue, waiters| queue.take_admitted(waiters, procno)) {
            return Ok(());
        }
        let timeout = match gucs::QUEUE_TIMEOUT_MS.get() {
            0 => None,
            ms => Some(Duration::from_millis(ms as u64)),
        };
        let waited = started.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            let still_queued = shared.with_admission(|queue, waiters| {
                queue.withdraw(&shared.admission, waiters, procno)
            });
            // Admitted at the last moment: take it rather than fail.
            return if still_queued { Err(()) } else { Ok(()) };
        }
        let sleep = timeout.map_or(MAX_SLEEP, |t| (t - waited).min(MAX_SLEEP));
        // SAFETY: the standard latch wait of a backend; MyLatch is this process's latch.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                sleep.as_millis().max(1) as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// Takes process `procno` out of the queue, after an error ended its wait or when it
/// exits (a FATAL error, such as pg_terminate_backend's, exits without unwinding). An
/// admission granted meanwhile is given back at once, so that the next waiter gets it.
pub fn leave_queue(shared: &shmem::Shared, procno: usize) {
    shared.with_admission(|queue, waiters| {
        let group = waiters[procno].group as usize;
        if !queue.withdraw(&shared.admission, waiters, procno) && shared.admission.leave(group) {
            queue.dispatch(&shared.admission, waiters, wake);
        }
    });
}

/// An admitted statement of group slot `group` ended: lets the next waiters in.
pub fn release(shared: &shmem::Shared, group: usize) {
    if shared.admission.leave(group) {
        shared.with_admission(|queue, waiters| queue.dispatch(&shared.admission, waiters, wake));
    }
}

/// Admits process `procno` ahead of its turn if it is queued (the watchdog's way out of
/// a wait-for cycle through admission). Returns whether it did.
pub fn force_admit(shared: &shmem::Shared, procno: usize) -> bool {
    let admitted = shared
        .with_admission(|queue, waiters| queue.force_admit(&shared.admission, waiters, procno));
    if admitted {
        wake(procno);
    }
    admitted
}

/// Brings the admission limits and the groups' CPU weights in line with the settings
/// (after a reload or a group change) and admits whoever the new limits let in.
pub fn apply_limits(shared: &shmem::Shared) {
    let groups = shared.groups.groups();
    let max_active = gucs::MAX_ACTIVE_QUERIES.get() as u32;
    let sched = shared.sched();
    // The admission lock is also the CPU scheduler's registration lock.
    shared.with_admission(|queue, waiters| {
        shared.admission.set_max_active(max_active);
        for (slot, group) in &groups {
            queue.configure_group(
                &shared.admission,
                *slot,
                group.settings.weight as u32,
                group.settings.max_concurrency as u32,
            );
            if let Some(sched) = sched {
                crate::cpu::configure_group(sched, *slot, &group.settings);
            }
        }
        queue.dispatch(&shared.admission, waiters, wake);
    });
}

impl GroupCounters {
    /// Counts one admission after a wait of `waited` (bucket 0 of the histogram is
    /// derived, see [`crate::groups::HISTOGRAM_BUCKETS`]).
    fn record_admission(&self, waited: Duration) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        let us = waited.as_micros().min(u64::MAX as u128) as u64;
        if us > 0 {
            self.queue_time_us.fetch_add(us, Ordering::Relaxed);
            self.queue_histogram[crate::groups::histogram_bucket(us)]
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}
