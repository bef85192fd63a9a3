//! A Gather Merge run by the pool: the merge of nodeGatherMerge.c over the pool
//! workers' tuple queues and the leader's own part, so that the node keeps its order.
//!
//! It reuses what ExecInitGatherMerge built: the sort keys, one MinimalTuple slot per
//! planned worker (`gm_slots[1 + i]` holds the current tuple of ticket i, `gm_slots[0]`
//! the leader's) and the binary heap of participants, whose comparator
//! (heap_compare_slots) compares those slots. What differs from core is the reading:
//! core waits inside `shm_mq_receive` for the worker it needs, which would never return
//! for a pool worker that dies before it attaches to its queue; here every wait goes
//! through `tickets::wait_ticket`, which also watches the pool worker (as the Gather's
//! round-robin reading does).
//!
//! A slot keeps the tuple as the queue holds it, without a copy: a queue's message
//! stays valid until the next read of that queue, and a participant is read again only
//! after its tuple has been returned and the node has been called again, when the
//! executor no longer needs it.
//!
//! Runs outside pgrx's error boundary, as leader.rs does: the frames hold nothing with a
//! destructor.

use super::ffi::*;
use super::gathers::PoolGather;
use super::port::{exec_clear_tuple, tup_is_null};
use super::tickets::{self, Read};
use pgrx::pg_sys;
use std::ffi::c_void;

/// The node's heap (lib/binaryheap.h, bound here as an opaque pointer).
unsafe fn heap(node: *mut pg_sys::GatherMergeState) -> *mut c_void {
    // SAFETY: the caller's GatherMergeState, set up by ExecInitGatherMerge.
    unsafe { (*node).gm_heap.cast() }
}

fn participant(i: usize) -> pg_sys::Datum {
    pg_sys::Datum::from(i)
}

/// A round's start (after `start_round` posted the tickets): the merge is set up again
/// at the first tuple, over empty slots.
///
/// # Safety
/// `node` is the Gather Merge state that `pg` runs.
pub(super) unsafe fn round_started(node: *mut pg_sys::GatherMergeState, pg: *mut PoolGather) {
    // SAFETY: the caller's promise.
    unsafe {
        tickets::clear_worker_slots(node);
        (*node).gm_initialized = false;
        (*pg).in_heap = 0;
    }
}

/// The next tuple in merge order, or null after the last one (the round is finished
/// then).
///
/// # Safety
/// `node` is the Gather Merge state that `pg` runs, its round started.
pub(super) unsafe fn getnext(
    node: *mut pg_sys::GatherMergeState,
    pg: *mut PoolGather,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the caller's promise.
    unsafe {
        let heap = heap(node);
        if !(*node).gm_initialized {
            first_tuples(node, pg);
        } else {
            // The participant whose tuple was returned last: its next tuple may sort
            // elsewhere in the heap.
            let first = binaryheap_first(heap);
            if next_tuple(node, pg, first.value(), true) {
                binaryheap_replace_first(heap, first);
            } else {
                binaryheap_remove_first(heap);
                (*pg).in_heap -= 1;
            }
        }
        if (*pg).in_heap == 0 {
            tickets::end_of_tuples(pg);
            return std::ptr::null_mut();
        }
        *(*node).gm_slots.add(binaryheap_first(heap).value())
    }
}

/// Fills the heap with the first tuple of every participant that has one: the workers'
/// that are ready, then the leader's own (while the workers go on), then those the
/// workers are still producing; then the leader's, if it took over a worker's part
/// meanwhile (tickets::take_over_declined).
unsafe fn first_tuples(node: *mut pg_sys::GatherMergeState, pg: *mut PoolGather) {
    // SAFETY: the caller's promise (getnext).
    unsafe {
        let heap = heap(node);
        binaryheap_reset(heap);
        (*pg).in_heap = 0;
        let workers = (*pg).nslots;
        let add = |p: usize| {
            binaryheap_add_unordered(heap, participant(p));
            (*pg).in_heap += 1;
        };
        for p in 1..=workers {
            if next_tuple(node, pg, p, false) {
                add(p);
            }
        }
        let mut leader_read = (*node).need_to_scan_locally;
        if next_tuple(node, pg, 0, true) {
            add(0);
        }
        for p in 1..=workers {
            let slot = *(*node).gm_slots.add(p);
            if tup_is_null(slot) && next_tuple(node, pg, p, true) {
                add(p);
            }
            if !leader_read && (*node).need_to_scan_locally {
                leader_read = true;
                if next_tuple(node, pg, 0, true) {
                    add(0);
                }
            }
        }
        binaryheap_build(heap);
        (*node).gm_initialized = true;
    }
}

/// Puts participant `p`'s next tuple in its slot (0: the leader runs the plan itself).
/// Returns false when it has none: finished, or, unless `wait`, not ready yet.
unsafe fn next_tuple(
    node: *mut pg_sys::GatherMergeState,
    pg: *mut PoolGather,
    p: usize,
    wait: bool,
) -> bool {
    // SAFETY: the caller's promise (getnext); p <= nslots.
    unsafe {
        if p == 0 {
            if !(*node).need_to_scan_locally {
                return false;
            }
            let slot = tickets::scan_locally(pg, &raw mut (*node).ps, (*node).pei);
            if tup_is_null(slot) {
                (*node).need_to_scan_locally = false;
                return false;
            }
            *(*node).gm_slots = slot;
            return true;
        }
        let tup = if wait {
            tickets::wait_ticket(pg, p - 1)
        } else {
            match tickets::read_ticket(pg, p - 1) {
                Read::Tuple(tup) => tup,
                Read::Empty | Read::Done => std::ptr::null_mut(),
            }
        };
        let slot = *(*node).gm_slots.add(p);
        if tup.is_null() {
            // Its last tuple, already returned, may point into the queue's old message.
            exec_clear_tuple(slot);
            return false;
        }
        ExecStoreMinimalTuple(tup, slot, false);
        true
    }
}
