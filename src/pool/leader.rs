//! The leader side (docs/design.md §6, approach B): at ExecutorStart, the ExecProcNode of
//! each GatherState and GatherMergeState is replaced by [`pool_exec_gather`], which
//! does what ExecGather's (ExecGatherMerge's) first call does — ExecInitParallelPlan —
//! but posts tickets to idle pool workers (tickets.rs) instead of
//! LaunchParallelWorkers. Core never sees the pool workers as its workers
//! (`nworkers_launched` stays 0): the Gather's tuples are read here, a Gather Merge's
//! in gather_merge.rs.
//!
//! The functions the executor calls here run outside pgrx's error boundary (like the
//! hooks of executor.rs): an ERROR longjmps through them, so their frames hold nothing
//! with a destructor.

use super::ffi::*;
use super::gathers::{has_room, lookup, plan_field, remember, state_field, GatherNode, PoolGather};
use super::port::{
    check_for_interrupts, exec_clear_tuple, exec_project, raise, tup_is_null, wait_latch,
    INTERNAL_ERROR,
};
use super::shared::{self, Counter, Fallback, PoolShared, State, MAX_TICKETS};
use super::tickets::{
    drop_reader, end_of_tuples, finish_round, on_detach, poll, post_tickets, scan_locally,
    serves_this_leader, wait_round,
};
use super::{gather_merge, stride_gather};
use pgrx::pg_sys;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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
            consider_gather(inner, found);
            return;
        }
        // A Gather that is no Stride Gather's (a plan cached before parallel_mode was
        // set to pool, debug_parallel_query's) is shut down by PostgreSQL alone, which
        // frees the parameters it sends its workers before the pool's round has ended
        // (stride_gather.rs, `shutdown`): one that sends some stays PostgreSQL's.
        if GatherNode::of(ps).is_some_and(|node| plan_field!(node, initParam).is_null()) {
            consider_gather(ps, found);
        }
    }
}

/// [`consider`] for the Gather (Merge) state `ps`.
unsafe fn consider_gather(ps: *mut pg_sys::PlanState, found: &mut usize) {
    // SAFETY: a valid PlanState; GatherNode::of reads its tag.
    unsafe {
        let Some(node) = GatherNode::of(ps) else {
            return;
        };
        if plan_field!(node, num_workers) <= 0 {
            return;
        }
        // rescan_param is set on every Gather (create_gather_plan): a rescan is handled
        // by waiting for the previous round (start_round).
        // The state of a Gather freed at this address earlier in the transaction is used
        // again, emptied, once its round is over and no DSM-detach callback holds it: a
        // PL/pgSQL loop running a parallel statement a million times would otherwise
        // leave a million of them in TopTransactionContext.
        let kept = lookup(ps);
        let pg = if !kept.is_null() && !(*kept).active && (*kept).registered_seg.is_null() {
            std::ptr::write_bytes(kept, 0, 1);
            kept
        } else if kept.is_null() && !has_room() {
            return;
        } else {
            MemoryContextAllocZero(
                pg_sys::TopTransactionContext,
                std::mem::size_of::<PoolGather>(),
            )
            .cast::<PoolGather>()
        };
        (*pg).node = ps;
        (*pg).stock = (*ps).ExecProcNodeReal;
        (*pg).exec = Some(pool_exec_gather);
        if !remember(ps, pg) {
            return;
        }
        pg_sys::ExecSetExecProcNode(ps, Some(pool_exec_gather));
        *found += 1;
    }
}

// ---------------------------------------------------------------- the Gather

/// The Gather's (or Gather Merge's) ExecProcNode while the pool runs it.
unsafe extern "C-unwind" fn pool_exec_gather(
    pstate: *mut pg_sys::PlanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor calls this with the state it was installed on, a Gather or
    // Gather Merge state; see the module comment for the frames.
    unsafe {
        let pg = lookup(pstate);
        let Some(node) = GatherNode::of(pstate).filter(|_| !pg.is_null()) else {
            raise(
                INTERNAL_ERROR,
                c"pg_stride pool: lost the state of a Gather node".as_ptr(),
            );
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
        // While a command waits for this database to empty (DROP DATABASE, say), its pool
        // workers take no fragment (lifecycle::mark_closing), and PostgreSQL's own could
        // not connect to a database being dropped before the command ends: the leader
        // runs the Gather alone, whatever would have sent it to PostgreSQL's workers.
        let closing = pool.is_closing(pg_sys::MyDatabaseId);
        if !closing && crate::pg::top_transaction_id_if_any() != pg_sys::InvalidTransactionId {
            return decline(pool, pg, Fallback::Xid);
        }
        if !closing && pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as c_int {
            return decline(pool, pg, Fallback::Serializable);
        }
        if !closing && idle_workers(pool) == 0 && !wait_for_starting_worker(pool) {
            make_way_for_this_leader(pool);
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
            if closing {
                pool.count(Counter::AloneForDatabaseCommand);
                (*pg).rounds_alone += 1;
            } else {
                post_tickets(pool, pg, (*pcxt).seg, want);
            }
            if !closing && (*pg).nslots < want {
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
        if !closing {
            pool.count(Counter::GathersPooled);
        }
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

fn idle_workers(pool: &PoolShared) -> usize {
    pool.slots
        .iter()
        .filter(|s| s.load().1 == State::Idle && serves_this_leader(s))
        .count()
}

/// This leader found no idle pool worker it may use, and none of its database is
/// starting (ExecutorStart's `ensure_pool` found the pool at its cap): one idle worker
/// of its database that cannot serve it (one of another identity, or whose
/// `system_user` is set while this leader has none: identity.rs) retires, and a later
/// Gather starts a fresh one in its place. One per declined Gather, so that a pool
/// shared by several roles shifts between them at the pace of their Gathers rather than
/// churn, and does not keep serving only the role that came first.
fn make_way_for_this_leader(pool: &PoolShared) {
    if worker_starting(pool) {
        return;
    }
    // SAFETY: a global set at connection.
    let database = u32::from(unsafe { pg_sys::MyDatabaseId });
    let other = pool.slots.iter().find(|s| {
        s.load().1 == State::Idle
            && s.database.load(Ordering::Acquire) == database
            && !s.retire.load(Ordering::Acquire)
            && !serves_this_leader(s)
    });
    if let Some(slot) = other {
        slot.retire.store(true, Ordering::Release);
        shared::set_latch_of(slot.procno.load(Ordering::Acquire));
    }
}

/// Whether a pool worker of this database is being started (forked or connecting).
fn worker_starting(pool: &PoolShared) -> bool {
    // SAFETY: a global set at connection.
    let database = u32::from(unsafe { pg_sys::MyDatabaseId });
    pool.slots.iter().any(|s| {
        matches!(s.load().1, State::Starting | State::Connecting)
            && s.database.load(Ordering::Acquire) == database
    })
}

/// How long a Gather waits for a pool worker of its database that is being started
/// (fork, connection, baseline) before it runs with PostgreSQL's own workers.
const START_WAIT: Duration = Duration::from_millis(20);

/// When this database has no idle pool worker but some are starting: waits up to
/// START_WAIT for one to become idle. Returns whether one did.
fn wait_for_starting_worker(pool: &PoolShared) -> bool {
    if !worker_starting(pool) {
        return false;
    }
    let deadline = Instant::now() + START_WAIT;
    while Instant::now() < deadline {
        // SAFETY: a short latch wait; interrupts are checked by the caller's loop.
        unsafe { wait_latch(Some(1), wait_event::EXECUTE_GATHER) };
        if idle_workers(pool) > 0 {
            pool.count(Counter::WaitedForStart);
            return true;
        }
    }
    false
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
                let outslot = scan_locally(pg, &raw mut (*node).ps, (*node).pei);
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
