//! The leader's side of the ticket protocol (shared.rs has the slot states): which
//! idle pool workers a Gather's round may use and how it posts them tickets, reading
//! their tuple and error queues, noticing a worker that is gone or gave its ticket back,
//! ending a round, and the `on_dsm_detach` callback that cancels and waits for the
//! round's workers on every path out of the Gather (its end, LIMIT, ERROR, cancel,
//! FATAL), before the leader can finish its transaction or exit.
//!
//! The pool's state of each Gather (Merge) state, [`PoolGather`], lives here, keyed by
//! the executor node, for a transaction's worth.
//!
//! These functions run outside pgrx's error boundary (leader.rs's module comment): an
//! ERROR longjmps through them, so their frames hold nothing with a destructor.

use super::ffi::*;
use super::{failure_watch, identity};
use super::port::{
    check_for_interrupts, exec_clear_tuple, exec_proc_node, hold_interrupts, raise,
    resume_interrupts, wait_latch, NOT_IN_PREREQUISITE_STATE,
};
use super::shared::{
    self, Counter, Fallback, PoolShared, Slot, State, FALLBACK_NAMES, MAX_TICKETS,
};
use crate::parallel;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

/// The leader's own part of a Gather or Gather Merge (`ps`, with its parallel executor
/// info `pei`, null when no parallel context was built; `pg`, the pool's state of it):
/// runs the child plan for one tuple with the context's DSA area installed, as
/// ExecGather and ExecGatherMerge do. While pool workers of the round may still be
/// running, it runs watched (failure_watch.rs): a worker's ERROR is raised here even
/// when the leader's part waits for that worker.
pub(super) unsafe fn scan_locally(
    pg: *mut PoolGather,
    ps: *mut pg_sys::PlanState,
    pei: *mut pg_sys::ParallelExecutorInfo,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the caller's node, whose child the executor initialised; our state of it.
    unsafe {
        let estate = (*ps).state;
        (*estate).es_query_dsa = if pei.is_null() {
            std::ptr::null_mut()
        } else {
            (*pei.cast::<ParallelExecutorInfo>()).area
        };
        let mut slot = std::ptr::null_mut();
        if (*pg).active && !(*pg).tqueues_detached {
            if !(*pg).watching {
                failure_watch::start();
                (*pg).watching = true;
            }
            let ran = failure_watch::run_watched(a_worker_failed, pg.cast(), || {
                slot = exec_proc_node((*ps).lefttree);
            });
            if !ran {
                (*estate).es_query_dsa = std::ptr::null_mut();
                poll(pg, true);
                raise(
                    NOT_IN_PREREQUISITE_STATE,
                    c"lost connection to parallel worker (pg_stride pool)".as_ptr(),
                );
            }
        } else {
            slot = exec_proc_node((*ps).lefttree);
        }
        (*estate).es_query_dsa = std::ptr::null_mut();
        slot
    }
}

/// failure_watch's test for a round (`arg`, its PoolGather): a worker whose ticket of
/// this round is not finished ended its fragment in an ERROR. Reads memory only.
unsafe fn a_worker_failed(arg: *mut c_void) -> bool {
    let Some(pool) = shared::shared() else {
        return false;
    };
    // SAFETY: the PoolGather of the section running watched, in TopTransactionContext.
    unsafe {
        let pg = arg.cast::<PoolGather>();
        (0..(*pg).nslots).any(|i| {
            !(*pg).finished[i]
                && pool.slots[(*pg).slot[i]].failed_gen.load(Ordering::Acquire) == (*pg).gen[i]
        })
    }
}

/// The round ended: its leader part no longer runs watched.
unsafe fn stop_watching(pg: *mut PoolGather) {
    // SAFETY: our state; the start it matches.
    unsafe {
        if (*pg).watching {
            (*pg).watching = false;
            failure_watch::stop();
        }
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

/// Whether the pool worker of `slot` may run this backend's fragments: it is connected
/// to this database, not retiring, has served no leader of another identity, and its
/// `system_user` is unset unless this leader has one too (identity.rs).
pub(super) fn serves_this_leader(slot: &Slot) -> bool {
    // SAFETY: a global set at connection.
    slot.database.load(Ordering::Acquire) == u32::from(unsafe { pg_sys::MyDatabaseId })
        && !slot.retire.load(Ordering::Acquire)
        && identity::may_serve(&slot.served, identity::leader_users())
        && (identity::leader_has_system_user() || !slot.system_user_set.load(Ordering::Acquire))
}

/// Reserves up to `want` idle workers of this database and posts each a ticket: ticket
/// i runs as parallel worker number i of the context.
pub(super) unsafe fn post_tickets(
    pool: &PoolShared,
    pg: *mut PoolGather,
    seg: *mut pg_sys::dsm_segment,
    want: usize,
) {
    // SAFETY: our state; the segment is the parallel context's.
    unsafe {
        let handle = dsm_segment_handle(seg);
        let nworkers = (*(*(*pg).pei).pcxt).nworkers;
        // Workers that serve this leader's identity first, then fresh ones, which are
        // better kept for leaders of other identities (identity.rs). Two passes, with
        // nothing allocated: an ERROR would longjmp past a destructor.
        let served = |fresh: bool| {
            let slots = pool.slots.iter().enumerate();
            slots.filter(move |(_, slot)| identity::has_served(&slot.served) != fresh)
        };
        for (index, slot) in served(false).chain(served(true)) {
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
                .store(shared::my_procno(), Ordering::Relaxed);
            slot.t_posted_ns
                .store(crate::os::monotonic_ns(), Ordering::Relaxed);
            slot.leader_pid.store(pg_sys::MyProcPid, Ordering::Relaxed);
            if !slot.cas((g + 1, State::Reserved), (g + 1, State::Posted)) {
                continue; // the worker exited meanwhile
            }
            (*pg).slot[i] = index;
            (*pg).gen[i] = g + 1;
            (*pg).nslots += 1;
            pool.count(Counter::TicketsPosted);
            shared::set_latch_of(slot.procno.load(Ordering::Acquire));
        }
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

pub(super) unsafe fn drop_reader(pg: *mut PoolGather, position: usize) {
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
pub(super) unsafe fn poll(pg: *mut PoolGather, rethrow: bool) -> bool {
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
                raise(
                    NOT_IN_PREREQUISITE_STATE,
                    c"lost connection to parallel worker (pg_stride pool)".as_ptr(),
                );
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
            _ => raise(
                NOT_IN_PREREQUISITE_STATE,
                c"pg_stride pool: a pool worker could not take its part of a Gather Merge".as_ptr(),
            ),
        }
    }
}

/// The readers are all done: wait for every worker's 'X' (rethrowing errors), detach
/// the tuple queues and add the workers' buffer usage. The workers leave the lock group
/// right after; the DSM-detach callback waits for that.
pub(super) unsafe fn finish_round(pg: *mut PoolGather) {
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
        stop_watching(pg);
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
            clear_worker_slots(merge);
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
pub(super) unsafe fn wait_round(
    pool: &PoolShared,
    pg: *mut PoolGather,
    cancel: bool,
    in_callback: bool,
) {
    // SAFETY: our state; see the function comment.
    unsafe {
        if !(*pg).active {
            return;
        }
        hold_interrupts();
        stop_watching(pg);
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
pub(super) unsafe extern "C-unwind" fn on_detach(
    _seg: *mut pg_sys::dsm_segment,
    arg: pg_sys::Datum,
) {
    let Some(pool) = shared::shared() else { return };
    // SAFETY: the PoolGather registered with the segment, in TopTransactionContext,
    // which outlives the parallel context.
    unsafe {
        let pg = arg.cast_mut_ptr::<PoolGather>();
        (*pg).registered_seg = std::ptr::null_mut();
        wait_round(pool, pg, true, true);
    }
}

/// Empties the workers' slots, whose tuples may point into the round's queues.
///
/// # Safety
/// `node` is a Gather Merge state set up by ExecInitGatherMerge.
pub(super) unsafe fn clear_worker_slots(node: *mut pg_sys::GatherMergeState) {
    // SAFETY: gather_merge_setup made num_workers + 1 slots, the first for the leader.
    unsafe {
        let planned = (*(*node).ps.plan.cast::<pg_sys::GatherMerge>()).num_workers;
        for p in 1..=planned.max(0) as usize {
            let slot = *(*node).gm_slots.add(p);
            if !slot.is_null() {
                exec_clear_tuple(slot);
            }
        }
        *(*node).gm_slots = std::ptr::null_mut();
    }
}
