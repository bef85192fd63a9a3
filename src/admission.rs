//! Admission control at ExecutorStart (docs/design.md §1, §4 rules 3, 5 and 12).
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
//!
//! A statement whose admission was lent takes it back before it goes on ([`take_back`],
//! at ExecutorRun and at yield points), through the same queue when the limits have no
//! room; the limits are crossed only by [`force_admit`] and by lending a lock wait that
//! only a client can end, both counted per group.

use crate::gucs::Setting;
use crate::pg::{self, set_latch as wake};
use crate::shmem::{self, Group, ProcEntry};
use pg_stride_sched::admission::{Arrival, Reclaim};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Admits a statement of this backend in group slot `group`, waiting for its turn when
/// the limits are reached, or until `need_kb` of working memory fits in the memory
/// budgets (`pg_stride_sched::memory`; 0 = it reserves none). Returns once admitted
/// (`false`: a process without a PGPROC, not admitted); the admission is the process's
/// lease until [`release`], the memory its reservation until [`release_memory`]. Raises
/// an ERROR when the wait is cancelled, times out or the backend is terminated, or when
/// the statement needs more memory than a budget and its group rejects such statements.
/// The caller holds no other admission: the lease is free or idle.
// Out of line, so that bench/instructions.py can count admission's instructions.
#[inline(never)]
pub fn admit(shared: &shmem::Shared, entry: &ProcEntry, group: usize, need_kb: u64) -> bool {
    let Some(procno) = pg::my_procno() else {
        return false;
    };
    // The lease and the lock-free path admit without reserving memory.
    if need_kb == 0 && entry.lease.resume(group) {
        admitted_at_once(entry);
        return true;
    }
    admit_without_lease(shared, entry, procno, group, need_kb);
    true
}

/// [`admit`] when the process's idle lease cannot admit the statement: out of line, so
/// that the lease's path sets up no more than it uses.
#[inline(never)]
fn admit_without_lease(
    shared: &shmem::Shared,
    entry: &ProcEntry,
    procno: usize,
    group: usize,
    need_kb: u64,
) {
    // A lease of another group is of no use to this statement.
    give_back_lease(shared, entry);
    if need_kb == 0 && shared.admission.try_enter(group) {
        admitted_at_once(entry);
        entry.lease.hold(group);
        return;
    }
    let settings = shared.groups.settings_of(group).unwrap_or_default();
    if need_kb > 0 && settings.reject_oversized {
        reject_if_oversized(shared, group, need_kb);
    }
    let bounds = Bounds {
        group: settings.max_queued.unwrap_or(0).max(0) as u32,
        server: MAX_QUEUED.get().max(0) as u32,
    };
    match arrive(shared, procno, group, need_kb, Some(bounds)) {
        Arrived::Admitted => admitted_at_once(entry),
        Arrived::Queued => {
            wait_in_queue(shared, entry, procno, group, need_kb, Waiter::Arriving);
        }
        Arrived::Full { group_bound } => turned_away(shared, group, group_bound, bounds),
    }
    entry.lease.hold(group);
}

/// Bounds on the statements waiting for admission (0 = none).
#[derive(Clone, Copy)]
struct Bounds {
    /// Of the statement's group (its `max_queued`).
    group: u32,
    /// Of the server (`pg_stride.max_queued`).
    server: u32,
}

/// What became of a statement that arrived in the queue.
#[derive(PartialEq, Eq)]
enum Arrived {
    Admitted,
    Queued,
    /// The queue was full — the group's part of it (`max_queued`) or the server's
    /// (`pg_stride.max_queued`): it left it at once.
    Full {
        group_bound: bool,
    },
}

/// Raises the ERROR of a statement that needs more working memory than the server's or
/// its group's whole budget, whose group rejects such statements (`reject_oversized`)
/// rather than run them alone.
fn reject_if_oversized(shared: &shmem::Shared, group: usize, need_kb: u64) {
    let exceeded = shared.with_admission(|queue, _| {
        if queue.memory.exceeds(need_kb) {
            Some(("pg_stride.memory_budget", queue.memory.limit_kb))
        } else if queue.groups[group].memory.exceeds(need_kb) {
            Some((
                "the group's memory_budget",
                queue.groups[group].memory.limit_kb,
            ))
        } else {
            None
        }
    });
    let Some((setting, limit_kb)) = exceeded else {
        return;
    };
    let group_name = shared.groups.name_of(group);
    reject(
        shared,
        group,
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        format!("statement needs more working memory than resource group \"{group_name}\" may use"),
        format!(
            "Its plan may keep {need_kb} kB (work_mem for each sort and tuple store, times hash_mem_multiplier for each hash table, in each process that runs it); {setting} is {limit_kb} kB."
        ),
        format!(
            "Lower work_mem for the statement, raise {setting}, or let such statements run alone with pg_stride.alter_group('{group_name}', reject_oversized => false)."
        ),
    );
}

/// Raises the ERROR of a statement that a full queue turned away, naming the bound it
/// met.
fn turned_away(shared: &shmem::Shared, group: usize, group_bound: bool, bounds: Bounds) -> ! {
    let group_name = shared.groups.name_of(group);
    let (detail, hint) = if group_bound {
        (
            format!("{} statements of the group wait already, its max_queued.", bounds.group),
            format!("Retry later, or raise the max_queued of group \"{group_name}\" with pg_stride.alter_group()."),
        )
    } else {
        (
            format!(
                "{} statements wait already, pg_stride.max_queued.",
                bounds.server
            ),
            "Retry later, or raise pg_stride.max_queued.".to_string(),
        )
    };
    reject(
        shared,
        group,
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
        format!("too many statements waiting for admission in resource group \"{group_name}\""),
        detail,
        hint,
    )
}

/// Counts a statement of group slot `group` turned away before it queued in the
/// group's `rejected_total`, and raises its ERROR.
fn reject(
    shared: &shmem::Shared,
    group: usize,
    code: PgSqlErrorCode,
    message: String,
    detail: String,
    hint: String,
) -> ! {
    shared
        .groups
        .counters(group)
        .rejected
        .fetch_add(1, Ordering::Relaxed);
    ErrorReport::new(code, message, "pg_stride admission")
        .set_detail(detail)
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Who waits in the queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// A statement to be admitted: its admission and its wait are recorded in the
    /// group's statistics.
    Arriving,
    /// A statement taking its lent admission back ([`take_back`]): not counted again,
    /// and its wait ends, with nothing granted, if the admission is taken back for it
    /// meanwhile (`reclaim_if_room` by the watchdog, which saw it run).
    TakingBack,
}

/// Waits in the queue, where `arrive` left process `procno` with a statement of group
/// slot `group` that reserves `need_kb` of working memory, until it is admitted or its
/// wait ran out (the group's or the session's queue timeout,
/// `GroupSettings::queue_timeout_ms`, with the group's as it is at each look). It shows
/// queued from now: PostgreSQL's statement start is the arrival of the client's message,
/// shared by every statement of a multi-statement query string. Returns whether it was
/// admitted (`false` only for a statement whose lent admission was taken back for it).
/// Raises an ERROR when the wait is cancelled, times out or the backend is terminated,
/// having left the queue.
fn wait_in_queue(
    shared: &shmem::Shared,
    entry: &ProcEntry,
    procno: usize,
    group: usize,
    need_kb: u64,
    waiter: Waiter,
) -> bool {
    let session_ms = QUEUE_TIMEOUT_MS.get();
    // The group's as it is now: a change of its queue_timeout reaches the statements
    // waiting (a DBA drains a queue with it).
    let timeout_ms = || {
        let settings = shared.groups.settings_of(group).unwrap_or_default();
        settings.queue_timeout_ms(session_ms)
    };
    let started = Instant::now();
    entry
        .queued_since
        .store(pg::now_timestamp(), Ordering::Relaxed);
    entry.queued.fetch_add(1, Ordering::AcqRel);
    let taken_back = || waiter == Waiter::TakingBack && !entry.lease.is_lent();
    let outcome =
        PgTryBuilder::new(|| wait_for_turn(shared, procno, started, timeout_ms, taken_back))
            .catch_others(|error| {
                leave_queue(shared, procno);
                error.rethrow()
            })
            .finally(|| {
                entry.queued.fetch_sub(1, Ordering::AcqRel);
            })
            .execute();
    let counters = shared.groups.counters(group);
    match outcome {
        WaitEnd::Admitted => {
            if waiter == Waiter::Arriving {
                let waited_us = started.elapsed().as_micros().min(u64::MAX as u128) as u64;
                counters.record_admission(waited_us);
                entry
                    .admitted_at
                    .store(pg::now_timestamp(), Ordering::Relaxed);
            }
            true
        }
        WaitEnd::NotNeeded => false,
        WaitEnd::TimedOut(timeout_ms) => {
            counters.timed_out.fetch_add(1, Ordering::Relaxed);
            let group_name = shared.groups.name_of(group);
            // The timeout, unless it was lowered during the wait: then how long it was.
            let waited_ms = started.elapsed().as_millis().min(i32::MAX as u128) as i32;
            let waited_ms = if waited_ms > timeout_ms.saturating_add(1000) {
                waited_ms
            } else {
                timeout_ms
            };
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
                format!(
                    "canceling statement after waiting {waited_ms} ms for admission in resource group \"{group_name}\""
                ),
                "pg_stride admission",
            )
            .set_detail("The wait reached pg_stride.queue_timeout or the group's queue_timeout.")
            .set_hint(format!(
                "Retry later, or raise pg_stride.queue_timeout, the queue_timeout of group \"{group_name}\", pg_stride.max_active_queries or its max_concurrency{}.",
                // It may have waited for memory rather than for a place: the limits on
                // statements alone would not help it.
                if need_kb > 0 {
                    format!(", or pg_stride.memory_budget or its memory_budget (the statement reserves {need_kb} kB of working memory)")
                } else {
                    String::new()
                }
            ))
            .report(PgLogLevel::ERROR);
            unreachable!("an ERROR report does not return")
        }
    }
}

/// Queues process `procno` with a statement of group slot `group` that reserves
/// `need_kb` of memory, admitting it at once if nobody waits and the limits have room.
/// With `bounds`, a statement that would wait beyond them leaves the queue at once
/// (under the same lock, so the bounds are exact).
fn arrive(
    shared: &shmem::Shared,
    procno: usize,
    group: usize,
    need_kb: u64,
    bounds: Option<Bounds>,
) -> Arrived {
    shared.with_admission(|queue, waiters| {
        let leases = shared.procs().iter().map(|e| &e.lease);
        let c = &shared.admission;
        match queue.arrive(c, waiters, leases, procno, group, need_kb, wake) {
            Arrival::Admitted => Arrived::Admitted,
            Arrival::Queued => match bounds {
                Some(b) if queue.over_bounds(c, group, b.group, b.server) => {
                    let group_bound = queue.over_bounds(c, group, b.group, 0);
                    queue.withdraw(c, waiters, procno, wake);
                    Arrived::Full { group_bound }
                }
                _ => Arrived::Queued,
            },
        }
    })
}

/// Records an admission without a wait, in the process's own entry only. The time is
/// read from the clock: PostgreSQL's statement start is when the client's message
/// arrived, shared by every statement of a multi-statement query string, and an
/// `elapsed` rule would charge a statement with the ones before it.
fn admitted_at_once(entry: &ProcEntry) {
    entry.admitted_pending.fetch_add(1, Ordering::Relaxed);
    entry
        .admitted_at
        .store(pg::now_timestamp(), Ordering::Relaxed);
}

/// How a wait in the queue ended, without an error.
enum WaitEnd {
    Admitted,
    /// The waiter no longer needs an admission (`no_longer_needed`), and left the queue
    /// with none granted.
    NotNeeded,
    /// The queue timeout (ms) ran out first; the waiter left the queue.
    TimedOut(i32),
}

/// Waits until this backend's queued statement is admitted, or it finds, under the
/// admission lock, that it needs no admission any more (`no_longer_needed`, looked at
/// after each wake-up and at least every second).
fn wait_for_turn(
    shared: &shmem::Shared,
    procno: usize,
    started: Instant,
    timeout_ms: impl Fn() -> i32,
    no_longer_needed: impl Fn() -> bool,
) -> WaitEnd {
    let mut end = WaitEnd::Admitted;
    let mut done = || {
        shared.with_admission(|queue, waiters| {
            if queue.take_admitted(waiters, procno) {
                return true;
            }
            if !no_longer_needed() {
                return false;
            }
            // Not granted (that was looked at just above, under this lock): it leaves
            // the queue. Were it granted, it would keep the admission, which the caller
            // gives back (`Lease::returned`).
            if !queue.stop_waiting(&shared.admission, waiters, procno, wake) {
                end = WaitEnd::NotNeeded;
            }
            true
        })
    };
    // The timeout in force is looked at again at least every second.
    let deadline_of = |ms: i32| (ms > 0).then(|| started + Duration::from_millis(ms as u64));
    let timeout_ms = loop {
        let look_again = Instant::now() + Duration::from_secs(1);
        let until = deadline_of(timeout_ms()).map_or(look_again, |d| d.min(look_again));
        if pg::wait_until(&mut done, Some(until)) {
            return end;
        }
        // As it is now: one raised since the look above lets the wait go on.
        let timeout_ms = timeout_ms();
        if deadline_of(timeout_ms).is_some_and(|d| Instant::now() >= d) {
            break timeout_ms;
        }
    };
    // Admitted at the last moment: take it, with its memory, rather than fail.
    let admitted = shared.with_admission(|queue, waiters| {
        queue.stop_waiting(&shared.admission, waiters, procno, wake)
    });
    if admitted {
        WaitEnd::Admitted
    } else {
        WaitEnd::TimedOut(timeout_ms)
    }
}

/// Takes process `procno` out of the queue, after an error ended its wait or when it
/// exits (a FATAL error, such as pg_terminate_backend's, exits without unwinding). An
/// admission granted meanwhile is given back at once, so that the next waiter gets it.
pub fn leave_queue(shared: &shmem::Shared, procno: usize) {
    shared.with_admission(|queue, waiters| {
        let group = waiters[procno].group as usize;
        if !queue.withdraw(&shared.admission, waiters, procno, wake)
            && shared.admission.leave(group)
        {
            queue.dispatch(&shared.admission, waiters, wake);
        }
    });
}

/// An admitted statement ended: keeps its admission as the process's idle lease while
/// nobody waits, or gives it back; returns whether statements wait, to be let in by
/// [`let_waiters_in`]. Atomics only, which cannot fail: the ExecutorEnd hook calls it
/// outside pgrx's error boundary.
// Out of line, so that bench/instructions.py can count admission's instructions.
#[inline(never)]
#[must_use = "when statements wait, call let_waiters_in"]
pub fn release(shared: &shmem::Shared, entry: &ProcEntry) -> bool {
    entry.lease.finish(&shared.admission)
}

/// Lets in the statements that waited for an admission [`release`] gave back: takes the
/// queue's lock, so only inside pgrx's error boundary.
#[inline(never)]
pub fn let_waiters_in(shared: &shmem::Shared) {
    dispatch(shared);
}

/// The statement of this process that reserved memory when it was admitted ended (or
/// the process exits): gives the memory back and lets in whoever waited for it.
pub fn release_memory(shared: &shmem::Shared, procno: usize) {
    shared.with_admission(|queue, waiters| {
        if queue.release_memory(&shared.admission, waiters, procno) {
            queue.dispatch(&shared.admission, waiters, wake);
        }
    });
}

/// Gives back the process's idle lease, if it keeps one (it leaves, or its next
/// statement runs in another group).
pub fn give_back_lease(shared: &shmem::Shared, entry: &ProcEntry) {
    if entry.lease.surrender(&shared.admission) {
        dispatch(shared);
    }
}

fn dispatch(shared: &shmem::Shared) {
    shared.with_admission(|queue, waiters| queue.dispatch(&shared.admission, waiters, wake));
}

/// The incarnation of group slot `slot`: see `GroupCounters::incarnation`.
fn incarnation(shared: &shmem::Shared, slot: usize) -> u32 {
    shared
        .groups
        .counters(slot)
        .incarnation
        .load(Ordering::Relaxed)
}

/// Makes group slot `group` the one this process's statements run in. Admissions the
/// process counted for its previous group are added to that group's counter first.
// Out of line, so that bench/instructions.py can count admission's instructions.
#[inline(never)]
pub fn switch_group(shared: &shmem::Shared, entry: &ProcEntry, group: usize) {
    let incarnation = incarnation(shared, group);
    if entry.group.load(Ordering::Relaxed) as usize != group
        || entry.pending_incarnation.load(Ordering::Relaxed) != incarnation
    {
        flush_admissions(shared, entry);
        entry
            .pending_incarnation
            .store(incarnation, Ordering::Relaxed);
        entry.group.store(group as u32, Ordering::Release);
    }
}

/// The group slot whose admissions the process counted in its entry and not yet in the
/// slot's counter, and how many; `None` if the slot has a new group since.
pub fn pending_admissions(shared: &shmem::Shared, entry: &ProcEntry) -> Option<(usize, u64)> {
    let slot = entry.group.load(Ordering::Relaxed) as usize;
    (entry.pending_incarnation.load(Ordering::Relaxed) == incarnation(shared, slot))
        .then(|| (slot, entry.admitted_pending.load(Ordering::Relaxed)))
}

/// Adds the admissions this process counted in its entry to its group's counter (unless
/// the group's slot has a new group since).
pub fn flush_admissions(shared: &shmem::Shared, entry: &ProcEntry) {
    if let Some((slot, _)) = pending_admissions(shared, entry) {
        let n = entry.admitted_pending.swap(0, Ordering::Relaxed);
        shared
            .groups
            .counters(slot)
            .admitted
            .fetch_add(n, Ordering::Relaxed);
    } else {
        entry.admitted_pending.store(0, Ordering::Relaxed);
    }
}

/// Admits process `procno` ahead of its turn if it is queued (the watchdog's way out of
/// a wait-for cycle through admission), counting the crossing of the limits in its
/// group's `over_limit_total` (docs/design.md §4 rule 12). Returns whether it did.
pub fn force_admit(shared: &shmem::Shared, procno: usize) -> bool {
    let admitted = shared
        .with_admission(|queue, waiters| queue.force_admit(&shared.admission, waiters, procno));
    let Some(group) = admitted else {
        return false;
    };
    count_crossing(shared, group);
    wake(procno);
    true
}

/// Counts a crossing of the limits to break a cycle of waits in group slot `group`'s
/// `over_limit_total` (docs/design.md §4 rule 12).
fn count_crossing(shared: &shmem::Shared, group: usize) {
    shared
        .groups
        .counters(group)
        .over_limit
        .fetch_add(1, Ordering::Relaxed);
}

/// Brings the admission limits in line with the groups and, given `limits` (the
/// server's `max_active_queries` and `memory_budget` in kB, after a reload), with those,
/// and admits whoever the new limits let in. `also` runs for each group under the
/// admission lock, which is also the CPU scheduler's registration lock.
pub fn configure(
    shared: &shmem::Shared,
    groups: &[(usize, Group)],
    limits: Option<(u32, u64)>,
    mut also: impl FnMut(usize, &Group),
) {
    shared.with_admission(|queue, waiters| {
        if let Some((max_active, memory_budget_kb)) = limits {
            shared.admission.set_max_active(max_active);
            queue.set_memory_budget(memory_budget_kb);
        }
        let mut budgets = queue.memory.limit_kb > 0;
        for (slot, group) in groups {
            let group_budget_kb = group.settings.memory_budget.unwrap_or(0).max(0) as u64;
            budgets |= group_budget_kb > 0;
            queue.configure_group(
                &shared.admission,
                *slot,
                group.settings.weight as u32,
                group.settings.max_concurrency as u32,
                group_budget_kb,
            );
            also(*slot, group);
        }
        shared.admission.set_memory_accounting(budgets);
        queue.revoke_idle(&shared.admission, shared.procs().iter().map(|e| &e.lease));
        queue.dispatch(&shared.admission, waiters, wake);
    });
}

/// Lends out the admission of `entry`'s statement, which waits for its client (or on a
/// lock that only a client can end, then `crossing`: counted in the group's
/// `over_limit_total`, since the statement will go on beyond the limits once the lock
/// is granted, up to the next place it can take an admission back), and admits whoever
/// that lets in (see `Lease`). `still_waits` is asked again once the admission is lent:
/// the statement may have ended, and another one taken the lease, since the caller
/// looked; that one counts again at once if it can do so within the limits, or else
/// when its process comes back through the queue ([`take_back`]). Returns whether the
/// admission stays lent.
pub fn lend_if(
    shared: &shmem::Shared,
    entry: &ProcEntry,
    crossing: bool,
    still_waits: impl Fn() -> bool,
) -> bool {
    let Some(waiters) = entry.lease.lend(&shared.admission) else {
        return false;
    };
    if waiters && pg::test_fault("lend_race") {
        // Widens the window in which the statement may end before it is looked at again.
        std::thread::sleep(Duration::from_secs(2));
    }
    if !still_waits() && reclaim_if_room(shared, entry) {
        // The statement ended (its lent admission given back with nothing dispatched)
        // or counts again: the place lent may be free for a waiter either way.
        if waiters {
            dispatch(shared);
        }
        return false;
    }
    if let (true, Some(group)) = (crossing, entry.lease.lent_group()) {
        count_crossing(shared, group);
    }
    if waiters {
        dispatch(shared);
    }
    true
}

/// `entry`'s statement, whose admission may have been lent, was seen running: it counts
/// again if nobody waits and the limits have room. Returns whether it counts now (or
/// was not lent).
pub fn reclaim_if_room(shared: &shmem::Shared, entry: &ProcEntry) -> bool {
    match entry.lease.reclaim(&shared.admission) {
        Reclaim::NotLent | Reclaim::Reclaimed => true,
        Reclaim::NoRoom => false,
        Reclaim::Raced { waiters } => {
            if waiters {
                dispatch(shared);
            }
            true
        }
    }
}

/// Whether this process's statement has its admission lent out.
pub fn is_lent(shared: &shmem::Shared) -> bool {
    shared
        .my_entry()
        .is_some_and(|e| e.lease.lent_group().is_some())
}

/// This process's statement, whose admission was lent while it waited for its client,
/// runs again: it takes an admission back before it goes on, at once when nobody waits
/// and the limits have room, otherwise through the queue in its turn like any arrival
/// (docs/design.md §4 rule 12). A statement queued so while it holds a lock that an
/// admitted one waits for is admitted ahead of its turn by the watchdog, and counted.
/// Raises the errors of a queued wait. Called only where interrupts can be processed
/// (rule 1), at a yield point or at ExecutorRun.
pub fn take_back(shared: &shmem::Shared) {
    let Some(entry) = shared.my_entry() else {
        return;
    };
    let Some(group) = entry.lease.lent_group() else {
        return;
    };
    let Some(procno) = pg::my_procno() else {
        return;
    };
    if reclaim_if_room(shared, entry) {
        return;
    }
    if pg::test_fault("take_back_race") {
        // Widens the window in which the watchdog, seeing the statement run, may take
        // the admission back for it (`reclaim_if_room`) before it queues.
        std::thread::sleep(Duration::from_secs(2));
    }
    // Its memory stays reserved while its admission is lent: the statement keeps it.
    if arrive(shared, procno, group, 0, None) == Arrived::Queued
        && !wait_in_queue(shared, entry, procno, group, 0, Waiter::TakingBack)
    {
        // The watchdog took the admission back for it meanwhile, and it left the queue
        // with nothing granted: it would have waited behind its own admission.
        return;
    }
    if entry.lease.returned(&shared.admission) {
        dispatch(shared);
    }
}

// ---- Admission's settings ----

static MAX_ACTIVE_QUERIES: Setting<i32> = Setting::new(GucSetting::<i32>::new(128));
static QUEUE_TIMEOUT_MS: Setting<i32> = Setting::new(GucSetting::<i32>::new(0));
/// `pg_stride.max_queued`: statements waiting for admission at once, server-wide (0 =
/// no bound).
static MAX_QUEUED: Setting<i32> = Setting::new(GucSetting::<i32>::new(0));
/// `pg_stride.memory_budget`: working memory admitted statements may reserve at once,
/// kB (0 = no budget; `pg_stride_sched::memory`).
static MEMORY_BUDGET_KB: Setting<i32> = Setting::new(GucSetting::<i32>::new(0));

/// `pg_stride.max_active_queries`: admitted top-level statements at once, server-wide.
pub fn max_active_queries() -> u32 {
    MAX_ACTIVE_QUERIES.get().max(1) as u32
}

/// `pg_stride.memory_budget` in kB; 0 sets no budget.
pub fn memory_budget_kb() -> u64 {
    MEMORY_BUDGET_KB.get().max(0) as u64
}

/// Registers admission's settings. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_stride.max_active_queries",
        c"Maximum number of admitted top-level statements; further ones wait.",
        c"",
        MAX_ACTIVE_QUERIES.inner(),
        1,
        pgrx::pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.queue_timeout",
        c"Longest time a statement waits for admission; 0 waits as long as it takes.",
        c"A statement still queued then fails with SQLSTATE 53000.",
        QUEUE_TIMEOUT_MS.inner(),
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_stride.max_queued",
        c"Most statements waiting for admission at once, server-wide; 0 sets no bound.",
        c"A statement that would wait beyond it fails at once with SQLSTATE 53000.",
        MAX_QUEUED.inner(),
        0,
        262_143,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.memory_budget",
        c"Working memory that admitted statements may reserve at once, server-wide; 0 sets no budget.",
        c"A statement reserves work_mem for each sort, hash (times hash_mem_multiplier) and tuple store of its plan, in each process that runs it; one that does not fit waits for admission.",
        MEMORY_BUDGET_KB.inner(),
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
}
