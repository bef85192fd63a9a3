//! Where the kernel runs a process that gets or gives up a slot: the hand-over (the
//! receiver woken on the giver's CPU, or as `SCHED_BATCH` until the giver sleeps), the
//! pinning of slots to CPUs (`pinning.rs`) and the NUMA node of the slot.

use super::pinning;
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
pub(super) fn run_as_other(shared: &shmem::Shared) {
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
pub(super) fn follow_slot(shared: &shmem::Shared, sched: &SchedShared, proc: ProcId) {
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
