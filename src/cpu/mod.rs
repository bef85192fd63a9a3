//! CPU scheduling inside the executor (docs/design.md §1–§4, wagner2021 §2–§3).
//!
//! At most `pg_stride.cpu_slots` processes run scheduled query work at once. The
//! decisions are `pg_stride_sched::SchedShared`, kept in its own shared-memory block;
//! this module connects it to PostgreSQL:
//!
//! * a top-level read-only statement registers a query entry in its resource group and
//!   joins it; PostgreSQL's parallel workers for that statement join the same entry
//!   (found through `MyProc->lockGroupLeader`). A serial statement does so only at its
//!   first check-in, once its scans have produced a first chunk of tuples (C0 = 16):
//!   a statement that ends sooner — an index lookup, most of OLTP — is too short to be
//!   worth scheduling and costs the scheduler nothing (no entry, no slot, no clock
//!   read). A parallel plan joins at once, so that its workers find the entry;
//! * a process takes a slot when ExecutorRun starts and gives it back when it ends, so
//!   a cursor between FETCHes, or a session idle in a transaction, holds none;
//! * the leaf scan nodes are wrapped with a *yield point*: every N tuples (N from the
//!   adaptive `SliceClock`) the process reads its thread CPU clock, charges the slice to
//!   its query, and, when a waiting query has a lower pass, hands its slot over and
//!   sleeps on its latch until it is given one again.
//!
//! Safety rules (docs/design.md §4): a process pauses only where interrupts can be processed,
//! that is with no LWLock held and outside critical sections (rule 1); statements that
//! write (anything but a plain SELECT without row locks or data-modifying CTEs), and
//! any statement of a transaction that already wrote, take no part and are never paused
//! (rule 2); a pause is a latch wait that serves cancel,
//! timeouts, termination and postmaster death (rule 3); only top-level statements and
//! their parallel workers take part (rule 4); and a process that ends its statement, or
//! fails, or exits, leaves its entry, passing on any slot it held (rule 8).

mod pinning;
mod priority;
mod slice_share;
mod trace;

use priority::priority_range;

pub use trace::{read_window, Arrival};

use crate::backend_local::BackendLocal;
use crate::pg::{self, interrupts_can_be_processed, thread_cpu_ns};
use crate::{admission, gucs, numa, shmem};
use pg_stride_sched::slice::{Checkpoint, SliceClock};
use pg_stride_sched::tuner::{Accounting, TraceRecord};
use pg_stride_sched::{
    GroupConfig, GroupId, GroupSettings, ProcId, QueryId, QueryOptions, SchedShared, Turn,
};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};

/// Chunk used when a slice ends where the process may not pause: check again soon.
const RETRY_CHUNK: u32 = 16;

/// This process's part in CPU scheduling.
struct Member {
    proc: ProcId,
    /// Group slot of the statements.
    group: usize,
    /// The query entry; `None` until the statements reach their first check-in.
    query: Option<QueryId>,
    /// Whether this process registered the query (a leader) rather than joined it.
    owner: bool,
    clock: SliceClock,
    /// Thread CPU time when the current chunk started, ns.
    chunk_start_ns: u64,
    /// Thread CPU time since which nothing was charged, ns.
    slice_start_ns: u64,
    /// Top-level statements sharing the query (cursors open at once).
    statements: u32,
    /// When the first of them arrived and was admitted.
    arrival: Arrival,
    /// PostgreSQL's query identifier of the first, 0 if none was computed.
    query_id: u64,
    /// Most processes that worked for them: the leader and its granted workers.
    procs: u32,
    /// The static priority the query was registered with, if its group is pinned.
    pinned_priority: Option<u32>,
    /// For a parallel worker, its leader's process number: the worker adds what it
    /// measured to the leader's entry when it ends.
    leader: Option<usize>,
    /// What this process measured for the statement's trace record.
    acct: Accounting,
    /// Since when this process holds its slot (CLOCK_MONOTONIC ns).
    held_since_ns: Option<u64>,
    /// The thread's run delay when it took the slot, while statements are traced.
    held_run_delay_ns: Option<u64>,
    /// The thread's run delay when it last gave its slot up, while traced.
    left_run_delay_ns: Option<u64>,
    /// The thread's run delay when its current pause began, while traced.
    paused_run_delay_ns: Option<u64>,
    /// The thread's run delay when it started working for the statements, while traced.
    start_run_delay_ns: Option<u64>,
}

impl Member {
    fn new(proc: ProcId, group: usize, query: Option<QueryId>, owner: bool) -> Member {
        Member {
            proc,
            group,
            query,
            owner,
            clock: SliceClock::new(gucs::slice_ns()),
            chunk_start_ns: 0,
            slice_start_ns: 0,
            statements: 1,
            arrival: Arrival::default(),
            query_id: 0,
            procs: 1,
            pinned_priority: None,
            leader: None,
            acct: Accounting {
                first_slot_ns: TraceRecord::PENDING,
                ..Accounting::default()
            },
            held_since_ns: None,
            held_run_delay_ns: None,
            left_run_delay_ns: None,
            paused_run_delay_ns: None,
            start_run_delay_ns: trace::enabled().then(pg::thread_run_delay_ns),
        }
    }

    /// The process runs on a slot from now on (after a pause, if one began).
    fn holds_slot(&mut self) {
        let now = pg::monotonic_ns();
        self.held_since_ns = Some(now);
        self.held_run_delay_ns = trace::enabled().then(pg::thread_run_delay_ns);
        if let (Some(before), Some(at)) = (self.paused_run_delay_ns.take(), self.held_run_delay_ns)
        {
            self.acct.paused_runqueue_ns += at.saturating_sub(before);
        }
        self.left_run_delay_ns = None;
        if self.acct.first_slot_ns == TraceRecord::PENDING {
            self.acct.first_slot_ns = now;
            if let (Some(start), Some(at)) = (self.start_run_delay_ns, self.held_run_delay_ns) {
                // The only pause so far is the one for this first slot.
                self.acct.runqueue_before_slot_ns = at
                    .saturating_sub(start)
                    .saturating_sub(self.acct.paused_runqueue_ns);
            }
        }
    }

    /// The process gave its slot back (or is about to); returns when (CLOCK_MONOTONIC).
    fn left_slot(&mut self) -> u64 {
        let now = pg::monotonic_ns();
        if let Some(since) = self.held_since_ns.take() {
            self.acct.held_ns += now.saturating_sub(since);
        }
        if let Some(before) = self.held_run_delay_ns.take() {
            let at = pg::thread_run_delay_ns();
            self.acct.held_runqueue_ns += at.saturating_sub(before);
            self.left_run_delay_ns = Some(at);
        }
        now
    }

    /// A pause begins: right after giving the slot up (`gave_up`), whose reading of the
    /// run delay it starts from, or before a first slot.
    fn pause_begins(&mut self, gave_up: bool) {
        let left = self.left_run_delay_ns.take().filter(|_| gave_up);
        self.paused_run_delay_ns = left.or_else(|| trace::enabled().then(pg::thread_run_delay_ns));
    }

    /// The run delay since the process started working for the statements, for its
    /// trace record at their end.
    fn count_runqueue(&mut self) {
        if let Some(start) = self.start_run_delay_ns.take() {
            self.acct.runqueue_ns = pg::thread_run_delay_ns().saturating_sub(start);
            if self.acct.first_slot_ns == TraceRecord::PENDING {
                self.acct.runqueue_before_slot_ns = self
                    .acct
                    .runqueue_ns
                    .saturating_sub(self.acct.paused_runqueue_ns);
            }
        }
    }

    /// A slice (or the tail of a run) used `used_ns` of CPU between two check-ins.
    fn slice_used(&mut self, used_ns: u64) {
        let limit = self.clock.target_ns().saturating_mul(2);
        self.acct.long_slice_ns += used_ns.saturating_sub(limit);
    }

    /// Charging starts afresh now: CPU used before (not scheduled yet, or paused) is not
    /// the query's.
    fn restart_charging(&mut self) {
        let now = thread_cpu_ns();
        (self.chunk_start_ns, self.slice_start_ns) = (now, now);
        slice_share::new_slot();
    }
}

static MEMBER: BackendLocal<RefCell<Option<Member>>> = BackendLocal::new(RefCell::new(None));
/// Tuples left before the next check-in; counting down is all a yield point does on most
/// tuples.
static COUNTDOWN: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(u32::MAX));
/// This process's request to end its slice early, in the scheduler's shared memory
/// (`pg_stride.preempt_lower_priority`): a yield point reads it at every tuple. Set when
/// the process first takes a slot; its process entry stays the same for its lifetime.
static YIELD_FLAG: BackendLocal<Cell<Option<&'static AtomicU32>>> =
    BackendLocal::new(Cell::new(None));
/// Thread CPU time when this process last ended a statement as a worker of a leader:
/// a pool worker serves fragment after fragment, each counted from the one before.
static WORKER_CPU_BASE: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));
/// Wrapped scan nodes, by node address, with the function each one ran before and the
/// statement it belongs to. A yield point looks its node up for every tuple, so this is
/// a hash table (O(1), no allocation on lookup) rather than a list: a plan over 500
/// partitions has 500 wrapped scans.
static WRAPPED: BackendLocal<RefCell<HashMap<usize, Wrapped, BuildHasherDefault<AddressHasher>>>> =
    BackendLocal::new(RefCell::new(
        HashMap::with_hasher(BuildHasherDefault::new()),
    ));

#[derive(Clone, Copy)]
struct Wrapped {
    desc: *const pg_sys::QueryDesc,
    original: pg_sys::ExecProcNodeMtd,
}

/// Hashes a node address: Fibonacci hashing of the address, whose low bits are the
/// same for every palloc'd node and whose high bits the table's mask would drop.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64 >> 3)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(32);
    }
}

/// `from` gave its slot up (`None`: nobody did) and `to` was handed one: notes when,
/// for the hand-off's latency in `to`'s trace record, passes the CPU with the slot
/// (`pg_stride.pin_slots`) or wakes `to` on this CPU (`pg_stride.wake_on_giver_cpu`),
/// and wakes `to`. The note comes first: moving `to` onto this CPU may let it run at
/// once, preempting this process before it gets any further.
///
/// That preemption is right when this process goes to sleep next (a pause), but not
/// when it `goes_on` without a slot: a statement leaving ExecutorRun still has its
/// ExecutorEnd, commit and reply to do, well under a millisecond, and a receiver that
/// preempted it would hold it back for the receiver's whole kernel time slice (1.7 ms a
/// short statement, bench/results/SIM_GAP.md). The shorter job goes first: the
/// receiver on this CPU then wakes as `SCHED_BATCH`, which the kernel does not let
/// preempt, and runs as soon as this process sleeps; it sets itself back to
/// `SCHED_OTHER` once it runs (`run_as_other`).
fn hand_over(from: Option<ProcId>, to: Option<ProcId>, goes_on: bool) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let entry = to.and_then(|p| shared.procs().get(p.0 as usize));
    if let Some(entry) = entry {
        entry
            .slot_given_ns
            .store(pg::monotonic_ns(), Ordering::Release);
    }
    if let Some(sched) = shared.sched() {
        let pinned = pinning::enabled(sched);
        // Without pinning, only a slot this process gives up comes with its CPU.
        let placed = !pinned && from.is_some() && pinning::places_receivers(sched);
        if pinned || placed {
            let finish_first = goes_on && gucs::FINISH_BEFORE_HANDOFF.get();
            if let (true, Some(entry), Some(p)) = (finish_first, entry, to) {
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
    if pg::set_batch_policy(pid, true).is_ok() {
        entry.woken_as_batch.store(1, Ordering::Release);
    }
}

/// Undoes [`wake_as_batch`] for a receiver `to` that runs already.
fn undo_batch(entry: &shmem::ProcEntry, to: ProcId) {
    let pid = pg::proc_pid(to.0 as usize);
    if entry.woken_as_batch.swap(0, Ordering::AcqRel) == 1 && pid != 0 {
        let _ = pg::set_batch_policy(pid, false);
    }
}

/// This process runs again: undo a `SCHED_BATCH` that a hand-over gave it.
fn run_as_other(shared: &shmem::Shared) {
    if let Some(entry) = shared.my_entry() {
        if entry.woken_as_batch.load(Ordering::Acquire) == 1
            && entry.woken_as_batch.swap(0, Ordering::AcqRel) == 1
        {
            let _ = pg::set_batch_policy(0, false);
        }
    }
}

/// Hands every free slot to a waiter that may take it, waking each.
fn dispatch_free_slots(sched: &SchedShared) {
    while let Some(p) = sched.dispatch() {
        hand_over(None, Some(p), false);
    }
}

/// Whether a statement may be paused (docs/design.md §4 rule 2): it only reads, and its
/// transaction has not written or locked rows (see [`transaction_wrote`]).
/// Cannot panic: the executor hooks ask it outside pgrx's error boundary.
pub fn is_pausable(desc: *const pg_sys::QueryDesc) -> bool {
    // SAFETY: ExecutorStart gives a valid QueryDesc with its PlannedStmt.
    let reads_only = unsafe {
        let stmt = (*desc).plannedstmt;
        !stmt.is_null()
            && (*stmt).commandType == pg_sys::CmdType::CMD_SELECT
            && !(*stmt).hasModifyingCTE
            && (*stmt).rowMarks.is_null()
    };
    reads_only && !transaction_wrote()
}

/// Whether this backend's transaction has written or locked rows: then it has a
/// transaction ID, and pausing it could keep others waiting for its row locks (a convoy
/// behind a paused process). Checked again at every run and check-in, since a
/// transaction that opened a cursor may write before the next FETCH.
fn transaction_wrote() -> bool {
    pg::top_transaction_id_if_any() != pg_sys::InvalidTransactionId
}

/// Group settings as the scheduling core sees them: what the group leaves unset comes
/// from `pg_stride.priority_initial`, `priority_min`, `decay_lambda` and `decay_start`.
pub fn configure_group(sched: &SchedShared, slot: usize, settings: &GroupSettings) {
    sched.configure_group(
        GroupId(slot as u32),
        GroupConfig {
            weight: settings.weight.max(1) as u32,
            priority: priority_range(settings),
            decay_lambda: settings.decay_lambda,
            decay_start: settings.decay_start.map(|d| d.max(0) as u32),
            max_workers: settings
                .max_parallel_workers
                .map_or(u32::MAX, |n| n.max(0) as u32),
        },
    );
}

/// A top-level read-only statement of this backend starts running in group slot
/// `group`: becomes (or stays, with its open cursors) a member of CPU scheduling and
/// wraps the statement's scans with yield points. The query entry is registered at the
/// first check-in, or now for a parallel plan. Call after ExecutorStart.
pub fn start_statement(
    shared: &shmem::Shared,
    desc: *const pg_sys::QueryDesc,
    group: usize,
    arrival: Arrival,
) {
    let Some(sched) = shared.sched() else { return };
    let Some(procno) = pg::my_procno() else {
        return;
    };
    // SAFETY: ExecutorStart gives a valid QueryDesc with its PlannedStmt.
    let (parallel, query_id) = unsafe {
        let stmt = (*desc).plannedstmt;
        // queryId is a uint64 before PostgreSQL 18 and an int64 from 18 on.
        #[allow(clippy::unnecessary_cast)]
        let query_id = (*stmt).queryId as u64;
        ((*stmt).parallelModeNeeded, query_id)
    };
    let procs = 1 + shared
        .my_entry()
        .map_or(0, |e| e.workers_granted.load(Ordering::Relaxed));
    MEMBER.with_borrow_mut(|member| match member.as_mut() {
        Some(m) => {
            m.statements += 1;
            m.procs = m.procs.max(procs);
        }
        None => {
            let mut m = Member::new(ProcId(procno as u32), group, None, true);
            (m.arrival, m.query_id, m.procs) = (arrival, query_id, procs);
            // The leader's run delay counts from the arrival: ExecutorStart included.
            m.start_run_delay_ns = arrival.run_delay_ns.or(m.start_run_delay_ns);
            *member = Some(m);
        }
    });
    if parallel && !join_query(shared, sched) {
        return;
    }
    wrap_scans(desc);
}

/// Registers this backend's query in its group and joins it, unless it has already.
/// Returns `false`, and ends the membership, when there is no free query entry (more
/// statements than processes): the statements then run unscheduled.
fn join_query(shared: &shmem::Shared, sched: &SchedShared) -> bool {
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
        // The home is chosen under the registration lock, so that statements registering
        // at once see each other's homes (`numa = bind`).
        let registered = shared.with_admission(|_, _| {
            let options = QueryOptions {
                pinned_priority,
                home: sched.choose_home(),
            };
            sched.register_query(group, options)
        });
        let Ok(query) = registered else {
            *member = None;
            return false;
        };
        if sched.join(m.proc, query).is_err() {
            let _ = shared.with_admission(|_, _| sched.unregister_query(query));
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

/// A parallel worker starts its part of a statement: joins the leader's query, if the
/// leader's statement is scheduled, and wraps the scans. Call after ExecutorStart.
/// Returns whether it joined.
pub fn start_worker(shared: &shmem::Shared, desc: *const pg_sys::QueryDesc) -> bool {
    let Some(sched) = shared.sched() else {
        return false;
    };
    let (Some(procno), Some(leader)) = (pg::my_procno(), pg::lock_group_leader()) else {
        return false;
    };
    let Some(leader_entry) = shared.procs().get(leader) else {
        return false;
    };
    let query = leader_entry.cpu_query.load(Ordering::Acquire);
    if query == 0 {
        return false;
    }
    let query = QueryId(query - 1);
    let proc = ProcId(procno as u32);
    if sched.join(proc, query).is_err() {
        return false;
    }
    let group = leader_entry.group.load(Ordering::Acquire) as usize;
    let mut member = Member::new(proc, group, Some(query), false);
    member.leader = Some(leader);
    MEMBER.set(Some(member));
    wrap_scans(desc);
    true
}

/// Whether this process takes part in CPU scheduling with a statement. Cannot panic:
/// the executor hooks ask it outside pgrx's error boundary.
pub fn is_member() -> bool {
    MEMBER.try_with_borrow(|m| m.is_some()) == Some(true)
}

/// ExecutorRun of a scheduled statement begins: take a slot, waiting for one if needed.
/// A statement of a transaction that wrote since the statement started runs without one,
/// and so does one that has not joined its query yet (its first check-in joins).
pub fn begin_run(shared: &shmem::Shared) {
    let Some(sched) = shared.sched() else { return };
    if transaction_wrote() {
        return;
    }
    let Some(proc) = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.clock.set_target_ns(gucs::slice_ns());
        m.clock.restart();
        COUNTDOWN.set(m.clock.chunk());
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
        follow_slot(shared, sched, proc);
        // On the CPU it owns now: its first slice is measured from here.
        slice_share::starts(shared);
        count_check_in(shared);
        MEMBER.with_borrow_mut(|m| m.as_mut().map(Member::holds_slot));
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
            // Woken on its giver's CPU (`pg_stride.wake_on_giver_cpu`): running now.
            pinning::unpin(shared, proc);
        }
    }
}

/// ExecutorRun ends: give the slot back, charging the CPU used since the last check-in.
pub fn end_run(shared: &shmem::Shared) {
    COUNTDOWN.set(u32::MAX);
    let Some(sched) = shared.sched() else { return };
    let Some((proc, used)) = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.query?;
        let used = thread_cpu_ns().saturating_sub(m.slice_start_ns);
        if m.held_since_ns.is_some() {
            m.slice_used(used);
            m.left_slot();
        }
        Some((m.proc, used))
    }) else {
        return;
    };
    if sched.is_running(proc) {
        let to = sched.release(proc, used);
        slice_share::publish(shared, None);
        // Off its CPU's pinning before the receiver is queued there: widening the mask
        // of a running process whose CPU has another one waiting lets that one run at
        // once, and the statement's ExecutorEnd would wait out the receiver's time slice.
        pinning::unpin(shared, proc);
        hand_over(Some(proc), to, true);
        numa::charge(shared, used);
    }
}

/// A scheduled statement ends (or fails, or its process exits): forgets its wrapped
/// scans and, with the last statement of the process, leaves the query, passing on any
/// slot, and frees the entry when this process registered it, tracing it for the tuner.
pub fn end_statement(shared: &shmem::Shared, desc: Option<*const pg_sys::QueryDesc>, failed: bool) {
    WRAPPED.with_borrow_mut(|w| w.retain(|_, x| desc.is_some_and(|d| x.desc != d)));
    // A pause that an error ended (cancel, statement_timeout) is over too.
    if let Some(entry) = shared.my_entry() {
        entry.paused.store(0, Ordering::Release);
    }
    let Some(sched) = shared.sched() else { return };
    let last = MEMBER.with_borrow_mut(|member| {
        let m = member.as_mut()?;
        m.statements = m.statements.saturating_sub(1);
        if desc.is_some() && m.statements > 0 {
            return None;
        }
        member.take()
    });
    let Some(mut m) = last else { return };
    COUNTDOWN.set(u32::MAX);
    numa::unbind();
    let Some(query) = m.query else { return };
    let snapshot = sched.query_snapshot(query);
    m.left_slot();
    m.count_runqueue();
    hand_over(Some(m.proc), sched.leave(m.proc), true);
    run_as_other(shared);
    pinning::leave(shared, m.proc);
    if let Some(leader) = m.leader {
        // A worker's CPU since its previous statement for a leader is this one's: for a
        // parallel worker of PostgreSQL's the whole process (the fork, attaching and
        // restoring the leader's state count), for a pool worker what it spent since its
        // last fragment (waiting for the ticket, restoring this leader's state).
        let now = thread_cpu_ns();
        m.acct.cpu_total_ns = now.saturating_sub(WORKER_CPU_BASE.replace(now));
        if let Some(entry) = shared.procs().get(leader) {
            entry.workers_acct.add(&m.acct);
        }
    }
    if m.owner {
        if let Some(entry) = shared.my_entry() {
            entry.cpu_query.store(0, Ordering::Release);
        }
        // After the entry stopped showing the statement as running, so that the tuner
        // never reads it twice.
        if let Some(s) = &snapshot {
            // The leader's own measurements join its workers' sums.
            if let Some(at_arrival) = m.arrival.cpu_ns {
                m.acct.cpu_total_ns = thread_cpu_ns().saturating_sub(at_arrival);
            }
            let acct = shared.my_entry().map_or(m.acct, |e| {
                e.workers_acct.add(&m.acct);
                Accounting {
                    first_slot_ns: m.acct.first_slot_ns,
                    workers_planned: e.workers_planned.load(Ordering::Relaxed),
                    ..e.workers_acct.take()
                }
            });
            let ended = trace::Ended {
                arrival: m.arrival,
                query_id: m.query_id,
                procs: m.procs,
                pinned_priority: m.pinned_priority,
                failed,
                acct,
            };
            trace::record_end(shared, &ended, s);
        }
        // Parallel workers leave before the leader's ExecutorEnd; after an error they
        // may not have yet, and the scheduler worker frees the entry once they have.
        let freed = shared.with_admission(|_, _| sched.unregister_query(query));
        match (freed, snapshot) {
            (Ok(()), Some(s)) => shared.groups.add_cpu(s.group.0 as usize, s.cpu_ns),
            (Ok(()), None) => {}
            (Err(_), _) => shared.orphan_query(query),
        }
    }
}

/// The scheduler worker's part: frees query entries orphaned by failed statements once
/// their parallel workers have left. (A process that exits leaves its query in its exit
/// callback; one that dies without running it makes the postmaster reinitialise shared
/// memory.)
pub fn reclaim(shared: &shmem::Shared) {
    let Some(sched) = shared.sched() else { return };
    shared.free_orphans(|query| {
        let snapshot = sched.query_snapshot(query);
        let freed = shared
            .with_admission(|_, _| sched.unregister_query(query))
            .is_ok();
        if let (true, Some(s)) = (freed, snapshot) {
            shared.groups.add_cpu(s.group.0 as usize, s.cpu_ns);
        }
        freed
    });
}

/// Applies the decay settings after a reload, unless the tuner's are in force and the
/// configured ones did not change (`shmem::TunerState::apply_configured`); the slot
/// count follows at the watchdog's next round.
pub fn apply_settings(shared: &shmem::Shared, sched: &SchedShared) {
    shared
        .tuner
        .apply_configured(sched, gucs::decay_params(), gucs::TUNER.get());
}

/// What the watchdog saw of a process at its previous round.
#[derive(Clone, Copy, Default)]
pub struct Seen {
    /// Holding a slot and waiting on an event.
    blocked: bool,
    /// Its check-in count, while it held a slot and was not waiting.
    checkins: Option<u32>,
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
///
/// With `pg_stride.lend_on_overrun`, a holder that ran a whole round without reaching a
/// yield point (a sort, a hash aggregate's output, no scan below) gets the same extra
/// slot while others wait: they then share the CPU with it through the kernel instead
/// of waiting for its slice to end (wagner2021 §3.1 charges the overrun to its pass
/// afterwards; this bounds the wait).
pub fn watchdog(shared: &shmem::Shared, before: &mut Vec<Seen>) {
    let Some(sched) = shared.sched() else { return };
    let procs = sched.capacity().max_procs as usize;
    before.resize(procs, Seen::default());
    let lend_on_overrun = gucs::LEND_ON_OVERRUN.get() && !sched.nobody_waits();
    // Split by node with `numa = bind`; a blocked holder's extra slot goes to the node
    // whose slot it holds.
    let mut slots = numa::slot_split(gucs::effective_cpu_slots());
    let last = slots.len() - 1;
    for (procno, seen) in before.iter_mut().enumerate() {
        let proc = ProcId(procno as u32);
        let running = sched.is_running(proc);
        // A stale read of the wait event only delays the decision by a round.
        let waiting = running && pg::proc_wait_event(procno) != 0;
        let checkins = (running && !waiting)
            .then(|| shared.procs().get(procno))
            .flatten()
            .map(|e| e.checkins.load(Ordering::Relaxed));
        let overran = lend_on_overrun && checkins.is_some() && checkins == seen.checkins;
        let blocked = waiting && seen.blocked;
        if seen.lent && !blocked && !overran && running && !sched.nobody_waits() {
            // Its extra slot goes away with this round: it competes for its slot at its
            // next tuple, in stride order with the waiters, rather than keep it to the
            // end of its slice (docs/design.md §4 rule 12).
            sched.yield_flag(proc).store(1, Ordering::Relaxed);
        }
        if blocked || overran {
            let node = sched.slot_node(proc).unwrap_or(0) as usize;
            slots[node.min(last)] += 1;
            if !seen.lent {
                let count = if blocked {
                    &shared.lends.blocked
                } else {
                    &shared.lends.overrun
                };
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        *seen = Seen {
            blocked: waiting,
            checkins,
            lent: blocked || overran,
        };
    }
    if sched.node_slots() != slots {
        sched.set_node_slots(&slots);
    }
    dispatch_free_slots(sched);
    pinning::sweep(shared, sched);
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
    pinning::pausing(shared, proc);
    if gucs::PREEMPT_LOWER_PRIORITY.get() && sched.ask_holder_to_yield(proc).is_some() {
        shared.yield_requests.fetch_add(1, Ordering::Relaxed);
    }
    // Waiting from when the slot was given up (`since`), or from now.
    let paused_at_ns = since.unwrap_or_else(pg::monotonic_ns);
    MEMBER.with_borrow_mut(|m| {
        if let Some(m) = m.as_mut() {
            m.pause_begins(since.is_some());
        }
    });
    let is_running = || {
        let running = sched.is_running(proc);
        if let Some(entry) = shared.my_entry() {
            entry.paused.store(u32::from(!running), Ordering::Release);
        }
        running
    };
    // With the slots split by node, a process that waited `numa_steal_after` slices for
    // a slot of its home node may take another node's (psaroudakis2016 §4), and offers
    // itself to every node's free slots again after each further such wait.
    let steal_after = gucs::numa_steal_after()
        .filter(|_| sched.node_count() > 1)
        .map(|k| {
            let wait =
                std::time::Duration::from_nanos(gucs::slice_ns().saturating_mul(u64::from(k)));
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
    follow_slot(shared, sched, proc);
    // On the CPU it owns now (`restart_charging` below withdraws the last share).
    slice_share::starts(shared);
    count_check_in(shared);
    let now = pg::monotonic_ns();
    // When the slot was handed over. A note older than this pause is a previous
    // hand-off's: the slot reached this process before the giver noted it (between
    // giving it in the scheduler and `hand_over`), or before the pause began, so it
    // found the slot at once.
    let given = shared
        .my_entry()
        .map(|e| e.slot_given_ns.load(Ordering::Acquire))
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

/// Wraps the scans of `desc`'s plan with yield points, those of its subplans and
/// initPlans (`es_subplanstates`: an InitPlan can be as big as the rest of the query,
/// as in TPC-H Q11) included, and with `pg_stride.yield_above_scans` the nodes that
/// return tuples from work already done. The scans produce the tuples everything above
/// them consumes, so they check in regularly while their consumers take input
/// (docs/design.md §8); a sort, an aggregate or a materialized result then emits its output
/// with no scan below it, as one long slice (bench/results/SIM_GAP.md).
/// ExecSetExecProcNode keeps PostgreSQL's first-call shim working.
fn wrap_scans(desc: *const pg_sys::QueryDesc) {
    let outputs = gucs::YIELD_ABOVE_SCANS.get();
    // SAFETY: after ExecutorStart the QueryDesc has its PlanState tree and EState, whose
    // es_subplanstates lists the PlanStates of every subplan.
    unsafe {
        wrap_scans_below(desc, (*desc).planstate, outputs);
        let estate = (*desc).estate;
        if !estate.is_null() {
            let subplans = pgrx::PgList::<pg_sys::PlanState>::from_pg((*estate).es_subplanstates);
            for plan in subplans.iter_ptr() {
                wrap_scans_below(desc, plan, outputs);
            }
        }
    }
}

/// Installs the yield point on `node`, once.
///
/// # Safety
/// `node` is a PlanState of the tree ExecInitNode built for `desc`.
unsafe fn wrap(desc: *const pg_sys::QueryDesc, node: *mut pg_sys::PlanState) {
    // SAFETY: the caller's promise.
    unsafe {
        // A node met twice keeps the function it had before the first time. An entry
        // of another statement at the same address is stale (that statement's nodes
        // were freed; a pool worker's next fragment reuses their memory) and is
        // replaced: calling its function on this node would run another node type.
        let original = (*node).ExecProcNodeReal;
        WRAPPED.with_borrow_mut(|w| {
            w.entry(node as usize)
                .and_modify(|x| {
                    if x.desc != desc {
                        *x = Wrapped { desc, original };
                    }
                })
                .or_insert(Wrapped { desc, original });
        });
        pg::set_exec_proc_node(node, Some(yield_point));
    }
}

/// Wraps the scans of the plan-state subtree at `node`, and with `outputs` the nodes
/// that return tuples from work already done (recursive: plan trees are shallow, and
/// this allocates nothing). Gather and Gather Merge stay as they are: the pool installs
/// its own function on them.
///
/// # Safety
/// `node` is null or a PlanState of the tree ExecInitNode built for `desc`.
unsafe fn wrap_scans_below(
    desc: *const pg_sys::QueryDesc,
    node: *mut pg_sys::PlanState,
    outputs: bool,
) {
    if node.is_null() {
        return;
    }
    // SAFETY: `node` is a PlanState of the tree (the caller's promise); its children are
    // too.
    unsafe {
        use pg_sys::NodeTag::*;
        match (*node).type_ {
            T_SeqScanState
            | T_IndexScanState
            | T_IndexOnlyScanState
            | T_BitmapHeapScanState
            | T_FunctionScanState
            | T_ValuesScanState
            | T_SampleScanState
            | T_TidScanState
            | T_TableFuncScanState
            | T_CteScanState
            | T_WorkTableScanState
            | T_NamedTuplestoreScanState => wrap(desc, node),
            #[cfg(not(feature = "pg13"))]
            T_TidRangeScanState => wrap(desc, node),
            T_SortState
            | T_IncrementalSortState
            | T_AggState
            | T_WindowAggState
            | T_SetOpState
            | T_MaterialState
                if outputs =>
            {
                wrap(desc, node)
            }
            #[cfg(not(feature = "pg13"))]
            T_MemoizeState if outputs => wrap(desc, node),
            T_AppendState => {
                let a = node.cast::<pg_sys::AppendState>();
                for i in 0..(*a).as_nplans as usize {
                    wrap_scans_below(desc, *(*a).appendplans.add(i), outputs);
                }
            }
            T_MergeAppendState => {
                let a = node.cast::<pg_sys::MergeAppendState>();
                for i in 0..(*a).ms_nplans as usize {
                    wrap_scans_below(desc, *(*a).mergeplans.add(i), outputs);
                }
            }
            T_SubqueryScanState => wrap_scans_below(
                desc,
                (*node.cast::<pg_sys::SubqueryScanState>()).subplan,
                outputs,
            ),
            _ => {}
        }
        wrap_scans_below(desc, (*node).lefttree, outputs);
        wrap_scans_below(desc, (*node).righttree, outputs);
    }
}

/// The yield point: counts tuples down and, when a chunk is done, checks in. It runs
/// outside pgrx's error boundary, so it cannot panic (a `try_` borrow, a hash lookup, a
/// counter), and it holds nothing with a destructor across the call of the scan's own
/// function, so an ERROR there may unwind through it as through C code.
unsafe extern "C-unwind" fn yield_point(
    node: *mut pg_sys::PlanState,
) -> *mut pg_sys::TupleTableSlot {
    let left = COUNTDOWN.get();
    if left <= 1 || asked_to_yield() {
        // SAFETY: a guarded function; it raises errors as PostgreSQL errors.
        unsafe { check_in() };
    } else {
        COUNTDOWN.set(left - 1);
    }
    let original = WRAPPED
        .try_with_borrow(|w| w.get(&(node as usize)).and_then(|x| x.original))
        .flatten();
    match original {
        // SAFETY: the function ExecInitNode installed for this node.
        Some(f) => unsafe { f(node) },
        // SAFETY: a guarded function that raises an ERROR.
        None => unsafe { lost_scan_function() },
    }
}

/// Whether a waiter of a higher priority asked this process to end its slice: one load
/// per tuple.
#[inline]
fn asked_to_yield() -> bool {
    YIELD_FLAG
        .get()
        .is_some_and(|f| f.load(Ordering::Relaxed) != 0)
}

/// Clears this process's request to end its slice; returns whether there was one.
fn take_yield_request() -> bool {
    YIELD_FLAG
        .get()
        .is_some_and(|f| f.swap(0, Ordering::AcqRel) != 0)
}

/// A wrapped node whose own function is not known any more: an internal error, never
/// a silently shortened scan.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn lost_scan_function() -> *mut pg_sys::TupleTableSlot {
    pgrx::error!("pg_stride: a yield point lost the scan function it wraps");
}

/// A chunk of tuples is done: measure it and, at the end of a slice, ask the scheduler
/// whether to go on.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_in() {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let Some(sched) = shared.sched() else { return };
    // Answered here whatever follows, so that a yield point reads it set only once.
    let asked = take_yield_request();
    count_check_in(shared);
    if admission::is_lent(shared) && interrupts_can_be_processed() {
        // Its admission was lent while it waited for its client: the statement takes it
        // back before it goes on, without a slot while it may wait (docs/design.md §4
        // rule 12).
        end_run(shared);
        admission::take_back(shared);
        begin_run(shared);
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
        COUNTDOWN.set(m.clock.chunk());
        match checkpoint {
            Checkpoint::Continue => None,
            Checkpoint::SliceEnd { used_ns } => {
                m.slice_start_ns = now;
                m.slice_used(used_ns);
                Some((m.proc, used_ns, slice_share::ends(shared, used_ns)))
            }
        }
    });
    let Some((proc, used_ns, ran)) = decision else {
        return;
    };
    // The next slice is measured from here, unless this process pauses: `pause` measures
    // it again from where it resumes, on the CPU of its new slot.
    slice_share::starts(shared);
    if !sched.is_running(proc) {
        return;
    }
    if !interrupts_can_be_processed() {
        // Rule 1: no pause inside an LWLock or critical section; look again soon.
        COUNTDOWN.set(RETRY_CHUNK);
        return;
    }
    if transaction_wrote() {
        // Rule 2: keep the slot rather than pause while holding row locks.
        return;
    }
    // A process on a slot away from its home got there by stealing and keeps the right
    // to. If it has to wait now, the other nodes' free slots (its home's among them) are
    // offered to it only by a dispatch, which it runs itself, as when it started
    // stealing (sched/src/shared/nodes.rs); else it would wait with a slot it may take
    // free until its next steal timeout or the watchdog's dispatch.
    let stealer = sched.away_from_home(proc);
    let outcome = sched.end_slice(proc, used_ns);
    // Per node, on the CPU the slice ended on (before a pause moves the process).
    numa::charge(shared, used_ns);
    let gave_up = (outcome.turn == Turn::Wait).then_some(proc);
    // Before the wake-up: from then on the receiver may have this CPU, and the time this
    // process still needs to get to its pause (the receiver may preempt it on their
    // shared CPU) is waiting for a slot, not holding one.
    let left_at =
        gave_up.and_then(|_| MEMBER.with_borrow_mut(|m| m.as_mut().map(Member::left_slot)));
    slice_share::publish(shared, ran.filter(|_| gave_up.is_none()));
    if gave_up.is_some() {
        // Paused before the wake-up: a receiver woken on this CPU (its slot's, or this
        // process's with `wake_on_giver_cpu`) preempts it there, and it then stays
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
        follow_slot(shared, sched, proc);
        if pinning::enabled(sched) {
            pinning::serve_stalled(shared, sched, proc, ran.map(|r| r.permille));
        }
    }
}

/// Tells the watchdog that this process reached a yield point (or took a slot).
fn count_check_in(shared: &shmem::Shared) {
    if let Some(entry) = shared.my_entry() {
        let n = entry.checkins.load(Ordering::Relaxed);
        entry.checkins.store(n.wrapping_add(1), Ordering::Relaxed);
    }
}

/// The statement's scans produced their first chunk: it is long enough to be scheduled.
/// Joins its query and takes a slot (pausing if none is free), where a pause is allowed.
fn join_at_first_check_in(shared: &shmem::Shared, sched: &'static SchedShared) {
    if transaction_wrote() {
        // Rule 2: a statement of a transaction holding row locks is never paused.
        COUNTDOWN.set(u32::MAX);
        return;
    }
    if !interrupts_can_be_processed() {
        // Rule 1: join where a pause would be allowed; look again soon.
        COUNTDOWN.set(RETRY_CHUNK);
        return;
    }
    if !join_query(shared, sched) {
        COUNTDOWN.set(u32::MAX);
        return;
    }
    let Some(proc) = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut()?;
        m.restart_charging();
        m.clock.restart();
        COUNTDOWN.set(m.clock.chunk());
        Some(m.proc)
    }) else {
        return;
    };
    take_slot(shared, sched, proc);
}
