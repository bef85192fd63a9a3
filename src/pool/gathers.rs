//! The pool's state of each Gather and Gather Merge state of the running statement
//! ([`PoolGather`]), kept per executor node for a transaction's worth, and what
//! EXPLAIN and a rescan read of it. The rounds themselves are tickets.rs's.
//!
//! These functions run outside pgrx's error boundary (leader.rs's module comment).

use super::ffi::*;
use super::shared::{Fallback, FALLBACK_NAMES, MAX_TICKETS};
use crate::parallel;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_void};

/// A Gather's or a Gather Merge's executor state: the pool runs both the same way, and
/// only their reading differs (round-robin in leader.rs, merged in gather_merge.rs).
#[derive(Clone, Copy)]
pub(super) enum GatherNode {
    Gather(*mut pg_sys::GatherState),
    Merge(*mut pg_sys::GatherMergeState),
}

/// A field that GatherState and GatherMergeState both have, by name.
macro_rules! state_field {
    ($node:expr, $field:ident) => {
        match $node {
            GatherNode::Gather(n) => &raw mut (*n).$field,
            GatherNode::Merge(n) => &raw mut (*n).$field,
        }
    };
}
/// A field that the Gather and the Gather Merge plan nodes both have, by name.
macro_rules! plan_field {
    ($node:expr, $field:ident) => {
        match $node {
            GatherNode::Gather(n) => (*(*n).ps.plan.cast::<pg_sys::Gather>()).$field,
            GatherNode::Merge(n) => (*(*n).ps.plan.cast::<pg_sys::GatherMerge>()).$field,
        }
    };
}
pub(super) use {plan_field, state_field};
impl GatherNode {
    /// `ps` as a Gather or Gather Merge state, or `None` for another node.
    ///
    /// # Safety
    /// `ps` is a valid PlanState.
    pub(super) unsafe fn of(ps: *mut pg_sys::PlanState) -> Option<GatherNode> {
        // SAFETY: the caller's promise; the tag tells the state's type.
        match unsafe { (*ps).type_ } {
            pg_sys::NodeTag::T_GatherState => Some(GatherNode::Gather(ps.cast())),
            pg_sys::NodeTag::T_GatherMergeState => Some(GatherNode::Merge(ps.cast())),
            _ => None,
        }
    }

    pub(super) fn ps(self) -> *mut pg_sys::PlanState {
        match self {
            GatherNode::Gather(n) => n.cast(),
            GatherNode::Merge(n) => n.cast(),
        }
    }
}

/// The pool state of one Gather or Gather Merge state, in TopTransactionContext (as the
/// parallel context is), so that the DSM-detach callback may read it during an abort.
#[repr(C)]
pub struct PoolGather {
    /// The ExecProcNode the pool installed on the node (leader.rs).
    pub(super) exec: pg_sys::ExecProcNodeMtd,
    pub(super) node: *mut pg_sys::PlanState,
    pub(super) stock: pg_sys::ExecProcNodeMtd,
    pub(super) registered_seg: *mut pg_sys::dsm_segment,
    pub(super) pei: *mut ParallelExecutorInfo,
    /// Tickets of the current round may not be done yet.
    pub(super) active: bool,
    pub(super) tqueues_detached: bool,
    pub(super) nslots: usize,
    pub(super) slot: [usize; MAX_TICKETS],
    pub(super) gen: [u64; MAX_TICKETS],
    pub(super) tqueue: [*mut pg_sys::shm_mq_handle; MAX_TICKETS],
    /// Ticket i's tuple-queue reader; null once its queue is finished.
    pub(super) reader: [*mut c_void; MAX_TICKETS],
    pub(super) got_x: [bool; MAX_TICKETS],
    pub(super) finished: [bool; MAX_TICKETS],
    /// Ticket indexes of the readers still open, round-robin.
    pub(super) order: [usize; MAX_TICKETS],
    pub(super) nreaders: usize,
    pub(super) nextreader: usize,
    /// Rounds (first run and rescans) that pool workers took, and that the pool
    /// declined, for EXPLAIN ANALYZE.
    pub(super) rounds_pooled: u32,
    pub(super) rounds_declined: u32,
    /// Rounds the leader ran alone while a command waited for the database to empty.
    pub(super) rounds_alone: u32,
    /// 1 + the [`Fallback`] that last made a round run PostgreSQL's way; 0: none.
    pub(super) declined: usize,
    /// How many participants a Gather Merge's heap holds.
    pub(super) in_heap: usize,
    /// The leader runs the plan itself in this round (need_to_scan_locally at its
    /// start): a worker that declines its ticket then leaves no work undone, since the
    /// leader claims whatever no participant took.
    pub(super) leader_participates: bool,
    /// The round's leader part runs watched (failure_watch.rs): the timer is on until
    /// the round ends.
    pub(super) watching: bool,
}

/// Gathers this backend replaced, by node (a transaction's worth; cleared at its end).
const MAP_SIZE: usize = 64;

static mut MAP: [(*mut pg_sys::PlanState, *mut PoolGather); MAP_SIZE] =
    [(std::ptr::null_mut(), std::ptr::null_mut()); MAP_SIZE];

static mut MAP_LEN: usize = 0;

/// Forgets the Gathers of the transaction that ended. Cannot panic.
pub fn transaction_ended() {
    // SAFETY: process-local; the entries point into TopTransactionContext, gone now.
    unsafe { MAP_LEN = 0 };
}

pub(super) unsafe fn lookup(node: *mut pg_sys::PlanState) -> *mut PoolGather {
    // SAFETY: process-local.
    unsafe {
        #[allow(clippy::deref_addrof)]
        let map = &*&raw const MAP;
        for &(n, pg) in &map[..MAP_LEN] {
            if n == node {
                return pg;
            }
        }
        std::ptr::null_mut()
    }
}

/// Whether [`remember`] can take a node it does not hold yet.
pub(super) fn has_room() -> bool {
    // SAFETY: process-local.
    unsafe { MAP_LEN < MAP_SIZE }
}

pub(super) unsafe fn remember(node: *mut pg_sys::PlanState, pg: *mut PoolGather) -> bool {
    // SAFETY: process-local.
    unsafe {
        #[allow(clippy::deref_addrof)]
        let map = &mut *&raw mut MAP;
        for entry in &mut map[..MAP_LEN] {
            if entry.0 == node {
                entry.1 = pg;
                return true;
            }
        }
        if MAP_LEN == MAP_SIZE {
            return false;
        }
        map[MAP_LEN] = (node, pg);
        MAP_LEN += 1;
        true
    }
}

/// After the rescan of a Stride Gather's Gather (Merge) state `inner`: when the pool declined
/// an earlier round only because no pool worker was idle (the database's pool was still
/// starting, or busy), the next round asks the pool again instead of staying with
/// PostgreSQL's workers for every rescan. ExecReScanGather has waited for those workers
/// to finish; ExecParallelReinitialize waits for them to exit before the pool's round.
///
/// # Safety
/// `inner` is the state of a Gather or Gather Merge of the running statement.
pub(super) unsafe fn rescanned(inner: *mut pg_sys::PlanState) {
    // SAFETY: the caller's promise; our state of the Gather, if any.
    unsafe {
        let pg = lookup(inner);
        if !pg.is_null() && (*pg).declined == Fallback::NoIdleWorker as usize + 1 {
            pg_sys::ExecSetExecProcNode(inner, (*pg).exec);
        }
    }
}

/// What EXPLAIN ANALYZE VERBOSE says of the pool for the Gather (or Gather Merge)
/// state `inner` of a Stride Gather: "used", or why not. A palloc'd string.
///
/// # Safety
/// `inner` is the state of a Gather or Gather Merge of the running statement.
pub(super) unsafe fn describe_pool_use(inner: *mut pg_sys::PlanState) -> *mut c_char {
    // SAFETY: the caller's promise; our state of the Gather, if any, is this
    // transaction's.
    unsafe {
        let not_used =
            |why: &str| psprintf(c"not used: %.*s".as_ptr(), why.len() as c_int, why.as_ptr());
        let pg = lookup(inner);
        if pg.is_null() {
            return pstrdup(if parallel::pool_mode() {
                c"not used".as_ptr()
            } else {
                c"not used: parallel_mode is not pool".as_ptr()
            });
        }
        let (pooled, declined) = ((*pg).rounds_pooled, (*pg).rounds_declined);
        if pooled == 0 && declined == 0 && (*pg).rounds_alone > 0 {
            return not_used("a database command waits for the database to empty");
        }
        match (*pg).declined.checked_sub(1).map(|i| FALLBACK_NAMES[i]) {
            None if pooled > 1 => psprintf(c"used, %u rounds".as_ptr(), pooled),
            None => pstrdup(c"used".as_ptr()),
            Some(why) if pooled == 0 => not_used(why),
            Some(why) => psprintf(
                c"used for %u of %u rounds (others: %.*s)".as_ptr(),
                pooled,
                pooled + declined,
                why.len() as c_int,
                why.as_ptr(),
            ),
        }
    }
}
