//! The CPU watchdog, run by the scheduler worker (psaroudakis2013 §5): slot holders that
//! wait count as inactive, and the slots they leave unused are lent to waiters.

use super::placement::{self, dispatch_free_slots};
use crate::{numa, pg, shmem};
use pg_stride_sched::ProcId;
use std::sync::atomic::Ordering;

/// What the watchdog saw of a process at its previous round.
#[derive(Clone, Copy, Default)]
pub struct Seen {
    /// Holding a slot and waiting on an event.
    blocked: bool,
    /// Whether the slot count was raised for it.
    lent: bool,
}

/// The watchdog (psaroudakis2013 §5): a slot holder that waits — on a lock, I/O, the
/// client, a sleep — uses no CPU, so it must not keep others from running. Holders seen
/// waiting at two consecutive rounds (`before` carries the previous round) are counted
/// as inactive: the slot count is raised by their number and the extra slots are
/// handed out at once. When they run again, the count drops back, and each of them is
/// asked to end its slice at its next tuple, where it competes for its slot with the
/// waiters in stride order.
pub fn watchdog(shared: &shmem::Shared, before: &mut Vec<Seen>) {
    let Some(sched) = shared.sched() else { return };
    let procs = sched.capacity().max_procs as usize;
    before.resize(procs, Seen::default());
    // Split by node with `numa = bind`; a blocked holder's extra slot goes to the node
    // whose slot it holds.
    let mut slots = numa::slot_split(super::settings::effective_cpu_slots());
    let last = slots.len() - 1;
    for (procno, seen) in before.iter_mut().enumerate() {
        let proc = ProcId(procno as u32);
        let running = sched.is_running(proc);
        // A stale read of the wait event only delays the decision by a round.
        let waiting = running && pg::proc_wait_event(procno) != 0;
        let blocked = waiting && seen.blocked;
        if seen.lent && !blocked && running && !sched.nobody_waits() {
            // Its extra slot goes away with this round: it competes for its slot at its
            // next tuple, in stride order with the waiters, rather than keep it to the
            // end of its slice (docs/design.md §4 rule 12).
            sched.yield_flag(proc).store(1, Ordering::Relaxed);
        }
        if blocked {
            let node = sched.slot_node(proc).unwrap_or(0) as usize;
            slots[node.min(last)] += 1;
            if !seen.lent {
                shared.lends_blocked.fetch_add(1, Ordering::Relaxed);
            }
        }
        *seen = Seen {
            blocked: waiting,
            lent: blocked,
        };
    }
    if sched.node_slots() != slots {
        sched.set_node_slots(&slots);
    }
    dispatch_free_slots(sched);
    placement::sweep(shared, sched);
}
