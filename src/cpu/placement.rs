//! Where the kernel runs a process that gets or gives up a slot: the hand-over (the
//! receiver woken on the giver's CPU, or as `SCHED_BATCH` until the giver sleeps), the
//! pinning of slots to CPUs (`pinning.rs`), the share of its slices a pinned holder ran
//! (`slice_share.rs`) and the NUMA node of the slot. The slot protocol (`slots.rs`), the
//! statement's end (`mod.rs`), the process-local state (`member.rs`) and the watchdog
//! reach all of them through the functions here, one per event of a slot's life;
//! `pinning` and `slice_share` are this module's own. (A statement's end also undoes a
//! `numa = bind` binding directly, `numa::unbind`, whether or not it ever held a slot.)

#[path = "pinning.rs"]
mod pinning;
#[path = "slice_share.rs"]
mod slice_share;

pub(super) use slice_share::Ran;

use crate::os;
use crate::pg;
use crate::{numa, shmem};
use pg_stride_sched::{ProcId, SchedShared};
use std::sync::atomic::Ordering;

/// `from` gave its slot up (`None`: nobody did) and `to` was handed one: notes when,
/// for the hand-off's latency in `to`'s trace record, passes the CPU with the slot
/// (`pg_stride.pin_slots`) or wakes `to` on this CPU (`pinning::places_receivers`),
/// and wakes `to`. The note comes first: moving `to` onto this CPU may let it run at
/// once, preempting this process before it gets any further.
///
/// That preemption is right when this process goes to sleep next (a pause), but not
/// when it `goes_on` without a slot: a statement leaving ExecutorRun still has its
/// ExecutorEnd, commit and reply to do, well under a millisecond, and a receiver that
/// preempted it would hold it back for the receiver's whole kernel time slice (1.7 ms a
/// short statement, bench/results/sim-gap/SIM_GAP.md). The shorter job goes first: the
/// receiver on this CPU then wakes as `SCHED_BATCH`, which the kernel does not let
/// preempt, and runs as soon as this process sleeps; it sets itself back to
/// `SCHED_OTHER` once it runs (`run_as_other`).
pub(super) fn hand_over(from: Option<ProcId>, to: Option<ProcId>, goes_on: bool) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let entry = to.and_then(|p| shared.procs().get(p.0 as usize));
    if let Some(entry) = entry {
        entry
            .inbox
            .slot_given_ns
            .store(os::monotonic_ns(), Ordering::Release);
    }
    if let Some(sched) = shared.sched() {
        let pinned = pinning::enabled(sched);
        // Without pinning, only a slot this process gives up comes with its CPU.
        let placed = !pinned && from.is_some() && pinning::places_receivers(sched);
        if pinned || placed {
            // A statement ending its ExecutorRun finishes (ExecutorEnd, commit, reply)
            // before the receiver runs on its CPU: the receiver wakes as SCHED_BATCH,
            // which does not preempt, until it runs.
            if let (true, Some(entry), Some(p)) = (goes_on, entry, to) {
                wake_as_batch(entry, p);
            }
        }
        if pinned {
            pinning::pass(shared, from, to);
        } else if let (true, Some(p), Some(entry)) = (placed, to, entry) {
            if !pinning::place(shared, sched, p) {
                // Running already: nothing to let finish first.
                undo_batch(entry, p);
            }
        }
    }
    if let Some(p) = to {
        pg::set_latch(p.0 as usize);
    }
}

/// Makes process `to` (entry `entry`) `SCHED_BATCH` until it runs: see [`hand_over`].
fn wake_as_batch(entry: &shmem::ProcEntry, to: ProcId) {
    let pid = pg::proc_pid(to.0 as usize);
    if pid == 0 {
        return;
    }
    // Flagged once the policy changed: a receiver already running that looked before
    // then sets itself back at its next check-in, pause or statement end.
    if os::set_batch_policy(pid, true).is_ok() {
        entry.inbox.woken_as_batch.store(1, Ordering::Release);
    }
}

/// Undoes [`wake_as_batch`] for a receiver `to` that runs already.
fn undo_batch(entry: &shmem::ProcEntry, to: ProcId) {
    let pid = pg::proc_pid(to.0 as usize);
    if entry.inbox.woken_as_batch.swap(0, Ordering::AcqRel) == 1 && pid != 0 {
        let _ = os::set_batch_policy(pid, false);
    }
}

/// This process runs again: undo a `SCHED_BATCH` that a hand-over gave it.
fn run_as_other(shared: &shmem::Shared) {
    if let Some(entry) = shared.my_entry() {
        if entry.inbox.woken_as_batch.load(Ordering::Acquire) == 1
            && entry.inbox.woken_as_batch.swap(0, Ordering::AcqRel) == 1
        {
            let _ = os::set_batch_policy(0, false);
        }
    }
}

/// Hands every free slot to a waiter that may take it, waking each.
pub(super) fn dispatch_free_slots(sched: &SchedShared) {
    while let Some(p) = sched.dispatch() {
        hand_over(None, Some(p), false);
    }
}

/// With the slots split by node (`pg_stride.numa = bind`), runs this process on the
/// CPUs of the node whose slot it was given; once they are no longer split, on its own
/// CPUs again, or, with `pg_stride.pin_slots`, on the CPU that came with its slot. A
/// process only changes node when it is given a slot, so this is asked after taking one,
/// after a pause, and (for the pinning's cheap check) at a slice end that keeps it.
/// Running with its slot, it also drops what its hand-over gave it to wake with: the
/// `SCHED_BATCH` policy, and without pinning the pin to its giver's CPU.
fn follow_slot(shared: &shmem::Shared, sched: &SchedShared, proc: ProcId) {
    run_as_other(shared);
    if sched.node_count() > 1 {
        // A wake-up on a giver's CPU from before `numa = bind` came into force.
        pinning::unpin(shared, proc);
        if let Some(node) = sched.slot_node(proc) {
            numa::follow_slot(node);
        }
    } else {
        numa::unbind();
        if pinning::enabled(sched) {
            pinning::hold(shared, sched, proc);
        } else {
            // Woken on its giver's CPU (`pinning::places_receivers`): running now.
            pinning::unpin(shared, proc);
        }
    }
}

/// This process holds a slot now, taken at once or after a pause: it runs where its slot
/// says ([`follow_slot`]), and its first slice is measured from here, on that CPU.
pub(super) fn slot_taken(shared: &shmem::Shared, sched: &SchedShared, proc: ProcId) {
    follow_slot(shared, sched, proc);
    slice_share::starts(shared);
}

/// This process is about to take a slot (again): the share it published for its last one
/// no longer says anything.
pub(super) fn new_slot() {
    slice_share::new_slot();
}

/// This process gave its slot back at the end of an ExecutorRun, having used `used_ns`
/// of CPU since its last check-in, and goes on without one; `to` was handed the slot.
pub(super) fn slot_given_back(
    shared: &shmem::Shared,
    proc: ProcId,
    to: Option<ProcId>,
    used_ns: u64,
) {
    slice_share::publish(shared, None);
    // Off its CPU's pinning before the receiver is queued there: widening the mask of a
    // running process whose CPU has another one waiting lets that one run at once, and
    // the statement's ExecutorEnd would wait out the receiver's time slice.
    pinning::unpin(shared, proc);
    hand_over(Some(proc), to, true);
    numa::charge(shared, used_ns);
}

/// This process gave its slot up and waits for one.
pub(super) fn pausing(shared: &shmem::Shared, proc: ProcId) {
    pinning::pausing(shared, proc);
}

/// This process's transaction wrote: it keeps its slot to its run's end (rule 2), out
/// of `SCHED_IDLE` if an earlier slice end put it there.
pub(super) fn writes(shared: &shmem::Shared, proc: ProcId) {
    pinning::leave_idle_class(shared, proc);
}

/// A slice of `used_ns` of CPU ends at a check-in: the share of its wall-clock time this
/// process ran, if it was measured (`slice_share::ends`).
pub(super) fn slice_ends(shared: &shmem::Shared, used_ns: u64) -> Option<Ran> {
    slice_share::ends(shared, used_ns)
}

/// A slice starts now, at a check-in that may keep the slot.
pub(super) fn slice_starts(shared: &shmem::Shared) {
    slice_share::starts(shared);
}

/// The scheduler decided on the slice that ended, of `used_ns` of CPU: charges it to the
/// node of the CPU it ran on (before a pause moves the process), and publishes the share
/// it ran (`ran`; `None` withdraws the last one, as when the slot is given up).
pub(super) fn slice_decided(shared: &shmem::Shared, used_ns: u64, ran: Option<Ran>) {
    numa::charge(shared, used_ns);
    slice_share::publish(shared, ran);
}

/// This process keeps its slot past a slice end that `ran` measured: it runs where its
/// slot says, and a pinned holder swaps CPUs with a stalled one (`pinning::serve_stalled`).
pub(super) fn slot_kept(
    shared: &shmem::Shared,
    sched: &SchedShared,
    proc: ProcId,
    ran: Option<Ran>,
) {
    follow_slot(shared, sched, proc);
    if pinning::enabled(sched) {
        pinning::serve_stalled(shared, sched, proc, ran.map(|r| r.permille));
    }
}

/// This process's statement left its query; `to` was handed the slot it held, whose last
/// `used_ns` of CPU no ExecutorRun end charged (an error cut the run short) and are
/// charged to this CPU's node here: it runs with its own scheduling class and the
/// postmaster's CPUs again.
pub(super) fn statement_left(
    shared: &shmem::Shared,
    proc: ProcId,
    to: Option<ProcId>,
    used_ns: u64,
) {
    numa::charge(shared, used_ns);
    hand_over(Some(proc), to, true);
    run_as_other(shared);
    pinning::leave(shared, proc);
}

/// The scheduler worker's round over the CPUs' owners (`pinning::sweep`).
pub(super) fn sweep(shared: &shmem::Shared, sched: &SchedShared) {
    pinning::sweep(shared, sched);
}
