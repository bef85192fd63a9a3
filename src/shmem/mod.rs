//! pg_stride's shared-memory region (docs/design.md §3).
//!
//! One fixed-size block, requested while `shared_preload_libraries` is processed and
//! initialised in `shmem_startup_hook`. It holds a small header and one [`ProcEntry`]
//! per PostgreSQL process that can run queries, indexed by the process's PGPROC number,
//! so that nothing can leak past a process's lifetime: the next process to use the same
//! PGPROC resets the entry, and the scheduler worker resets entries whose process is
//! gone.
//!
//! Everything in the region is an atomic or an integer fixed at initialisation; there are
//! no pointers, so the layout is valid in every process whatever address it is mapped at.
//!
//! Who writes what, and under which lock:
//!
//! * a process's own [`ProcEntry`] fields are written by that process only, lock-free;
//!   readers (views, the scheduler worker, other backends choosing worker grants) read
//!   the atomics and tolerate a value a moment old. Once the process is gone, whoever
//!   resets the entry writes them: the next process to claim it, or the scheduler
//!   worker, which first takes the pid away with a compare-and-swap. Exceptions, each
//!   with its own protocol: the admission `lease` (the scheduler worker lends it),
//!   `orphan_query` (the scheduler worker clears it once it freed the query) and
//!   `admitted_pending` (zeroed by a statistics reset);
//! * a process's [`Inbox`] is written by others — the process that hands it a slot or a
//!   CPU, its parallel workers, the scheduler worker asking to cancel or move its
//!   statement — and read, and cleared where it acted, by the process;
//! * the admission queue and the per-process `Waiter`s: under [`LockId::Admission`],
//!   exclusive ([`Shared::with_admission`]); the admission counts (`Counts`) beside them
//!   are atomics, for the lock-free fast path;
//! * the group directory: under [`LockId::Directory`], exclusive for the groups loader
//!   and a transaction that changed the groups table, shared for readers; the decay
//!   parameters' owner and the tuner's history: under [`LockId::Tuner`]; the recent
//!   rule hits: under [`LockId::RuleHits`]; the statement histories: under
//!   [`LockId::Histories`], shared to predict, exclusive to record;
//! * the other header counters are atomics, each written by the process named at its
//!   definition.

mod cpu_owners;
mod directory;
mod histories;
mod locks;
mod node_counters;
mod rule_hits;
mod startup;
mod tuner_state;

pub use locks::{LockId, ShmemLock};
use locks::{LOCKS, LOCK_COUNT};

pub use cpu_owners::CpuOwners;
pub use directory::{Group, GroupDirectory, MAX_GROUPS};
pub use histories::Histories;
pub use node_counters::{NodeCounters, MAX_NODES};
pub use rule_hits::{RuleHit, RuleHits};
pub use startup::{install, Block, Initial};
pub use tuner_state::{RefreshRow, TunerState};

use crate::os;
use crate::pg;
use pg_stride_sched::admission::{Counts, Lease, Queue, Waiter};
use pg_stride_sched::trace_ring::TraceRing;
use pg_stride_sched::tuner::Accounting;
use pg_stride_sched::{Capacity, Policy, QueryId, SchedConfig, SchedShared};
use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};

const REGION_NAME: &CStr = c"pg_stride";

/// Per-process state, in two parts by writer (the rules are in the module header): the
/// fields a process writes itself, and its [`Inbox`], which other processes write. Each
/// part has cache lines of its own: backends write their own fields at every statement,
/// and entries sharing a line would make their processes' caches fight over it; a giver
/// or the scheduler worker writing a process's inbox leaves the line its owner writes
/// alone.
#[derive(Default)]
#[repr(C, align(64))]
pub struct ProcEntry {
    /// pid of the process that last registered work here; 0 when unused. Set by the
    /// process when it claims the entry; cleared by the scheduler worker, with a
    /// compare-and-swap, once that process is gone.
    pub pid: AtomicI32,
    /// Top-level statements of this process that are admitted and executing.
    pub running: AtomicU32,
    /// Statements this process registered, counted (wrapping) before `running` counts
    /// each: a reader that sees the same count around its reads saw one statement.
    pub registered: AtomicU32,
    /// Top-level statements of this process that wait for admission.
    pub queued: AtomicU32,
    /// Group slot of this process's latest registered statement.
    pub group: AtomicU32,
    /// When the statement now waiting for admission arrived (TimestampTz, µs).
    pub queued_since: AtomicI64,
    /// When this process's latest statement was admitted (TimestampTz, µs).
    pub admitted_at: AtomicI64,
    /// Query entry (+1; 0 = none) this process registered in the CPU scheduler; its
    /// parallel workers join it.
    pub cpu_query: AtomicU32,
    /// Query entry (+1) this process could not free because parallel workers had not
    /// left it yet; the scheduler worker frees it later.
    pub orphan_query: AtomicU32,
    /// 1 while the process is paused at a yield point, waiting for a CPU slot.
    pub paused: AtomicU32,
    /// Parallel workers the current statement's plan asked for, over all its Gathers.
    pub workers_planned: AtomicU32,
    /// Parallel workers granted to the current statement (the concurrency hint).
    pub workers_granted: AtomicU32,
    /// Time the current statement spent paused at yield points, µs.
    pub paused_us: AtomicU64,
    /// Check-ins and slots taken by this process, counted (wrapping) so that the
    /// watchdog sees a holder that reached no yield point during a whole round.
    pub checkins: AtomicU32,
    /// The share of its last slice's wall-clock time this holder ran, ‰, and when that
    /// slice ended (CLOCK_MONOTONIC ns; 0 = no share to go by), published at its slice
    /// ends with pinned slots (`slice_share::publish`).
    pub slice_ran_permille: AtomicU32,
    pub slice_share_at_ns: AtomicU64,
    /// When the statement that registered `cpu_query` arrived (before admission) and
    /// was admitted, CLOCK_MONOTONIC ns: the tuner traces statements still running.
    pub query_arrival_ns: AtomicU64,
    pub query_admit_ns: AtomicU64,
    /// Rows the leader's current statement produced (returned, or changed by a write),
    /// as of its last check-in at a yield point: what runaway-query rules read.
    pub rows: AtomicU64,
    /// The query id of this process's current statement (0 = not computed), for the
    /// hits of runaway-query rules.
    pub query_id: AtomicU64,
    /// The CPU predicted for the query this process registered, and its class
    /// ([`ProcEntry::prediction`]); 0 = none.
    prediction: AtomicU64,
    /// The admission this process keeps between its statements while nobody waits. A
    /// protocol of its own (`pg_stride_sched::admission::Lease`): the scheduler worker
    /// lends it while the process waits for its client.
    pub lease: Lease,
    /// Statements of group slot `group` admitted at once and not yet added to the
    /// group's `admitted` counter, which every backend would otherwise write at every
    /// statement; counted for the slot's incarnation `pending_incarnation`.
    /// `pg_stride.reset_stats()` zeroes it from another backend: a statistics reset.
    pub admitted_pending: AtomicU64,
    pub pending_incarnation: AtomicU32,
    /// What other processes write for this one.
    pub inbox: Inbox,
}

/// The part of a [`ProcEntry`] that other processes write: a process that hands this
/// one a slot or a CPU, its parallel workers, and the scheduler worker. The owner reads
/// what they wrote, and clears the requests it acted on.
#[derive(Default)]
#[repr(C, align(64))]
pub struct Inbox {
    /// When a slot was last handed to this process (CLOCK_MONOTONIC ns), written by the
    /// process that hands it over just before setting the latch: the hand-off's latency.
    pub slot_given_ns: AtomicU64,
    /// 1 while this process runs as `SCHED_BATCH` because a statement leaving
    /// ExecutorRun handed it a slot (`cpu::hand_over`); the process sets itself back.
    pub woken_as_batch: AtomicU32,
    /// The CPU (+1; 0 = none) this process owns while it holds a slot
    /// (`pg_stride.pin_slots`), written by the process that gives it the CPU, or swaps
    /// CPUs with it.
    pub slot_cpu: AtomicU32,
    /// The CPU this process was last pinned to (none: unpinned), by itself or by the
    /// process that handed it a slot: its mask then holds that CPU alone. A
    /// `pg_stride_sched::pin_word`, which also counts its writes.
    pub pinned_cpu: AtomicU32,
    /// What the parallel workers of this process's current statement measured (they add
    /// theirs when they end; the leader takes the sum into its trace record).
    pub workers_acct: SharedAccounting,
    /// Written by the scheduler worker: a runaway-query rule (its index + 1; 0 = none)
    /// cancels this process's statement `rule_cancel_key` (its count in `registered`);
    /// the process clears it as it raises the error.
    pub rule_cancel: AtomicU32,
    pub rule_cancel_key: AtomicU32,
    /// Written by the scheduler worker: a runaway-query rule moves this process's
    /// statement `rule_move_key` to group slot `rule_move` - 1 (0 = none); the process
    /// clears it once its query moved.
    pub rule_move: AtomicU32,
    pub rule_move_key: AtomicU32,
}

/// [`Accounting`] as sums that several processes add to.
#[derive(Default)]
pub struct SharedAccounting {
    cpu_total_ns: AtomicU64,
    paused_ns: AtomicU64,
    handoff_ns: AtomicU64,
    held_ns: AtomicU64,
    held_runqueue_ns: AtomicU64,
    runqueue_ns: AtomicU64,
    runqueue_before_slot_ns: AtomicU64,
    paused_runqueue_ns: AtomicU64,
    long_slice_ns: AtomicU64,
    handoffs: AtomicU64,
}

impl SharedAccounting {
    /// Adds one process's measurements.
    pub fn add(&self, a: &Accounting) {
        self.cpu_total_ns
            .fetch_add(a.cpu_total_ns, Ordering::Relaxed);
        self.paused_ns.fetch_add(a.paused_ns, Ordering::Relaxed);
        self.handoff_ns.fetch_add(a.handoff_ns, Ordering::Relaxed);
        self.held_ns.fetch_add(a.held_ns, Ordering::Relaxed);
        self.held_runqueue_ns
            .fetch_add(a.held_runqueue_ns, Ordering::Relaxed);
        self.runqueue_ns.fetch_add(a.runqueue_ns, Ordering::Relaxed);
        self.runqueue_before_slot_ns
            .fetch_add(a.runqueue_before_slot_ns, Ordering::Relaxed);
        self.paused_runqueue_ns
            .fetch_add(a.paused_runqueue_ns, Ordering::Relaxed);
        self.long_slice_ns
            .fetch_add(a.long_slice_ns, Ordering::Relaxed);
        self.handoffs
            .fetch_add(u64::from(a.handoffs), Ordering::Relaxed);
    }

    /// Resets the sums to zero. Reads first, and writes only sums that are not zero: a
    /// statement without workers finds them all zero, and a swap is a locked instruction
    /// on a line that other processes write, at every statement.
    pub fn clear(&self) {
        for sum in [
            &self.cpu_total_ns,
            &self.paused_ns,
            &self.handoff_ns,
            &self.held_ns,
            &self.held_runqueue_ns,
            &self.runqueue_ns,
            &self.runqueue_before_slot_ns,
            &self.paused_runqueue_ns,
            &self.long_slice_ns,
            &self.handoffs,
        ] {
            if sum.load(Ordering::Relaxed) != 0 {
                sum.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The sums so far, reset to zero.
    pub fn take(&self) -> Accounting {
        Accounting {
            cpu_total_ns: self.cpu_total_ns.swap(0, Ordering::Relaxed),
            paused_ns: self.paused_ns.swap(0, Ordering::Relaxed),
            handoff_ns: self.handoff_ns.swap(0, Ordering::Relaxed),
            held_ns: self.held_ns.swap(0, Ordering::Relaxed),
            held_runqueue_ns: self.held_runqueue_ns.swap(0, Ordering::Relaxed),
            runqueue_ns: self.runqueue_ns.swap(0, Ordering::Relaxed),
            runqueue_before_slot_ns: self.runqueue_before_slot_ns.swap(0, Ordering::Relaxed),
            paused_runqueue_ns: self.paused_runqueue_ns.swap(0, Ordering::Relaxed),
            long_slice_ns: self.long_slice_ns.swap(0, Ordering::Relaxed),
            handoffs: self
                .handoffs
                .swap(0, Ordering::Relaxed)
                .min(u64::from(u32::MAX)) as u32,
            ..Accounting::default()
        }
    }
}

impl ProcEntry {
    /// Forgets everything the entry says; used when its process is gone, by the next
    /// process to claim it or by the scheduler worker.
    pub fn reset(&self) {
        self.running.store(0, Ordering::Relaxed);
        self.queued.store(0, Ordering::Relaxed);
        self.group.store(0, Ordering::Relaxed);
        self.queued_since.store(0, Ordering::Relaxed);
        self.admitted_at.store(0, Ordering::Relaxed);
        self.cpu_query.store(0, Ordering::Relaxed);
        self.paused.store(0, Ordering::Relaxed);
        self.admitted_pending.store(0, Ordering::Relaxed);
        self.inbox.slot_cpu.store(0, Ordering::Relaxed);
        // Unpinned, one write on: a process still pinning the entry's last process
        // (a giver between its mask and its compare-and-swap) fails its swap.
        let pinned = self.inbox.pinned_cpu.load(Ordering::Relaxed);
        self.inbox.pinned_cpu.store(
            pg_stride_sched::pin_word::next(pinned, None),
            Ordering::Relaxed,
        );
        self.slice_share_at_ns.store(0, Ordering::Relaxed);
        self.clear_statement();
        self.pid.store(0, Ordering::Release);
    }

    /// Publishes the CPU predicted for the query this process registered, µs, and
    /// whether that counts as short.
    pub fn publish_prediction(&self, cpu_us: u64, short: bool) {
        let word = (cpu_us.min(u64::MAX >> 2) << 2) | if short { 1 } else { 2 };
        self.prediction.store(word, Ordering::Relaxed);
    }

    /// The CPU predicted for the query this process registered, µs, and whether that
    /// counts as short; `None` without a prediction.
    pub fn prediction(&self) -> Option<(u64, bool)> {
        let word = self.prediction.load(Ordering::Relaxed);
        (word != 0).then_some((word >> 2, word & 3 == 1))
    }

    /// Forgets what the entry says of the previous statement; a new one starts.
    pub fn clear_statement(&self) {
        self.rows.store(0, Ordering::Relaxed);
        self.prediction.store(0, Ordering::Relaxed);
        self.workers_planned.store(0, Ordering::Relaxed);
        self.workers_granted.store(0, Ordering::Relaxed);
        self.paused_us.store(0, Ordering::Relaxed);
        self.inbox.workers_acct.clear();
    }
}

/// Header of the region, followed by `nprocs` [`ProcEntry`]s and `nprocs` admission
/// [`Waiter`]s. Aligned like the entries, so that they follow it without a gap.
#[repr(C, align(64))]
pub struct Shared {
    /// pid of the `pg_stride scheduler` worker, 0 while it is not running.
    pub scheduler_pid: AtomicI32,
    nprocs: u32,
    /// Resource groups, mirrored from `pg_stride.resource_groups`.
    pub groups: GroupDirectory,
    /// Admission counts and limits, for the lock-free fast path.
    pub admission: Counts,
    /// Admission queue; read and written under the admission lock only.
    queue: UnsafeCell<Queue>,
    /// Decay parameters in force and the tuner's refreshes.
    pub tuner: TunerState,
    /// CPU charged per NUMA node (`pg_stride.numa = stats`).
    pub nodes: NodeCounters,
    /// Recent hits of runaway-query rules (`pg_stride.rule_hits`).
    pub rule_hits: RuleHits,
    /// Statement histories predicting a statement's CPU (`pg_stride.statements`).
    pub histories: Histories,
    /// Which slot holder owns which CPU (`pg_stride.pin_slots`).
    pub cpu_owners: CpuOwners,
    /// Extra slots the watchdog lent since the server started to holders waiting on an
    /// event (`lent_blocked` of `pg_stride.scheduler`); a lend counts once however many
    /// rounds it lasts. Written by the scheduler worker only.
    pub lends_blocked: AtomicU64,
    /// Holders asked to end their slice early by a waiter of a higher priority, since
    /// the server started.
    pub yield_requests: AtomicU64,
    /// CPU swaps of a holder with a holder of a higher priority kept off its CPU
    /// (`cpu::pinning::serve_stalled`), since the server started; of those, swaps with
    /// one that was not stalled but ran too little of its last slice
    /// (`cpu::slice_share`).
    pub cpu_swaps: AtomicU64,
    pub cpu_share_swaps: AtomicU64,
}

// The region's interior mutability is either atomics or data changed only under an
// LWLock by code that raises no errors, so an error unwinding past a reference to it
// cannot leave it half-changed.
impl std::panic::RefUnwindSafe for Shared {}

impl Shared {
    fn size(nprocs: usize) -> usize {
        size_of::<Shared>() + nprocs * (size_of::<ProcEntry>() + size_of::<Waiter>())
    }

    /// Runs `f` on the admission queue and the per-process waiters, holding the
    /// admission lock exclusively. `f` must not raise errors (it runs pure logic).
    pub fn with_admission<R>(&self, f: impl FnOnce(&mut Queue, &mut [Waiter]) -> R) -> R {
        let _guard = ShmemLock::exclusive(LockId::Admission);
        // SAFETY: the waiters follow the process entries (`size`); their alignment (8)
        // divides the sizes before them. The exclusive lock makes this process the only
        // one touching the admission state and the waiters.
        unsafe {
            let waiters = (self as *const Shared)
                .add(1)
                .cast::<ProcEntry>()
                .add(self.nprocs as usize)
                .cast::<Waiter>()
                .cast_mut();
            f(
                &mut *self.queue.get(),
                std::slice::from_raw_parts_mut(waiters, self.nprocs as usize),
            )
        }
    }

    /// Every per-process entry.
    pub fn procs(&self) -> &[ProcEntry] {
        // SAFETY: the region was sized by `Shared::size(self.nprocs)` and the entries
        // were initialised right after the header (see `on_shmem_startup`); the header's
        // size is a multiple of ProcEntry's alignment (both are 64-byte aligned, and
        // PostgreSQL aligns shared-memory structs to cache lines).
        unsafe {
            let first = (self as *const Shared).add(1).cast::<ProcEntry>();
            std::slice::from_raw_parts(first, self.nprocs as usize)
        }
    }

    /// Whether entry `procno` belongs to a process that is still alive: its pid is the
    /// pid of the PGPROC with the same number. A process that exited without clearing
    /// its entry, or whose PGPROC was taken over by a new process, fails this.
    pub fn is_live(&self, procno: usize) -> bool {
        let Some(entry) = self.procs().get(procno) else {
            return false;
        };
        let pid = entry.pid.load(Ordering::Acquire);
        pid != 0 && pg::proc_pid(procno) == pid
    }

    /// Whether a live process runs a statement in group slot `slot`.
    pub fn slot_has_statements(&self, slot: usize) -> bool {
        self.procs().iter().enumerate().any(|(procno, e)| {
            e.group.load(Ordering::Acquire) as usize == slot
                && e.running.load(Ordering::Acquire) > 0
                && self.is_live(procno)
        })
    }

    /// This process's entry, if it is a process that can run queries.
    /// Statements of other processes that want CPU now: admitted and executing, not
    /// lent (a lent one waits on a lock or its client), or waiting for admission. Read
    /// without a lock: a moment old at worst. For the worker grant, which asks it only
    /// for plans with a Gather.
    pub fn statements_elsewhere(&self) -> u32 {
        let me = pg::my_procno();
        self.procs()
            .iter()
            .enumerate()
            .filter(|&(procno, entry)| {
                Some(procno) != me
                    && ((entry.running.load(Ordering::Relaxed) > 0 && !entry.lease.is_lent())
                        || entry.queued.load(Ordering::Relaxed) > 0)
                    && self.is_live(procno)
            })
            .count() as u32
    }

    pub fn my_entry(&self) -> Option<&ProcEntry> {
        self.procs().get(pg::my_procno()?)
    }

    /// The CPU scheduler (`pg_stride_sched`), in its own block of shared memory.
    pub fn sched(&self) -> Option<&'static SchedShared> {
        // SAFETY: null, or the scheduler initialised at startup, which stays mapped.
        unsafe { SCHED.load(Ordering::Acquire).as_ref() }
    }

    /// The tuner's trace of CPU-scheduled statements, in its own block of shared memory.
    pub fn trace(&self) -> Option<&'static TraceRing> {
        // SAFETY: null, or the ring initialised at startup, which stays mapped.
        unsafe { TRACE.load(Ordering::Acquire).as_ref() }
    }

    /// Leaves query entry `q` of this process for the scheduler worker to free.
    pub fn orphan_query(&self, q: QueryId) {
        if let Some(entry) = self.my_entry() {
            entry.orphan_query.store(q.0 + 1, Ordering::Release);
        }
    }

    /// Calls `free` for each orphaned query entry; forgets those it freed.
    pub fn free_orphans(&self, mut free: impl FnMut(QueryId) -> bool) {
        for entry in self.procs() {
            let q = entry.orphan_query.load(Ordering::Acquire);
            if q != 0 && free(QueryId(q - 1)) {
                let _ =
                    entry
                        .orphan_query
                        .compare_exchange(q, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static SCHED: AtomicPtr<SchedShared> = AtomicPtr::new(std::ptr::null_mut());
static TRACE: AtomicPtr<TraceRing> = AtomicPtr::new(std::ptr::null_mut());
/// The region, or `None` when pg_stride was not loaded through
/// `shared_preload_libraries` (then there is no region and every hook passes through).
pub fn shared() -> Option<&'static Shared> {
    // SAFETY: the pointer is either null or points at the region PostgreSQL keeps mapped
    // for the life of every process.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}
