//! The leader side (POOL.md §3, approach B): at ExecutorStart, the ExecProcNode of
//! each GatherState and GatherMergeState is replaced by [`pool_exec_gather`], which
//! does what ExecGather's (ExecGatherMerge's) first call does — ExecInitParallelPlan —
//! but posts tickets to idle pool workers instead of LaunchParallelWorkers. Core never
//! sees the pool workers as its workers (`nworkers_launched` stays 0): this module
//! reads their tuple queues (a Gather Merge's through gather_merge.rs) and error queues
//! itself, and an `on_dsm_detach` callback on the parallel context's
//! segment cancels and waits for them on every path out of the Gather (its end, LIMIT,
//! ERROR, cancel, FATAL), before the leader can finish its transaction or exit.
//!
//! The functions the executor calls here run outside pgrx's error boundary (like the
//! hooks of executor.rs): an ERROR longjmps through them, so their frames hold nothing
//! with a destructor.

use super::ffi::*;
use super::shared::{self, Counter, Fallback, PoolShared, Slot, State, FALLBACK_NAMES};
use super::{gather_merge, identity, stride_gather};
use crate::gucs;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Most pool workers one Gather uses.
pub const MAX_TICKETS: usize = 16;
/// After this long waiting for cancelled pool workers, they get SIGTERM.
const TERM_AFTER: Duration = Duration::from_secs(5);

/// A Gather's or a Gather Merge's executor state: the pool runs both the same way, and
/// only their reading differs (round-robin here, merged in gather_merge.rs).
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

    fn ps(self) -> *mut pg_sys::PlanState {
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
    node: *mut pg_sys::PlanState,
    stock: pg_sys::ExecProcNodeMtd,
    registered_seg: *mut pg_sys::dsm_segment,
    pei: *mut ParallelExecutorInfo,
    /// Tickets of the current round may not be done yet.
    active: bool,
    tqueues_detached: bool,
    pub(super) nslots: usize,
    slot: [usize; MAX_TICKETS],
    gen: [u64; MAX_TICKETS],
    tqueue: [*mut pg_sys::shm_mq_handle; MAX_TICKETS],
    /// Ticket i's tuple-queue reader; null once its queue is finished.
    pub(super) reader: [*mut c_void; MAX_TICKETS],
    got_x: [bool; MAX_TICKETS],
    finished: [bool; MAX_TICKETS],
    /// Ticket indexes of the readers still open, round-robin.
    order: [usize; MAX_TICKETS],
    nreaders: usize,
    nextreader: usize,
    /// Rounds (first run and rescans) that pool workers took, and that the pool
    /// declined, for EXPLAIN ANALYZE.
    rounds_pooled: u32,
    rounds_declined: u32,
    /// 1 + the [`Fallback`] that last made a round run PostgreSQL's way; 0: none.
    declined: usize,
    /// How many participants a Gather Merge's heap holds.
    pub(super) in_heap: usize,
    /// The leader runs the plan itself in this round (need_to_scan_locally at its
    /// start): a worker that declines its ticket then leaves no work undone, since the
    /// leader claims whatever no participant took.
    leader_participates: bool,
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

unsafe fn lookup(node: *mut pg_sys::PlanState) -> *mut PoolGather {
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

unsafe fn remember(node: *mut pg_sys::PlanState, pg: *mut PoolGather) -> bool {
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

// ---------------------------------------------------------------- ExecutorStart

/// Replaces the ExecProcNode of every Gather and Gather Merge of `desc`'s plan,
/// and makes sure this database has its pool workers. Called (guarded) after
/// standard_ExecutorStart.
pub fn executor_started(desc: *mut pg_sys::QueryDesc) {
    let Some(pool) = shared::shared() else { return };
    // SAFETY: ExecutorStart's QueryDesc, with its planstate built.
    unsafe {
        let estate = (*desc).estate;
        // es_use_parallel_mode is only set by ExecutorRun: the plan's flag here.
        if estate.is_null()
            || !(*(*desc).plannedstmt).parallelModeNeeded
            || (*desc).planstate.is_null()
        {
            return;
        }
        let mut found = 0usize;
        walk((*desc).planstate, &mut found);
        if found > 0 {
            super::lifecycle::ensure_pool(pool, pg_sys::MyDatabaseId);
        }
    }
}

unsafe fn walk(planstate: *mut pg_sys::PlanState, found: &mut usize) {
    unsafe extern "C-unwind" fn visit(ps: *mut pg_sys::PlanState, context: *mut c_void) -> bool {
        // SAFETY: called by planstate_tree_walker with the counter we passed.
        unsafe {
            consider(ps, &mut *context.cast::<usize>());
            pg_sys::planstate_tree_walker(ps, Some(visit), context)
        }
    }
    // SAFETY: a valid PlanState tree.
    unsafe {
        consider(planstate, found);
        pg_sys::planstate_tree_walker(planstate, Some(visit), (found as *mut usize).cast());
    }
}

unsafe fn consider(ps: *mut pg_sys::PlanState, found: &mut usize) {
    // SAFETY: a valid PlanState; GatherNode::of reads its tag.
    unsafe {
        if let Some(inner) = stride_gather::inner_state(ps) {
            consider(inner, found);
            return;
        }
        let Some(node) = GatherNode::of(ps) else {
            return;
        };
        if plan_field!(node, num_workers) <= 0 {
            return;
        }
        // rescan_param is set on every Gather (create_gather_plan): a rescan is handled
        // by waiting for the previous round (start_round).
        let pg = MemoryContextAllocZero(
            pg_sys::TopTransactionContext,
            std::mem::size_of::<PoolGather>(),
        )
        .cast::<PoolGather>();
        (*pg).node = ps;
        (*pg).stock = (*ps).ExecProcNodeReal;
        if !remember(ps, pg) {
            return;
        }
        pg_sys::ExecSetExecProcNode(ps, Some(pool_exec_gather));
        *found += 1;
    }
}

// ---------------------------------------------------------------- the Gather

pub(super) unsafe fn tup_is_null(slot: *mut pg_sys::TupleTableSlot) -> bool {
    // SAFETY: null or a valid slot.
    unsafe { slot.is_null() || (*slot).tts_flags & TTS_FLAG_EMPTY != 0 }
}

pub(super) unsafe fn exec_clear_tuple(
    slot: *mut pg_sys::TupleTableSlot,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: a valid slot; ExecClearTuple is an inline call of its clear callback.
    unsafe {
        if let Some(clear) = (*(*slot).tts_ops).clear {
            clear(slot);
        }
        slot
    }
}

pub(super) unsafe fn exec_proc_node(node: *mut pg_sys::PlanState) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: ExecProcNode, an inline function of executor.h.
    unsafe {
        if !(*node).chgParam.is_null() {
            ExecReScan(node);
        }
        ((*node).ExecProcNode.unwrap())(node)
    }
}

/// The leader's own part of a Gather or Gather Merge (`ps`, with its parallel executor
/// info `pei`, null when no parallel context was built): runs the child plan for one
/// tuple with the context's DSA area installed, as ExecGather and ExecGatherMerge do.
pub(super) unsafe fn scan_locally(
    ps: *mut pg_sys::PlanState,
    pei: *mut pg_sys::ParallelExecutorInfo,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the caller's node, whose child the executor initialised.
    unsafe {
        let estate = (*ps).state;
        (*estate).es_query_dsa = if pei.is_null() {
            std::ptr::null_mut()
        } else {
            (*pei.cast::<ParallelExecutorInfo>()).area
        };
        let slot = exec_proc_node((*ps).lefttree);
        (*estate).es_query_dsa = std::ptr::null_mut();
        slot
    }
}

/// Raises an ERROR from code outside pgrx's boundary.
#[pgrx::pg_guard]
pub(super) unsafe extern "C-unwind" fn raise(message: *const c_char) {
    // SAFETY: callers pass a NUL-terminated literal.
    let message = unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy();
    pgrx::error!("{message}");
}

/// The Gather's (or Gather Merge's) ExecProcNode while the pool runs it.
unsafe extern "C-unwind" fn pool_exec_gather(
    pstate: *mut pg_sys::PlanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor calls this with the state it was installed on, a Gather or
    // Gather Merge state; see the module comment for the frames.
    unsafe {
        let pg = lookup(pstate);
        let Some(node) = GatherNode::of(pstate).filter(|_| !pg.is_null()) else {
            raise(c"pg_stride pool: lost the state of a Gather node".as_ptr());
            return std::ptr::null_mut();
        };
        check_for_interrupts();
        if !*state_field!(node, initialized) && !start_round(node, pg) {
            // Declined: PostgreSQL's own ExecGather from now on, unless the rescan of a
            // Stride Gather gives the pool another chance (`rescanned`).
            pg_sys::ExecSetExecProcNode(pstate, (*pg).stock);
            return ((*pg).stock.unwrap())(pstate);
        }
        let econtext = (*pstate).ps_ExprContext;
        MemoryContextReset((*econtext).ecxt_per_tuple_memory);
        let slot = match node {
            GatherNode::Gather(gather) => getnext(gather, pg),
            GatherNode::Merge(merge) => gather_merge::getnext(merge, pg),
        };
        if tup_is_null(slot) {
            return std::ptr::null_mut();
        }
        let projection = (*pstate).ps_ProjInfo;
        if projection.is_null() {
            return slot;
        }
        (*econtext).ecxt_outertuple = slot;
        exec_project(projection)
    }
}

/// ExecProject, an inline function of executor.h: evaluates the projection into its
/// result slot, in the per-tuple memory of its expression context.
unsafe fn exec_project(projection: *mut pg_sys::ProjectionInfo) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the Gather's ProjectionInfo, built by ExecInitGather (ExecAssignProjectionInfo)
    // over its outer tuple, which the caller set.
    unsafe {
        let econtext = (*projection).pi_exprContext;
        let state = &raw mut (*projection).pi_state;
        let slot = exec_clear_tuple((*state).resultslot);
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = (*econtext).ecxt_per_tuple_memory;
        // From 18 on a projection's program ends in EEOP_DONE_NO_RETURN, which asserts a
        // null isnull (ExecEvalExprNoReturn); before, ExecProject passes a dummy.
        #[cfg(feature = "pg18")]
        let isnull = std::ptr::null_mut();
        #[cfg(not(feature = "pg18"))]
        let isnull = &mut false as *mut bool;
        ((*state).evalfunc.unwrap())(state, econtext, isnull);
        pg_sys::CurrentMemoryContext = previous;
        (*slot).tts_flags &= !TTS_FLAG_EMPTY;
        (*slot).tts_nvalid = (*(*slot).tts_tupleDescriptor).natts as pg_sys::AttrNumber;
        slot
    }
}

/// ExecGather's (ExecGatherMerge's) first-call initialisation, with tickets instead of
/// forked workers. Returns false (declines) when the node must run the stock way.
unsafe fn start_round(node: GatherNode, pg: *mut PoolGather) -> bool {
    // SAFETY: the executor's Gather or Gather Merge state and our state of it.
    unsafe {
        let Some(pool) = shared::shared() else {
            return false;
        };
        let ps = node.ps();
        let estate = (*ps).state;
        let num_workers = plan_field!(node, num_workers);
        let init_param = plan_field!(node, initParam);
        if !(num_workers > 0 && (*estate).es_use_parallel_mode) {
            return false;
        }
        if (*pg).active {
            // A rescan: the previous round's workers must be gone from the DSM before
            // ExecParallelReinitialize recreates its queues.
            wait_round(pool, pg, true, false);
        }
        if let Some(why) = super::compat::unavailable(pool) {
            return decline(pool, pg, why);
        }
        if crate::pg::top_transaction_id_if_any() != pg_sys::InvalidTransactionId {
            return decline(pool, pg, Fallback::Xid);
        }
        if pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as c_int {
            return decline(pool, pg, Fallback::Serializable);
        }
        if idle_workers(pool) == 0 && !wait_for_starting_worker(pool) {
            return decline(pool, pg, Fallback::NoIdleWorker);
        }
        // The initPlans whose values the fragment needs run here, in the leader, and
        // ExecInitParallelPlan / ExecParallelReinitialize send their values along, as
        // ExecGather does (GetPerTupleExprContext, a macro).
        if !init_param.is_null() {
            let econtext = if (*estate).es_per_tuple_exprcontext.is_null() {
                MakePerTupleExprContext(estate)
            } else {
                (*estate).es_per_tuple_exprcontext
            };
            ExecSetParamPlanMulti(init_param, econtext);
        }
        let outer = (*ps).lefttree;
        let node_pei = state_field!(node, pei);
        if (*node_pei).is_null() {
            *node_pei = ExecInitParallelPlan(
                outer,
                estate,
                init_param,
                num_workers,
                *state_field!(node, tuples_needed),
            )
            .cast();
        } else {
            ExecParallelReinitialize(outer, (*node_pei).cast(), init_param);
        }
        let pei = (*node_pei).cast::<ParallelExecutorInfo>();
        (*pg).pei = pei;
        let pcxt = (*pei).pcxt;
        (*pg).nslots = 0;
        (*pg).nreaders = 0;
        (*pg).nextreader = 0;
        (*pg).tqueues_detached = false;
        if (*pcxt).seg.is_null() || (*pcxt).nworkers == 0 {
            decline(pool, pg, Fallback::NoDsm);
        } else {
            if (*pg).registered_seg != (*pcxt).seg {
                on_dsm_detach(
                    (*pcxt).seg,
                    Some(on_detach),
                    pg_sys::Datum::from(pg.cast::<c_void>()),
                );
                (*pg).registered_seg = (*pcxt).seg;
            }
            BecomeLockGroupLeader();
            let want = ((*pcxt).nworkers_to_launch.max(0) as usize).min(MAX_TICKETS);
            post_tickets(pool, pg, (*pcxt).seg, want);
            if (*pg).nslots < want {
                pool.count(Counter::TicketsShort);
            }
            for i in 0..(*pg).nslots {
                (*pg).tqueue[i] = *(*pei).tqueue.add(i);
                (*pg).reader[i] = CreateTupleQueueReader((*pg).tqueue[i]);
                (*pg).got_x[i] = false;
                (*pg).finished[i] = false;
                (*pg).order[i] = i;
            }
            (*pg).nreaders = (*pg).nslots;
            (*pg).active = (*pg).nslots > 0;
            (*pg).rounds_pooled += u32::from((*pg).active);
        }
        // Core's fields stay those of a node that launched no worker of its own (the
        // module comment); EXPLAIN reads nworkers_launched.
        *state_field!(node, nworkers_launched) = (*pg).nslots as c_int;
        *state_field!(node, nreaders) = 0;
        *state_field!(node, reader) = std::ptr::null_mut();
        let single_copy = match node {
            GatherNode::Gather(gather) => {
                (*gather).nextreader = 0;
                (*(*gather).ps.plan.cast::<pg_sys::Gather>()).single_copy
            }
            GatherNode::Merge(merge) => {
                gather_merge::round_started(merge, pg);
                false
            }
        };
        *state_field!(node, need_to_scan_locally) =
            (*pg).nslots == 0 || (!single_copy && pg_sys::parallel_leader_participation);
        (*pg).leader_participates = *state_field!(node, need_to_scan_locally);
        *state_field!(node, initialized) = true;
        pool.count(Counter::GathersPooled);
        true
    }
}

/// Counts the Gather's fallback and notes it for EXPLAIN. Returns false (declined).
unsafe fn decline(pool: &PoolShared, pg: *mut PoolGather, why: Fallback) -> bool {
    // SAFETY: a global set at connection; our state of the Gather.
    unsafe {
        pool.fall_back(pg_sys::MyDatabaseId, why);
        (*pg).declined = why as usize + 1;
        (*pg).rounds_declined += 1;
    }
    false
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
            pg_sys::ExecSetExecProcNode(inner, Some(pool_exec_gather));
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
            return pstrdup(if gucs::pool_mode() {
                c"not used".as_ptr()
            } else {
                c"not used: parallel_mode is not pool".as_ptr()
            });
        }
        let (pooled, declined) = ((*pg).rounds_pooled, (*pg).rounds_declined);
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

fn idle_workers(pool: &PoolShared) -> usize {
    pool.slots
        .iter()
        .filter(|s| s.load().1 == State::Idle && serves_this_leader(s))
        .count()
}

/// Whether the pool worker of `slot` may run this backend's fragments: it is connected
/// to this database, not retiring, and its `system_user` is unset unless this leader
/// has one too (identity.rs).
fn serves_this_leader(slot: &Slot) -> bool {
    // SAFETY: a global set at connection.
    slot.database.load(Ordering::Acquire) == u32::from(unsafe { pg_sys::MyDatabaseId })
        && !slot.retire.load(Ordering::Acquire)
        && (identity::leader_has_system_user() || !slot.system_user_set.load(Ordering::Acquire))
}

/// How long a Gather waits for a pool worker of its database that is being started
/// (fork, connection, baseline) before it runs with PostgreSQL's own workers.
const START_WAIT: Duration = Duration::from_millis(20);

/// When this database has no idle pool worker but some are starting: waits up to
/// START_WAIT for one to become idle. Returns whether one did.
fn wait_for_starting_worker(pool: &PoolShared) -> bool {
    // SAFETY: a global set at connection.
    let database = u32::from(unsafe { pg_sys::MyDatabaseId });
    let starting = pool.slots.iter().any(|s| {
        matches!(s.load().1, State::Starting | State::Connecting)
            && s.database.load(Ordering::Acquire) == database
    });
    if !starting {
        return false;
    }
    let deadline = Instant::now() + START_WAIT;
    while Instant::now() < deadline {
        // SAFETY: a short latch wait; interrupts are checked by the caller's loop.
        unsafe { wait_latch(Some(1), wait_event::EXECUTE_GATHER) };
        if pool
            .slots
            .iter()
            .any(|s| s.load().1 == State::Idle && serves_this_leader(s))
        {
            pool.count(Counter::WaitedForStart);
            return true;
        }
    }
    false
}

/// Reserves up to `want` idle workers of this database and posts each a ticket: ticket
/// i runs as parallel worker number i of the context.
unsafe fn post_tickets(
    pool: &PoolShared,
    pg: *mut PoolGather,
    seg: *mut pg_sys::dsm_segment,
    want: usize,
) {
    // SAFETY: our state; the segment is the parallel context's.
    unsafe {
        let handle = dsm_segment_handle(seg);
        let nworkers = (*(*(*pg).pei).pcxt).nworkers;
        for (index, slot) in pool.slots.iter().enumerate() {
            if (*pg).nslots >= want {
                break;
            }
            let (g, s) = slot.load();
            if s != State::Idle || !serves_this_leader(slot) {
                continue;
            }
            if !slot.cas((g, State::Idle), (g + 1, State::Reserved)) {
                continue;
            }
            let i = (*pg).nslots;
            slot.t_dsm.store(handle, Ordering::Relaxed);
            // A test build may post the first ticket with a number past the context's
            // workers, to show that the worker declines it and the leader does its part.
            let number = if i == 0 && crate::pg::test_fault("pool_ticket_out_of_range") {
                nworkers
            } else {
                i as i32
            };
            slot.t_worker_number.store(number, Ordering::Relaxed);
            slot.t_nworkers.store(nworkers, Ordering::Relaxed);
            slot.t_leader_procno
                .store(super::my_procno(), Ordering::Relaxed);
            slot.t_posted_ns
                .store(crate::pg::monotonic_ns(), Ordering::Relaxed);
            slot.leader_pid.store(pg_sys::MyProcPid, Ordering::Relaxed);
            if !slot.cas((g + 1, State::Reserved), (g + 1, State::Posted)) {
                continue; // the worker exited meanwhile
            }
            (*pg).slot[i] = index;
            (*pg).gen[i] = g + 1;
            (*pg).nslots += 1;
            pool.count(Counter::TicketsPosted);
            super::set_latch_of(slot.procno.load(Ordering::Acquire));
        }
    }
}

/// gather_getnext over the pool workers' queues and the leader's own part.
unsafe fn getnext(
    node: *mut pg_sys::GatherState,
    pg: *mut PoolGather,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor's node and our state of it.
    unsafe {
        let fslot = (*node).funnel_slot;
        while (*pg).nreaders > 0 || (*node).need_to_scan_locally {
            check_for_interrupts();
            if (*pg).nreaders > 0 {
                let tup = readnext(node, pg);
                if !tup.is_null() {
                    ExecStoreMinimalTuple(tup, fslot, false);
                    return fslot;
                }
            }
            if (*node).need_to_scan_locally {
                let outslot = scan_locally(&raw mut (*node).ps, (*node).pei);
                if !tup_is_null(outslot) {
                    return outslot;
                }
                (*node).need_to_scan_locally = false;
            }
        }
        end_of_tuples(pg);
        exec_clear_tuple(fslot)
    }
}

/// Every participant is out of tuples: finishes the round, once.
pub(super) unsafe fn end_of_tuples(pg: *mut PoolGather) {
    // SAFETY: our state.
    unsafe {
        if (*pg).active && !(*pg).tqueues_detached {
            finish_round(pg);
        }
    }
}

/// What reading a ticket's tuple queue gave.
pub(super) enum Read {
    /// A tuple, valid until the next read of the same queue.
    Tuple(pg_sys::MinimalTuple),
    /// Nothing yet.
    Empty,
    /// The queue is finished (its reader is dropped).
    Done,
}

/// Reads ticket `i`'s next tuple without waiting.
pub(super) unsafe fn read_ticket(pg: *mut PoolGather, i: usize) -> Read {
    // SAFETY: our state; i < nslots.
    unsafe {
        if (*pg).reader[i].is_null() {
            return Read::Done;
        }
        let mut done = false;
        let tup = TupleQueueReaderNext((*pg).reader[i], true, &mut done);
        if done {
            if let Some(position) = (0..(*pg).nreaders).find(|&p| (*pg).order[p] == i) {
                drop_reader(pg, position);
            }
            return Read::Done;
        }
        if tup.is_null() {
            Read::Empty
        } else {
            Read::Tuple(tup)
        }
    }
}

/// Waits for ticket `i`'s next tuple: null once its queue is finished. A worker's
/// ERROR, or a worker lost after it took work, raises an ERROR here (`poll`).
pub(super) unsafe fn wait_ticket(pg: *mut PoolGather, i: usize) -> pg_sys::MinimalTuple {
    // SAFETY: our state; i < nslots.
    unsafe {
        loop {
            check_for_interrupts();
            match read_ticket(pg, i) {
                Read::Tuple(tup) => return tup,
                Read::Done => return std::ptr::null_mut(),
                Read::Empty => {}
            }
            poll(pg, true);
            if (*pg).reader[i].is_null() {
                return std::ptr::null_mut();
            }
            wait_latch(None, wait_event::EXECUTE_GATHER);
        }
    }
}

unsafe fn drop_reader(pg: *mut PoolGather, position: usize) {
    // SAFETY: our state; position < nreaders.
    unsafe {
        let i = (*pg).order[position];
        DestroyTupleQueueReader((*pg).reader[i]);
        (*pg).reader[i] = std::ptr::null_mut();
        for p in position..(*pg).nreaders - 1 {
            (*pg).order[p] = (*pg).order[p + 1];
        }
        (*pg).nreaders -= 1;
        if (*pg).nextreader >= (*pg).nreaders {
            (*pg).nextreader = 0;
        }
    }
}

/// gather_readnext: a tuple from some pool worker, or null when the leader should scan
/// locally or every queue is finished.
unsafe fn readnext(node: *mut pg_sys::GatherState, pg: *mut PoolGather) -> pg_sys::MinimalTuple {
    // SAFETY: our state; readers of this round.
    unsafe {
        let mut nvisited = 0;
        loop {
            check_for_interrupts();
            let i = (*pg).order[(*pg).nextreader];
            let mut done = false;
            let tup = TupleQueueReaderNext((*pg).reader[i], true, &mut done);
            if done {
                drop_reader(pg, (*pg).nextreader);
                if (*pg).nreaders == 0 {
                    finish_round(pg);
                    return std::ptr::null_mut();
                }
                continue;
            }
            if !tup.is_null() {
                return tup;
            }
            (*pg).nextreader = ((*pg).nextreader + 1) % (*pg).nreaders;
            nvisited += 1;
            if nvisited >= (*pg).nreaders {
                if (*node).need_to_scan_locally {
                    return std::ptr::null_mut();
                }
                if poll(pg, true) {
                    if (*pg).nreaders == 0 {
                        finish_round(pg);
                        return std::ptr::null_mut();
                    }
                    nvisited = 0;
                    continue;
                }
                wait_latch(None, wait_event::EXECUTE_GATHER);
                nvisited = 0;
            }
        }
    }
}

/// Reads the error queue of ticket `i`: rethrows an ERROR or a notice (when `rethrow`),
/// notes 'X'. Returns whether the queue is detached.
unsafe fn drain(pg: *mut PoolGather, i: usize, rethrow: bool) -> bool {
    // SAFETY: the parallel context's error queue handle for worker number i, valid
    // until the context is destroyed (TopTransactionContext).
    unsafe {
        let pcxt = (*(*pg).pei).pcxt;
        let mqh = (*(*pcxt).worker.add(i)).error_mqh;
        if mqh.is_null() {
            return true;
        }
        loop {
            let mut nbytes = 0usize;
            let mut data: *mut c_void = std::ptr::null_mut();
            match shm_mq_receive(mqh, &mut nbytes, &mut data, true) {
                pg_sys::shm_mq_result::SHM_MQ_WOULD_BLOCK => return false,
                pg_sys::shm_mq_result::SHM_MQ_SUCCESS => {}
                _ => return true,
            }
            if nbytes == 0 {
                continue;
            }
            let kind = *data.cast::<u8>();
            match kind {
                b'X' => (*pg).got_x[i] = true,
                b'E' | b'N' if rethrow => {
                    let mut msg: pg_sys::StringInfoData = std::mem::zeroed();
                    initStringInfo(&mut msg);
                    appendBinaryStringInfo(&mut msg, data.cast(), nbytes as c_int);
                    msg.cursor = 1;
                    let mut edata: pg_sys::ErrorData = std::mem::zeroed();
                    pq_parse_errornotice(&mut msg, &mut edata);
                    edata.elevel = edata.elevel.min(pgrx::PgLogLevel::ERROR as c_int);
                    edata.context = if edata.context.is_null() {
                        pstrdup(c"parallel worker".as_ptr())
                    } else {
                        psprintf(c"%s\nparallel worker".as_ptr(), edata.context)
                    };
                    let saved = pg_sys::error_context_stack;
                    pg_sys::error_context_stack = (*pcxt).error_context_stack;
                    ThrowErrorData(&mut edata);
                    pg_sys::error_context_stack = saved;
                }
                _ => {}
            }
        }
    }
}

extern "C-unwind" {
    fn initStringInfo(s: *mut pg_sys::StringInfoData);
    fn appendBinaryStringInfo(s: *mut pg_sys::StringInfoData, data: *const c_void, len: c_int);
}

/// Looks at every unfinished ticket: its messages, and whether its worker is done.
/// Returns whether a reader was dropped (a worker that took no work). With `rethrow`, a
/// worker's ERROR, or a worker lost after it took work, raises an ERROR here.
unsafe fn poll(pg: *mut PoolGather, rethrow: bool) -> bool {
    // SAFETY: our state.
    unsafe {
        let Some(pool) = shared::shared() else {
            return false;
        };
        let mut changed = false;
        for i in 0..(*pg).nslots {
            if (*pg).finished[i] {
                continue;
            }
            let slot = &pool.slots[(*pg).slot[i]];
            let gen = (*pg).gen[i];
            let was_done = slot.done(gen);
            let detached = drain(pg, i, rethrow);
            if (*pg).got_x[i] {
                (*pg).finished[i] = true;
                continue;
            }
            if !(was_done || detached) {
                continue;
            }
            let entered = slot.entered_gen.load(Ordering::SeqCst) == gen;
            if entered && rethrow {
                raise(c"lost connection to parallel worker (pg_stride pool)".as_ptr());
            }
            if !entered && !(*pg).leader_participates {
                take_over_declined(pg);
            }
            (*pg).finished[i] = true;
            for p in 0..(*pg).nreaders {
                if (*pg).order[p] == i {
                    drop_reader(pg, p);
                    changed = true;
                    break;
                }
            }
        }
        changed
    }
}

/// A worker gave its ticket back without doing any of the work, in a round the leader
/// does not take part in: nobody would claim that work. A Gather's leader runs the plan
/// itself from now on, as ExecGather does when it launched no worker; a Gather Merge's
/// heap was built without the leader, so the statement fails instead of returning
/// fewer rows.
unsafe fn take_over_declined(pg: *mut PoolGather) {
    // SAFETY: our state; its node is the Gather (Merge) state being run.
    unsafe {
        (*pg).leader_participates = true;
        match GatherNode::of((*pg).node) {
            Some(GatherNode::Gather(gather)) => (*gather).need_to_scan_locally = true,
            _ => raise(c"pg_stride pool: a pool worker could not take its part of a Gather Merge".as_ptr()),
        }
    }
}

/// The readers are all done: wait for every worker's 'X' (rethrowing errors), detach
/// the tuple queues and add the workers' buffer usage. The workers leave the lock group
/// right after; the DSM-detach callback waits for that.
unsafe fn finish_round(pg: *mut PoolGather) {
    // SAFETY: our state.
    unsafe {
        loop {
            poll(pg, true);
            if (0..(*pg).nslots).all(|i| (*pg).finished[i]) {
                break;
            }
            wait_latch(None, wait_event::PARALLEL_FINISH);
            check_for_interrupts();
        }
        detach_tqueues(pg);
        let pei = (*pg).pei;
        for i in 0..(*pg).nslots {
            if (*pg).got_x[i] {
                InstrAccumParallelQuery((*pei).buffer_usage.add(i), (*pei).wal_usage.add(i));
            }
        }
    }
}

/// Detaches this round's tuple queues. Not from the DSM-detach callback: a Gather
/// Merge's slots, which may point into the queues, are emptied first.
unsafe fn detach_tqueues(pg: *mut PoolGather) {
    // SAFETY: the handles of this round, each detached once.
    unsafe {
        if (*pg).tqueues_detached {
            return;
        }
        if let Some(GatherNode::Merge(merge)) = GatherNode::of((*pg).node) {
            gather_merge::clear_worker_slots(merge);
        }
        for i in 0..(*pg).nslots {
            if !(*pg).reader[i].is_null() {
                DestroyTupleQueueReader((*pg).reader[i]);
                (*pg).reader[i] = std::ptr::null_mut();
            }
            shm_mq_detach((*pg).tqueue[i]);
        }
        (*pg).nreaders = 0;
        (*pg).tqueues_detached = true;
    }
}

/// Asks ticket `gen` of `slot` to stop: revokes it if not taken yet, else cancels the
/// fragment (SIGINT after winning the CAS, see shared.rs).
fn cancel_ticket(pool: &PoolShared, slot: &Slot, gen: u64) {
    loop {
        let (g, s) = slot.load();
        if g != gen {
            return;
        }
        match s {
            State::Posted => {
                if slot.cas((g, State::Posted), (g, State::Idle)) {
                    return;
                }
            }
            State::Running => {
                if slot.cas((g, State::Running), (g, State::Cancel)) {
                    let pid = slot.pid.load(Ordering::Acquire);
                    if pid > 0 {
                        // SAFETY: our own pool worker; the CAS made this cancel its.
                        unsafe { libc::kill(pid, libc::SIGINT) };
                    }
                    pool.count(Counter::CancelsSent);
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Waits until every ticket of the round is done, cancelling those whose worker has
/// not finished (no 'X'); SIGTERM after [`TERM_AFTER`]. Never raises an ERROR: runs
/// with interrupts held, from the DSM-detach callback during an abort too, where only
/// TopTransactionContext memory may be touched (`in_callback`).
unsafe fn wait_round(pool: &PoolShared, pg: *mut PoolGather, cancel: bool, in_callback: bool) {
    // SAFETY: our state; see the function comment.
    unsafe {
        if !(*pg).active {
            return;
        }
        hold_interrupts();
        if !in_callback {
            detach_tqueues(pg);
        }
        if cancel {
            for i in 0..(*pg).nslots {
                let slot = &pool.slots[(*pg).slot[i]];
                if !(*pg).got_x[i] && !slot.done((*pg).gen[i]) {
                    cancel_ticket(pool, slot, (*pg).gen[i]);
                }
            }
        }
        let start = Instant::now();
        let mut escalated = false;
        loop {
            for i in 0..(*pg).nslots {
                drain(pg, i, false);
            }
            if (0..(*pg).nslots).all(|i| pool.slots[(*pg).slot[i]].done((*pg).gen[i])) {
                break;
            }
            if !escalated && start.elapsed() > TERM_AFTER {
                escalated = true;
                for i in 0..(*pg).nslots {
                    let slot = &pool.slots[(*pg).slot[i]];
                    if !slot.done((*pg).gen[i]) {
                        let pid = slot.pid.load(Ordering::Acquire);
                        if pid > 0 {
                            // SAFETY: our own pool worker, stuck in a fragment of ours.
                            libc::kill(pid, libc::SIGTERM);
                        }
                        pool.count(Counter::TermEscalations);
                    }
                }
            }
            wait_latch(Some(10), wait_event::PARALLEL_FINISH);
        }
        (*pg).active = false;
        resume_interrupts();
    }
}

/// on_dsm_detach callback of the parallel context's segment: DestroyParallelContext
/// runs it at the Gather's shutdown, at abort (AtEOXact_Parallel) and at exit.
unsafe extern "C-unwind" fn on_detach(_seg: *mut pg_sys::dsm_segment, arg: pg_sys::Datum) {
    let Some(pool) = shared::shared() else { return };
    // SAFETY: the PoolGather registered with the segment, in TopTransactionContext,
    // which outlives the parallel context.
    unsafe {
        let pg = arg.cast_mut_ptr::<PoolGather>();
        (*pg).registered_seg = std::ptr::null_mut();
        wait_round(pool, pg, true, true);
    }
}
