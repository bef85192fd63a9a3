//! The slot protocol of one process: taking a slot when ExecutorRun begins and giving it
//! back when it ends, the check-in at the end of each chunk of tuples (charging the
//! slice, competing for the slot in stride order), the pause on the latch until a slot
//! is handed over, and joining the query at the first check-in.

use super::member::{
    arm_countdown, disarm_countdown, take_yield_request, Member, COUNTDOWN, MEMBER, YIELD_FLAG,
};
use super::placement::{self, dispatch_free_slots, hand_over, Ran};
use super::prediction;
use super::priority::priority_range;
use crate::os::{self, thread_cpu_ns};
use crate::pg::{self, interrupts_can_be_processed};
use crate::{admission, numa, shmem};
use pg_stride_sched::slice::Checkpoint;
use pg_stride_sched::{GroupId, ProcId, QueryOptions, SchedShared, Turn};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// Chunk used when a slice ends where the process may not pause: check again soon.
const RETRY_CHUNK: u32 = 16;

/// Whether this backend's transaction has written or locked rows: then it has a
/// transaction ID, and pausing it could keep others waiting for its row locks (a convoy
/// behind a paused process). Checked again at every run and check-in, since a
/// transaction that opened a cursor may write before the next FETCH.
pub(super) fn transaction_wrote() -> bool {
    pg::top_transaction_id_if_any() != pg_sys::InvalidTransactionId
}

/// Registers this backend's query in its group and joins it, unless it has already.
/// Returns `false`, and ends the membership, when there is no free query entry (more
/// statements than processes): the statements then run unscheduled.
pub(super) fn join_query(shared: &shmem::Shared, sched: &SchedShared) -> bool {
    MEMBER.with_borrow_mut(|member| {
        let Some(m) = member.as_mut() else {
            return false;
        };
        if m.query.is_some() {
            return true;
        }
        let pinned = shared.groups.settings_of(m.group).filter(|s| s.pinned);
        let pinned_priority = pinned.map(|s| priority_range(&s).p0);
        let group = GroupId(m.group as u32);
        m.pinned_priority = pinned_priority;
        // A pinned group's statements keep their static priority: nothing to predict.
        let predicted = if pinned_priority.is_none() {
            prediction::predict(shared, sched, m.group, m.query_id, m.plan_cost)
        } else {
            None
        };
        m.prediction = predicted.map(|(p, _)| p);
        // The home is chosen under the registration lock, so that statements registering
        // at once see each other's homes (`numa = bind`).
        let registered = {
            let _lock = shared.registration_lock();
            let options = QueryOptions {
                pinned_priority,
                home: sched.choose_home(),
                start: predicted.and_then(|(_, start)| start),
            };
            sched.register_query(group, options)
        };
        let Ok(query) = registered else {
            *member = None;
            return false;
        };
        if sched.join(m.proc, query).is_err() {
            {
                let _lock = shared.registration_lock();
                let _ = sched.unregister_query(query);
            }
            *member = None;
            return false;
        }
        if let Some(entry) = shared.my_entry() {
            entry
                .query_arrival_ns
                .store(m.arrival.arrival_ns, Ordering::Relaxed);
            entry
                .query_admit_ns
                .store(m.arrival.admit_ns, Ordering::Relaxed);
            entry.cpu_query.store(query.0 + 1, Ordering::Release);
        }
        m.query = Some(query);
        true
    })
}

/// ExecutorRun of a scheduled statement begins: take a slot, waiting for one if needed.
/// A statement of a transaction that wrote since the statement started runs without one,
/// and so does one that has not joined its query yet (its first check-in joins).
pub fn begin_run(shared: &shmem::Shared, desc: *const pg_sys::QueryDesc) {
    start_run(shared, Some(desc as usize));
}

/// [`begin_run`] of the statement at address `run_of`.
fn start_run(shared: &shmem::Shared, run_of: Option<usize>) {
    let Some(sched) = shared.sched() else { return };
    if transaction_wrote() {
        return;
    }
    let Some(proc) = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.run_of = run_of;
        m.clock.set_target_ns(super::settings::slice_ns());
        m.clock.restart();
        arm_countdown(m.clock.chunk());
        if m.join_after_ns.is_some() {
            m.deferred_run_begins(m.clock.chunk());
        }
        m.query?;
        m.restart_charging();
        Some(m.proc)
    }) else {
        return;
    };
    take_slot(shared, sched, proc);
}

/// Takes a CPU slot for `proc`, pausing until one is handed over if none is free.
fn take_slot(shared: &shmem::Shared, sched: &'static SchedShared, proc: ProcId) {
    YIELD_FLAG.set(Some(sched.yield_flag(proc)));
    let outcome = sched.acquire(proc);
    hand_over(None, outcome.wake, false);
    if outcome.turn == Turn::Wait {
        pause(shared, sched, proc, None);
    } else {
        placement::slot_taken(shared, sched, proc);
        count_check_in(shared);
        MEMBER.with_borrow_mut(|m| m.as_mut().map(Member::holds_slot));
    }
}

/// ExecutorRun ends: give the slot back, charging the CPU used since the last check-in.
pub fn end_run(shared: &shmem::Shared) {
    disarm_countdown();
    let Some(sched) = shared.sched() else { return };
    let Some((proc, used)) = run_closed() else {
        return;
    };
    if sched.is_running(proc) {
        let to = sched.release(proc, used);
        count_group_cpu(shared, sched, proc, used);
        placement::slot_given_back(shared, proc, to, used);
    }
}

/// A run of this process's statements ends: the CPU it used since its last check-in,
/// with the time it held its slot closed. `None` for a process that works for no query.
fn run_closed() -> Option<(ProcId, u64)> {
    MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.run_of = None;
        m.query?;
        let used = thread_cpu_ns().saturating_sub(m.slice_start_ns);
        if m.held_since_ns.is_some() {
            m.slice_used(used);
            m.left_slot();
        }
        Some((m.proc, used))
    })
}

/// Adds `used_ns`, just charged to `proc`'s query, to its group's CPU total
/// (`pg_stride.groups.cpu_time_ms`) as it is charged: the total never goes back, and a
/// statement that a rule moves leaves the CPU it used so far to its first group.
fn count_group_cpu(shared: &shmem::Shared, sched: &SchedShared, proc: ProcId, used_ns: u64) {
    if let Some(group) = sched.group_of(proc).filter(|_| used_ns > 0) {
        shared.groups.add_cpu(group.0 as usize, used_ns);
    }
}

/// Statement `desc` failed while other statements of this process stay scheduled (an
/// open cursor, the query of a PL/pgSQL FOR loop whose body caught the error): the error
/// may have cut short its ExecutorRun, whose [`end_run`] never came. If the run under
/// way is its own, gives back the slot that run held, or leaves the wait for one that a
/// cancel ended, as the process's last statement would at its end; the process stays in
/// its query for the statements that stay, and takes a slot again at their next run.
pub(super) fn abandon_run(
    shared: &shmem::Shared,
    sched: &'static SchedShared,
    desc: *const pg_sys::QueryDesc,
) {
    let (run_of, proc) = MEMBER.with_borrow(|m| {
        m.as_ref()
            .map_or((None, None), |m| (m.run_of, m.query.map(|_| m.proc)))
    });
    if run_of != Some(desc as usize) {
        // A statement run inside the run (a FETCH of a cursor in a function that
        // caught its error): the run goes on, on its slot. If the error ended a pause
        // at one of that statement's yield points, the wait for a slot is withdrawn:
        // the run goes on without one, as after an error of its own, rather than be
        // handed one later while its process is idle.
        if let Some(proc) = proc.filter(|&p| !sched.is_running(p)) {
            stop_run(shared, sched, proc, 0);
        }
        return;
    }
    disarm_countdown();
    let Some((proc, used)) = run_closed() else {
        return;
    };
    let used = if sched.is_running(proc) { used } else { 0 };
    let to = stop_run(shared, sched, proc, used);
    placement::slot_given_back(shared, proc, to, used);
}

/// `proc`'s run ends at no ExecutorRun end (an error cut it short, or the process
/// exits): charges `used_ns`, the CPU since its last check-in (0 if it held no slot),
/// to its query and its group, and returns who was handed the slot. The caller hands
/// it over through `placement`, which charges the CPU's node.
pub(super) fn stop_run(
    shared: &shmem::Shared,
    sched: &SchedShared,
    proc: ProcId,
    used_ns: u64,
) -> Option<ProcId> {
    let to = sched.stop(proc, used_ns);
    count_group_cpu(shared, sched, proc, used_ns);
    to
}

/// Shows this process as paused (`pg_stride.activity`, `pg_stride.scheduler`).
fn mark_paused(shared: &shmem::Shared) {
    if let Some(entry) = shared.my_entry() {
        entry.paused.store(1, Ordering::Release);
    }
}

/// Sleeps on the latch until the scheduler gives this process a slot again. Serves
/// cancel, timeouts and termination (CHECK_FOR_INTERRUPTS raises their errors; the
/// statement's cleanup then leaves the query) and postmaster death. `since`: when the
/// process gave up the slot it held, the start of its wait.
fn pause(shared: &shmem::Shared, sched: &SchedShared, proc: ProcId, since: Option<u64>) {
    debug_assert!(
        interrupts_can_be_processed(),
        "pg_stride pauses only where interrupts can be processed"
    );
    mark_paused(shared);
    placement::pausing(shared, proc);
    // Asks a holder of a lower priority to end its slice at its next tuple rather than
    // wait for the end of its slice: a statement arriving behind it then waits for one
    // tuple, not for the rest of a slice (bench/results/scheduling-policy/alpha095_preempt).
    if sched.ask_holder_to_yield(proc).is_some() {
        shared.yield_requests.fetch_add(1, Ordering::Relaxed);
    }
    // Waiting from when the slot was given up (`since`), or from now.
    let paused_at_ns = since.unwrap_or_else(os::monotonic_ns);
    MEMBER.with_borrow_mut(|m| {
        if let Some(m) = m.as_mut() {
            m.pause_begins(since.is_some());
        }
    });
    let is_running = || {
        // A runaway-query rule's cancel, which the scheduler worker wakes this process
        // for, is raised here: paused, it reaches no yield point until it has a slot.
        super::runaway::cancel_if_a_rule_says_so(shared);
        let running = sched.is_running(proc);
        if let Some(entry) = shared.my_entry() {
            entry.paused.store(u32::from(!running), Ordering::Release);
        }
        running
    };
    // With the slots split by node, a process that waited `numa_steal_after` slices for
    // a slot of its home node may take another node's (psaroudakis2016 §4), and offers
    // itself to every node's free slots again after each further such wait.
    let steal_after = numa::steal_after()
        .filter(|_| sched.node_count() > 1)
        .map(|k| {
            let wait = std::time::Duration::from_nanos(
                super::settings::slice_ns().saturating_mul(u64::from(k)),
            );
            // The latch wait's resolution; also keeps 0 from spinning.
            wait.max(std::time::Duration::from_millis(1))
        });
    match steal_after {
        None => {
            pg::wait_until(is_running, None);
        }
        Some(wait) => {
            while !pg::wait_until(is_running, Some(std::time::Instant::now() + wait)) {
                sched.allow_steal(proc);
                dispatch_free_slots(sched);
            }
        }
    }
    // Runs where its slot says and measures its first slice from there
    // (`restart_charging` below withdraws the last share).
    placement::slot_taken(shared, sched, proc);
    count_check_in(shared);
    let now = os::monotonic_ns();
    // When the slot was handed over. A note older than this pause is a previous
    // hand-off's: the slot reached this process before the giver noted it (between
    // giving it in the scheduler and `hand_over`), or before the pause began, so it
    // found the slot at once.
    let given = shared
        .my_entry()
        .map(|e| e.inbox.slot_given_ns.load(Ordering::Acquire))
        .filter(|&t| t >= paused_at_ns)
        .unwrap_or(now);
    if let Some(entry) = shared.my_entry() {
        entry.paused.store(0, Ordering::Release);
        let waited_us = now.saturating_sub(paused_at_ns) / 1_000;
        entry.paused_us.fetch_add(waited_us, Ordering::Relaxed);
    }
    MEMBER.with_borrow_mut(|m| {
        if let Some(m) = m.as_mut() {
            // CPU spent paused (latch waits) is not the query's.
            m.restart_charging();
            m.acct.paused_ns += now.saturating_sub(paused_at_ns);
            m.acct.handoff_ns += now.saturating_sub(given);
            m.acct.handoffs += 1;
            m.holds_slot();
        }
    });
}

/// A chunk of tuples is done: measure it and, at the end of a slice, ask the scheduler
/// whether to go on.
#[pgrx::pg_guard]
pub(super) unsafe extern "C-unwind" fn check_in() {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let Some(sched) = shared.sched() else { return };
    // Answered here whatever follows, so that a yield point reads it set only once.
    let asked = take_yield_request();
    count_check_in(shared);
    super::runaway::cancel_if_a_rule_says_so(shared);
    super::runaway::move_if_a_rule_says_so(shared, sched);
    if admission::is_lent(shared) && interrupts_can_be_processed() {
        // Its admission was lent while it waited for its client: the statement takes it
        // back before it goes on, without a slot while it may wait (docs/design.md §4
        // rule 12).
        let run_of = MEMBER.with_borrow(|m| m.as_ref().and_then(|m| m.run_of));
        end_run(shared);
        admission::take_back(shared);
        start_run(shared, run_of);
        return;
    }
    if MEMBER.with_borrow(|m| m.as_ref().is_some_and(|m| m.query.is_none())) {
        join_at_first_check_in(shared, sched);
        return;
    }
    let now = thread_cpu_ns();
    let left = COUNTDOWN.get();
    let decision = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        let elapsed = now.saturating_sub(m.chunk_start_ns);
        m.chunk_start_ns = now;
        let checkpoint = if asked && left > 1 {
            // A waiter of a higher priority asked: the slice ends inside the chunk.
            let tuples = m.clock.chunk().saturating_sub(left);
            Checkpoint::SliceEnd {
                used_ns: m.clock.cut(tuples, elapsed),
            }
        } else {
            match m.clock.chunk_done(elapsed) {
                Checkpoint::Continue if asked => Checkpoint::SliceEnd {
                    used_ns: m.clock.cut(0, 0),
                },
                checkpoint => checkpoint,
            }
        };
        arm_countdown(m.clock.chunk());
        match checkpoint {
            Checkpoint::Continue => None,
            Checkpoint::SliceEnd { used_ns } => {
                m.slice_start_ns = now;
                m.slice_used(used_ns);
                Some((m.proc, used_ns, placement::slice_ends(shared, used_ns)))
            }
        }
    });
    let Some((proc, used_ns, ran)) = decision else {
        return;
    };
    // The next slice is measured from here, unless this process pauses: `pause` measures
    // it again from where it resumes, on the CPU of its new slot.
    placement::slice_starts(shared);
    if !sched.is_running(proc) {
        return;
    }
    if !interrupts_can_be_processed() {
        // Rule 1: no pause inside an LWLock or critical section; look again soon.
        keep_slot(shared, sched, proc, used_ns, ran);
        arm_countdown(RETRY_CHUNK);
        return;
    }
    if transaction_wrote() {
        // Rule 2: keep the slot rather than pause while holding row locks, and run in
        // the class of everything else: a holder outranked into SCHED_IDLE at an earlier
        // slice end would hold its locks at the kernel's lowest priority.
        keep_slot(shared, sched, proc, used_ns, ran);
        placement::writes(shared, proc);
        return;
    }
    // A process on a slot away from its home got there by stealing and keeps the right
    // to. If it has to wait now, the other nodes' free slots (its home's among them) are
    // offered to it only by a dispatch, which it runs itself, as when it started
    // stealing (sched/src/shared/nodes.rs); else it would wait with a slot it may take
    // free until its next steal timeout or the watchdog's dispatch.
    let stealer = sched.away_from_home(proc);
    let outcome = sched.end_slice(proc, used_ns);
    count_group_cpu(shared, sched, proc, used_ns);
    let gave_up = (outcome.turn == Turn::Wait).then_some(proc);
    // Before the wake-up: from then on the receiver may have this CPU, and the time this
    // process still needs to get to its pause (the receiver may preempt it on their
    // shared CPU) is waiting for a slot, not holding one.
    let left_at =
        gave_up.and_then(|_| MEMBER.with_borrow_mut(|m| m.as_mut().map(Member::left_slot)));
    // Charged on the CPU the slice ended on, before a pause moves the process; its share
    // is published only if it keeps its slot.
    placement::slice_decided(shared, used_ns, ran.filter(|_| gave_up.is_none()));
    if gave_up.is_some() {
        // Paused before the wake-up: a receiver woken on this CPU (its slot's, or this
        // process's when slots are not pinned) preempts it there, and it then stays
        // runnable without a slot, short of its latch wait, until the kernel lets it
        // run again, often a whole slice later.
        mark_paused(shared);
    }
    hand_over(gave_up, outcome.wake, false);
    if outcome.turn == Turn::Wait {
        if stealer {
            // May hand this process itself a slot: pause then returns at once.
            dispatch_free_slots(sched);
        }
        pause(shared, sched, proc, left_at);
    } else {
        placement::slot_kept(shared, sched, proc, ran);
    }
}

/// A slice of `used_ns` ended where this process may not pause: it keeps its slot
/// without a decision, and the slice is charged all the same (to its query, its group
/// and its node), or a read that wrote once it had joined (a volatile function in its
/// filter) would run to its end uncharged: its rules, decay and history blind to it.
fn keep_slot(
    shared: &shmem::Shared,
    sched: &SchedShared,
    proc: ProcId,
    used_ns: u64,
    ran: Option<Ran>,
) {
    sched.charge_kept_slice(proc, used_ns);
    count_group_cpu(shared, sched, proc, used_ns);
    placement::slice_decided(shared, used_ns, ran);
}

/// Tells the watchdog that this process reached a yield point (or took a slot).
pub(super) fn count_check_in(shared: &shmem::Shared) {
    if let Some(entry) = shared.my_entry() {
        let n = entry.checkins.load(Ordering::Relaxed);
        entry.checkins.store(n.wrapping_add(1), Ordering::Relaxed);
    }
}

/// The statement's scans produced their first chunk: it is long enough to be scheduled.
/// Joins its query and takes a slot (pausing if none is free), where a pause is allowed;
/// one tiny by its history only once it has used a slice (`Member::defers_join`).
fn join_at_first_check_in(shared: &shmem::Shared, sched: &'static SchedShared) {
    if MEMBER.with_borrow_mut(|m| m.as_mut().is_some_and(Member::defers_join)) {
        return;
    }
    if transaction_wrote() {
        // Rule 2: a statement of a transaction holding row locks is never paused.
        disarm_countdown();
        return;
    }
    if !interrupts_can_be_processed() {
        // Rule 1: join where a pause would be allowed; look again soon.
        arm_countdown(RETRY_CHUNK);
        return;
    }
    if !join_query(shared, sched) {
        disarm_countdown();
        return;
    }
    let Some(proc) = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.restart_charging();
        m.clock.restart();
        arm_countdown(m.clock.chunk());
        Some(m.proc)
    }) else {
        return;
    };
    take_slot(shared, sched, proc);
}
