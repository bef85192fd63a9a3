//! The leader's side of the ticket protocol (shared.rs has the slot states): which
//! idle pool workers a Gather's round may use and how it posts them tickets, reading
//! their tuple and error queues, noticing a worker that is gone or gave its ticket back,
//! ending a round (early, at a LIMIT: `stride_gather.rs`'s shutdown), and the
//! `on_dsm_detach` callback that cancels and waits for the round's workers on every
//! path out of the Gather (its end, ERROR, cancel, FATAL), before the leader can finish
//! its transaction or exit.
//! The pool's state of each Gather (Merge) state is gathers.rs's.
//!
//! These functions run outside pgrx's error boundary (leader.rs's module comment): an
//! ERROR longjmps through them, so their frames hold nothing with a destructor.

use super::ffi::*;
use super::gathers::{GatherNode, PoolGather};
use super::port::{
    check_for_interrupts, exec_clear_tuple, exec_proc_node, hold_interrupts, raise,
    resume_interrupts, wait_latch, NOT_IN_PREREQUISITE_STATE,
};
use super::shared::{self, Counter, PoolShared, Slot, State};
use super::{failure_watch, identity};
use pgrx::pg_sys;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// After this long waiting for cancelled pool workers, they get SIGTERM.
const TERM_AFTER: Duration = Duration::from_secs(5);

/// After this long waiting for the workers of a round ended early to stop at their
/// detached tuple queues, the fragments still running are cancelled.
const CANCEL_AFTER: Duration = Duration::from_secs(1);

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
                raise_failed_workers_error(pg);
            }
        } else {
            slot = exec_proc_node((*ps).lefttree);
        }
        (*estate).es_query_dsa = std::ptr::null_mut();
        slot
    }
}

/// A worker of the round failed while the leader ran its own part: raises its ERROR,
/// read from its queue as it comes by [`finish_round`] (a worker sending a long ERROR
/// into a queue already holding its notices waits for that read), or "lost connection"
/// once every ticket is finished without one.
unsafe fn raise_failed_workers_error(pg: *mut PoolGather) {
    // SAFETY: our state; finish_round's poll raises the ERROR it reads.
    unsafe {
        finish_round(pg);
        raise(
            NOT_IN_PREREQUISITE_STATE,
            c"lost connection to parallel worker (pg_stride pool)".as_ptr(),
        );
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

/// Where a worker's notice or error is parsed: emptied before each, so that a fragment
/// that raises a NOTICE for every row does not grow the leader's query memory by a
/// message each (PostgreSQL's HandleParallelMessages keeps a context of its own for
/// the same reason).
static mut MESSAGE_CONTEXT: pg_sys::MemoryContext = std::ptr::null_mut();

/// [`MESSAGE_CONTEXT`], emptied (made at the first message).
///
/// # Safety
/// In a backend; may raise an ERROR (out of memory) the first time.
unsafe fn message_context() -> pg_sys::MemoryContext {
    // SAFETY: process-local; a context under TopMemoryContext lives as long as the
    // process.
    unsafe {
        if MESSAGE_CONTEXT.is_null() {
            MESSAGE_CONTEXT = pg_sys::AllocSetContextCreateInternal(
                pg_sys::TopMemoryContext,
                c"pg_stride pool messages".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            );
        } else {
            MemoryContextReset(MESSAGE_CONTEXT);
        }
        MESSAGE_CONTEXT
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
                    let previous = pg_sys::CurrentMemoryContext;
                    pg_sys::CurrentMemoryContext = message_context();
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
                    // ThrowErrorData copies what it reports into ErrorContext.
                    pg_sys::CurrentMemoryContext = previous;
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
/// does not take part in: nobody would claim that work. The leader runs the plan itself
/// from now on, as ExecGather does when it launched no worker. A Gather Merge's leader
/// can join only until its first tuple is returned (gather_merge::first_tuples, which
/// waits for every worker's first tuple or end, so a ticket given back is seen by then);
/// later the statement fails instead of returning fewer rows.
unsafe fn take_over_declined(pg: *mut PoolGather) {
    // SAFETY: our state; its node is the Gather (Merge) state being run.
    unsafe {
        (*pg).leader_participates = true;
        match GatherNode::of((*pg).node) {
            Some(GatherNode::Gather(gather)) => (*gather).need_to_scan_locally = true,
            Some(GatherNode::Merge(merge)) if !(*merge).gm_initialized => {
                (*merge).need_to_scan_locally = true;
            }
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

/// Asks ticket `gen` of `slot` to stop: revokes it if not taken yet, else, unless
/// `revoke_only`, cancels the fragment (SIGINT after winning the CAS, see shared.rs). A
/// ticket taken while this process looked is a fragment that has started: with
/// `revoke_only` it is left to stop at its detached tuple queue, as the others are.
fn cancel_ticket(pool: &PoolShared, slot: &Slot, gen: u64, revoke_only: bool) {
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
            State::Running if revoke_only => return,
            State::Running => {
                if slot.cas((g, State::Running), (g, State::Cancel)) {
                    // A test build may be slow to send it, as a leader taken off its CPU
                    // here is, to show that the worker waits for this SIGINT.
                    if crate::pg::test_fault("pool_cancel_race") {
                        std::thread::sleep(std::time::Duration::from_millis(1000));
                    }
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

/// Waits until every ticket of the round is done. `cancel`: cancels at once the
/// fragments whose worker has not finished (no 'X'). Otherwise, as PostgreSQL ends its
/// own workers' round when the Gather is shut down early (a LIMIT met): the tuple
/// queues are detached, so that a worker stops at its next tuple and reports its
/// figures to EXPLAIN ANALYZE; tickets not taken yet are revoked, and fragments still
/// running after [`CANCEL_AFTER`] are cancelled. SIGTERM after a further [`TERM_AFTER`].
/// Never raises an ERROR: runs with interrupts held, from the DSM-detach callback during
/// an abort too, where only TopTransactionContext memory may be touched
/// (`in_callback`).
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
        let cancel_unfinished = |only_untaken: bool| {
            for i in 0..(*pg).nslots {
                let slot = &pool.slots[(*pg).slot[i]];
                let untaken = slot.load() == ((*pg).gen[i], State::Posted);
                if untaken && only_untaken && crate::pg::test_fault("pool_revoke_race") {
                    // A test build lets the worker take the ticket first, as one that
                    // wakes while this process is taken off its CPU here does.
                    wait_until_taken(slot, (*pg).gen[i]);
                }
                if !(*pg).got_x[i] && !slot.done((*pg).gen[i]) && (untaken || !only_untaken) {
                    cancel_ticket(pool, slot, (*pg).gen[i], only_untaken);
                }
            }
        };
        cancel_unfinished(!cancel);
        let mut cancelled_at = cancel.then(Instant::now);
        let start = Instant::now();
        let mut escalated = false;
        loop {
            for i in 0..(*pg).nslots {
                drain(pg, i, false);
            }
            if (0..(*pg).nslots).all(|i| pool.slots[(*pg).slot[i]].done((*pg).gen[i])) {
                break;
            }
            if cancelled_at.is_none() && start.elapsed() > CANCEL_AFTER {
                cancel_unfinished(false);
                cancelled_at = Some(Instant::now());
            }
            if !escalated && cancelled_at.is_some_and(|at| at.elapsed() > TERM_AFTER) {
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

/// Up to a second for the worker of ticket `gen` to take it (a test fault's race).
fn wait_until_taken(slot: &Slot, gen: u64) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while slot.load() == (gen, State::Posted) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
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
