//! This process's part in CPU scheduling, kept in process-local state: its membership
//! of a query (`Member`: slice clock, what it measured for the trace), the tuple
//! countdown a yield point reads, and its request flag to end a slice early.

use super::placement;
use super::trace::{self, Arrival};
use crate::backend_local::BackendLocal;
use crate::os::{self, thread_cpu_ns};
use crate::shmem;
use pg_stride_sched::predict::Prediction;
use pg_stride_sched::slice::{SliceClock, MAX_CHUNK};
use pg_stride_sched::tuner::{Accounting, TraceRecord};
use pg_stride_sched::{ProcId, QueryId};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};

/// This process's part in CPU scheduling.
pub(super) struct Member {
    pub(super) proc: ProcId,
    /// Group slot of the statements.
    pub(super) group: usize,
    /// The query entry; `None` until the statements reach their first check-in.
    pub(super) query: Option<QueryId>,
    /// Whether this process registered the query (a leader) rather than joined it.
    pub(super) owner: bool,
    pub(super) clock: SliceClock,
    /// Thread CPU time when the current chunk started, ns.
    pub(super) chunk_start_ns: u64,
    /// Thread CPU time since which nothing was charged, ns.
    pub(super) slice_start_ns: u64,
    /// Top-level statements sharing the query (cursors open at once).
    pub(super) statements: u32,
    /// Whether a second statement joined the query while the first ran (a statement
    /// beside an open cursor, a PL/pgSQL loop's body beside its loop's query): what the
    /// query used is then theirs together, and is not recorded as the first one's
    /// fingerprint's (`prediction::record`).
    pub(super) shared: bool,
    /// When the first of them arrived and was admitted.
    pub(super) arrival: Arrival,
    /// PostgreSQL's query identifier of the first, 0 if none was computed.
    pub(super) query_id: u64,
    /// The planner's total cost of the first's plan, as the default CPU cost settings
    /// would have made it (`plan_costs::at_defaults`).
    pub(super) plan_cost: f64,
    /// The CPU predicted for them when they joined, if any (`prediction`).
    pub(super) prediction: Option<Prediction>,
    /// Most processes that worked for them: the leader and its granted workers.
    pub(super) procs: u32,
    /// The static priority the query was registered with, if its group is pinned.
    pub(super) pinned_priority: Option<u32>,
    /// For a parallel worker, its leader's process number: the worker adds what it
    /// measured to the leader's entry when it ends.
    pub(super) leader: Option<usize>,
    /// What this process measured for the statement's trace record.
    pub(super) acct: Accounting,
    /// Since when this process holds its slot (CLOCK_MONOTONIC ns).
    pub(super) held_since_ns: Option<u64>,
    /// The thread's run delay when it took the slot, while statements are traced.
    pub(super) held_run_delay_ns: Option<u64>,
    /// The thread's run delay when it last gave its slot up, while traced.
    pub(super) left_run_delay_ns: Option<u64>,
    /// The thread's run delay when its current pause began, while traced.
    pub(super) paused_run_delay_ns: Option<u64>,
    /// The thread's run delay when it started working for the statements, while traced.
    pub(super) start_run_delay_ns: Option<u64>,
    /// Whether the first statement was tiny by its history (`tiny::tiny_by_history`):
    /// its end records its CPU there, not the query's (`prediction::record`).
    pub(super) by_history: bool,
    /// For such a statement, the thread CPU time (ns) before which its check-ins do not
    /// join the query: it takes a slot only once it has used a slice, so that one that
    /// ends within its history's bound never waits for one, and one that grew (its
    /// parameters select more, its table grew) runs unscheduled for at most about a
    /// slice before the slots, decay and runaway-query rules order it as any other.
    /// Cleared by a statement beside it that is not tiny by its history.
    pub(super) join_after_ns: Option<u64>,
    /// While the join is deferred, the tuples the countdown was last armed for.
    pub(super) deferred_chunk: u32,
    /// The statement whose top-level ExecutorRun is under way on CPU slots (its
    /// QueryDesc's address; compared, never followed): only its failure cuts that run
    /// short (`slots::abandon_run`), not that of a statement run inside it.
    pub(super) run_of: Option<usize>,
}

impl Member {
    pub(super) fn new(proc: ProcId, group: usize, query: Option<QueryId>, owner: bool) -> Member {
        Member {
            proc,
            group,
            query,
            owner,
            clock: SliceClock::new(super::settings::slice_ns()),
            chunk_start_ns: 0,
            slice_start_ns: 0,
            statements: 1,
            shared: false,
            arrival: Arrival::default(),
            query_id: 0,
            plan_cost: 0.0,
            prediction: None,
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
            start_run_delay_ns: trace::enabled().then(os::thread_run_delay_ns),
            by_history: false,
            join_after_ns: None,
            deferred_chunk: 0,
            run_of: None,
        }
    }

    /// The statement is tiny by its history: its check-ins join the query only once it
    /// has used a slice of CPU from now ([`Member::join_after_ns`]).
    pub(super) fn defer_join(&mut self) {
        self.by_history = true;
        self.deferred_run_begins(self.clock.chunk());
        self.join_after_ns = Some(
            self.chunk_start_ns
                .saturating_add(super::settings::slice_ns()),
        );
    }

    /// At a check-in before the query was joined: whether joining is still deferred
    /// ([`Member::join_after_ns`]). If so, the countdown is armed for the tuples that the
    /// chunk just done says take it to the deadline. Not the slice clock's doubling
    /// chunks: a statement that ends within its history's bound, as most do, then
    /// checks in once instead of at every doubling, each check-in reading the thread's
    /// CPU clock (a system call). The first chunk is measured from the run's start, so
    /// the rate errs low and the next check-in comes early.
    pub(super) fn defers_join(&mut self) -> bool {
        let Some(after) = self.join_after_ns else {
            return false;
        };
        let now = thread_cpu_ns();
        if now >= after {
            self.join_after_ns = None;
            return false;
        }
        let elapsed = now.saturating_sub(self.chunk_start_ns).max(1);
        self.chunk_start_ns = now;
        let done = f64::from(self.deferred_chunk.max(1));
        let to_deadline = done * (after - now) as f64 / elapsed as f64;
        self.deferred_chunk = to_deadline.ceil().clamp(1.0, f64::from(MAX_CHUNK)) as u32;
        arm_countdown(self.deferred_chunk);
        true
    }

    /// An ExecutorRun of a member whose join is deferred begins with the countdown armed
    /// for `chunk` tuples: its first chunk is measured from here, not from the end of
    /// the previous run (what ran between runs is not its CPU).
    pub(super) fn deferred_run_begins(&mut self, chunk: u32) {
        self.chunk_start_ns = thread_cpu_ns();
        self.deferred_chunk = chunk;
    }

    /// The process runs on a slot from now on (after a pause, if one began).
    pub(super) fn holds_slot(&mut self) {
        let now = os::monotonic_ns();
        self.held_since_ns = Some(now);
        self.held_run_delay_ns = trace::enabled().then(os::thread_run_delay_ns);
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
    pub(super) fn left_slot(&mut self) -> u64 {
        let now = os::monotonic_ns();
        if let Some(since) = self.held_since_ns.take() {
            self.acct.held_ns += now.saturating_sub(since);
        }
        if let Some(before) = self.held_run_delay_ns.take() {
            let at = os::thread_run_delay_ns();
            self.acct.held_runqueue_ns += at.saturating_sub(before);
            self.left_run_delay_ns = Some(at);
        }
        now
    }

    /// A pause begins: right after giving the slot up (`gave_up`), whose reading of the
    /// run delay it starts from, or before a first slot.
    pub(super) fn pause_begins(&mut self, gave_up: bool) {
        let left = self.left_run_delay_ns.take().filter(|_| gave_up);
        self.paused_run_delay_ns = left.or_else(|| trace::enabled().then(os::thread_run_delay_ns));
    }

    /// The run delay since the process started working for the statements, for its
    /// trace record at their end.
    pub(super) fn count_runqueue(&mut self) {
        if let Some(start) = self.start_run_delay_ns.take() {
            self.acct.runqueue_ns = os::thread_run_delay_ns().saturating_sub(start);
            if self.acct.first_slot_ns == TraceRecord::PENDING {
                self.acct.runqueue_before_slot_ns = self
                    .acct
                    .runqueue_ns
                    .saturating_sub(self.acct.paused_runqueue_ns);
            }
        }
    }

    /// A slice (or the tail of a run) used `used_ns` of CPU between two check-ins.
    pub(super) fn slice_used(&mut self, used_ns: u64) {
        let limit = self.clock.target_ns().saturating_mul(2);
        self.acct.long_slice_ns += used_ns.saturating_sub(limit);
    }

    /// Charging starts afresh now: CPU used before (not scheduled yet, or paused) is not
    /// the query's.
    pub(super) fn restart_charging(&mut self) {
        let now = thread_cpu_ns();
        (self.chunk_start_ns, self.slice_start_ns) = (now, now);
        placement::new_slot();
    }
}

/// The process's membership, while it has scheduled statements. The process's, not one
/// statement's (`statements::registry::Statement`): the statements of a backend (open cursors)
/// share one query and one slot, and a parallel worker is a member without a statement.
pub(super) static MEMBER: BackendLocal<RefCell<Option<Member>>> =
    BackendLocal::new(RefCell::new(None));
/// Tuples left before the next check-in; counting down is all a yield point does on most
/// tuples, so it is a plain cell of its own rather than a field behind a borrow.
/// Set through [`arm_countdown`] and [`disarm_countdown`]; only a yield point counts it down.
pub(super) static COUNTDOWN: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(u32::MAX));
/// Whether the countdown is armed, as this process's entry shows it
/// (`ProcEntry::checks_in`): published when it changes, not at every chunk.
static ARMED: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Arms the yield points: the next check-in comes after `chunk` tuples. A statement whose
/// yield points are armed checks in, and so takes back an admission lent while it waited
/// for its client, before it goes on far (docs/design.md §4 rule 12).
pub(super) fn arm_countdown(chunk: u32) {
    COUNTDOWN.set(chunk);
    publish_armed(true);
}

/// Disarms the yield points: no check-in until they are armed again.
pub(super) fn disarm_countdown() {
    COUNTDOWN.set(u32::MAX);
    publish_armed(false);
}

/// Shows in this process's entry whether its yield points are armed, when that changed:
/// the admission watchdog reads it to tell whether a lent admission would come back.
fn publish_armed(armed: bool) {
    if ARMED.replace(armed) != armed {
        if let Some(entry) = shmem::shared().and_then(|shared| shared.my_entry()) {
            entry.checks_in.store(u32::from(armed), Ordering::Release);
        }
    }
}

/// This process's request to end its slice early, in the scheduler's shared memory
/// (a waiter of a higher priority asks for it): a yield point reads it at every tuple. Set when
/// the process first takes a slot; its process entry stays the same for its lifetime,
/// so the flag outlives statements.
pub(super) static YIELD_FLAG: BackendLocal<Cell<Option<&'static AtomicU32>>> =
    BackendLocal::new(Cell::new(None));
/// Thread CPU time when this process last ended a statement as a worker of a leader:
/// a pool worker serves fragment after fragment, each counted from the one before, so
/// this outlives the membership of each.
pub(super) static WORKER_CPU_BASE: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));

/// Whether a waiter of a higher priority asked this process to end its slice: one load
/// per tuple.
#[inline]
pub(super) fn asked_to_yield() -> bool {
    YIELD_FLAG
        .get()
        .is_some_and(|f| f.load(Ordering::Relaxed) != 0)
}

/// Clears this process's request to end its slice; returns whether there was one.
pub(super) fn take_yield_request() -> bool {
    YIELD_FLAG
        .get()
        .is_some_and(|f| f.swap(0, Ordering::AcqRel) != 0)
}
