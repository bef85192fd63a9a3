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
//! * a process's `Inbox` (`proc_entry`) is written by others — the process that hands
//!   it a slot or a CPU, its parallel workers, the scheduler worker asking to cancel or
//!   move its statement — and read, and cleared where it acted, by the process;
//! * the admission queue and the per-process `Waiter`s: under [`LockId::Admission`],
//!   exclusive ([`Shared::with_admission`]), and so are the CPU scheduler's query
//!   registrations ([`Shared::registration_lock`]); the admission counts (`Counts`) beside them
//!   are atomics, for the lock-free fast path;
//! * the group directory: under [`LockId::Directory`], exclusive for the groups loader
//!   and a transaction that changed the groups table, shared for readers; the decay
//!   parameters' owner and the tuner's history: under [`LockId::Tuner`]; the recent
//!   rule hits: under [`LockId::RuleHits`]; the statement histories: under
//!   [`LockId::Histories`], shared to predict, exclusive to record; the statements
//!   planned tiny that ran long: lock-free, by any backend (`long_runs`);
//! * the other header counters are atomics, each written by the process named at its
//!   definition.

mod cpu_owners;
mod directory;
mod histories;
mod locks;
mod node_counters;
mod proc_entry;
mod rule_hits;
mod tuner_state;

pub use locks::{LockId, ShmemLock};
use locks::{LOCKS, LOCK_COUNT};

pub use cpu_owners::CpuOwners;
pub use directory::{Group, GroupDirectory, MAX_GROUPS};
pub use histories::{database_of as history_database, scope as history_scope, Histories};
pub use node_counters::{NodeCounters, MAX_NODES};
pub use proc_entry::ProcEntry;
pub use rule_hits::{RuleHit, RuleHits};
pub use tuner_state::{RefreshRow, TunerState};

use crate::os;
use crate::pg;
use pg_stride_sched::admission::{group_has_waiters, Counts, Queue, Waiter};
use pg_stride_sched::long_runs::LongRuns;
use pg_stride_sched::shared::QuerySnapshot;
use pg_stride_sched::trace_ring::TraceRing;
use pg_stride_sched::{Capacity, Policy, QueryId, SchedConfig, SchedShared};
use pgrx::pg_sys;
use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU64, Ordering};

const REGION_NAME: &CStr = c"pg_stride";

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
    /// Statements planned tiny that ran long (`cpu::ran_long`); written by any backend,
    /// lock-free.
    pub long_runs: LongRuns,
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
    /// (`serve_stalled`, src/cpu/pinning.rs), since the server started; of those, swaps
    /// with one that was not stalled but ran too little of its last slice
    /// (src/cpu/slice_share.rs).
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
        // SAFETY: the waiters' slice (`waiters`); the exclusive lock makes this process
        // the only one touching the admission state and the waiters.
        unsafe {
            f(
                &mut *self.queue.get(),
                std::slice::from_raw_parts_mut(self.waiters(), self.nprocs as usize),
            )
        }
    }

    /// Runs `f` on a reading of the admission queue and the per-process waiters, holding
    /// the admission lock in shared mode: the views, which any role may read in a loop,
    /// read side by side rather than one after another, and take the lock the cheaper
    /// way. `f` must not raise errors.
    pub fn read_admission<R>(&self, f: impl FnOnce(&Queue, &[Waiter]) -> R) -> R {
        let _guard = ShmemLock::shared(LockId::Admission);
        // SAFETY: the waiters' slice (`waiters`); the shared lock keeps writers out while
        // `f` reads.
        unsafe {
            f(
                &*self.queue.get(),
                std::slice::from_raw_parts(self.waiters(), self.nprocs as usize),
            )
        }
    }

    /// The per-process waiters, `nprocs` of them: they follow the process entries
    /// (`size`), and their alignment (8) divides the sizes before them. To be read or
    /// written under the admission lock only.
    fn waiters(&self) -> *mut Waiter {
        // SAFETY: the region holds `nprocs` entries and then as many waiters.
        unsafe {
            (self as *const Shared)
                .add(1)
                .cast::<ProcEntry>()
                .add(self.nprocs as usize)
                .cast::<Waiter>()
                .cast_mut()
        }
    }

    /// Holds the admission lock exclusively for as long as the guard lives, around a
    /// change of the CPU scheduler's query table (register, move, unregister): that lock
    /// serialises registrations with one another (a new query's NUMA home), with group
    /// configuration and with admission. Callers run nothing that can raise an ERROR
    /// while they hold it.
    #[must_use = "the lock is released when the guard is dropped"]
    pub fn registration_lock(&self) -> ShmemLock {
        ShmemLock::exclusive(LockId::Admission)
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

    /// Whether a live process runs a statement in group slot `slot` (admitted in it, or
    /// moved there by a runaway-query rule: its CPU scheduling is that group's, or will be
    /// at its next yield point, or once its parallel workers left), or uses
    /// an admission of that group (a cursor opened before its session changed group), or
    /// a statement of that group is in the admission queue (looked up there, under its
    /// lock: a process counts itself queued only after it entered the queue).
    pub fn slot_has_statements(&self, slot: usize) -> bool {
        self.procs().iter().enumerate().any(|(procno, e)| {
            ((e.running.load(Ordering::Acquire) > 0
                && (e.group.load(Ordering::Acquire) as usize == slot
                    || self.cpu_group_of(e) == Some(slot)
                    || e.move_asked_for_this_statement() == Some(slot)))
                || e.lease.group_in_use() == Some(slot))
                && self.is_live(procno)
        }) || self.with_admission(|_, waiters| group_has_waiters(waiters, slot))
    }

    /// The query entry of `entry`'s process in the CPU scheduler, as it is now, once its
    /// statement joined CPU scheduling.
    pub fn query_of(&self, entry: &ProcEntry) -> Option<QuerySnapshot> {
        match entry.cpu_query.load(Ordering::Acquire) {
            0 => None,
            q => self.sched()?.query_snapshot(QueryId(q - 1)),
        }
    }

    /// CPU time, ns, that the query entry of `entry`'s process has used, its parallel
    /// workers' included (0 without one).
    pub fn query_cpu_ns(&self, entry: &ProcEntry) -> u64 {
        self.query_of(entry).map_or(0, |q| q.cpu_ns)
    }

    /// The group slot whose CPU share `entry`'s statement runs under, once it joined CPU
    /// scheduling.
    fn cpu_group_of(&self, entry: &ProcEntry) -> Option<usize> {
        self.query_of(entry).map(|q| q.group.0 as usize)
    }

    /// Statements of other processes that want CPU now: admitted and executing, not
    /// lent (a lent one waits on a lock or its client), or waiting for admission. Read
    /// without a lock: a moment old at worst. For the worker grant, which asks it only
    /// for plans with a Gather.
    pub fn statements_elsewhere(&self) -> u32 {
        self.statements_wanting_cpu(pg::my_procno())
    }

    /// Statements of all processes but `except` that want CPU now, as
    /// [`Shared::statements_elsewhere`] counts them: the concurrency hint's samples.
    pub fn statements_wanting_cpu(&self, except: Option<usize>) -> u32 {
        self.procs()
            .iter()
            .enumerate()
            .filter(|&(procno, entry)| {
                Some(procno) != except
                    && ((entry.running.load(Ordering::Relaxed) > 0 && !entry.lease.is_lent())
                        || entry.queued.load(Ordering::Relaxed) > 0)
                    && self.is_live(procno)
            })
            .count() as u32
    }

    /// This process's entry, if it is a process that can run queries.
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

const TRACE_REGION_NAME: &CStr = c"pg_stride trace";
const SCHED_REGION_NAME: &CStr = c"pg_stride scheduler";
/// Number of per-process entries: one for every PGPROC that can run a query (client
/// backends, autovacuum, background and parallel workers, WAL senders). Auxiliary
/// processes and prepared transactions have higher PGPROC numbers and no entry.
fn process_capacity() -> usize {
    #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: plain read of a global computed before shmem_request_hook runs.
        unsafe { pg_sys::MaxBackends as usize }
    }
    #[cfg(any(feature = "pg13", feature = "pg14"))]
    {
        // Before PG15 MaxBackends is not known yet while _PG_init runs, so add up its
        // parts as InitializeMaxBackends does.
        // SAFETY: GetConfigOption returns a pointer to the setting's current text (or
        // aborts for an unknown name, which autovacuum_max_workers is not); the other
        // values are plain reads of settings already loaded from postgresql.conf.
        unsafe {
            let autovacuum: usize = CStr::from_ptr(pg_sys::GetConfigOption(
                c"autovacuum_max_workers".as_ptr(),
                false,
                false,
            ))
            .to_str()
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(3);
            pg_sys::MaxConnections as usize
                + autovacuum
                + 1
                + pg_sys::max_worker_processes as usize
                + pg_sys::max_wal_senders as usize
        }
    }
}

/// Statements the trace holds: 2 MiB of 128-byte records, minutes of a busy server's
/// CPU-scheduled statements, more than a tuner window needs.
const TRACE_CAPACITY: u32 = 16_384;

static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;
#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18"))]
static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;

/// A block of shared memory that a module above this one keeps (the pool's), requested
/// and created through this module's one request and startup path.
pub struct Block {
    /// Its name for ShmemInitStruct.
    pub name: &'static CStr,
    pub size: usize,
    /// Called in every process at startup, under AddinShmemInitLock, with the block and
    /// whether another process created it already (`false`: initialise it).
    pub attach: unsafe fn(block: *mut u8, found: bool),
}

/// The other modules' blocks, set once by [`install`].
static BLOCKS: std::sync::OnceLock<&'static [Block]> = std::sync::OnceLock::new();

/// What the regions start with, from settings that modules above this one own: read
/// when the regions are created, after every setting was registered and the
/// configuration file read.
pub struct Initial {
    pub max_active_queries: u32,
    /// `pg_stride.memory_budget`, kB: in force before the scheduler worker's first
    /// application of the settings.
    pub memory_budget_kb: u64,
    pub cpu_slots: u32,
    pub decay: pg_stride_sched::DecayParams,
    /// `pg_stride.tuner`.
    pub tuner: bool,
}

/// The reader of [`Initial`], set once by [`install`].
static INITIAL: std::sync::OnceLock<fn() -> Initial> = std::sync::OnceLock::new();

/// Asks PostgreSQL for pg_stride's shared memory — its own regions and `blocks` — and
/// arranges their initialisation: the one place pg_stride installs shmem_request_hook
/// and shmem_startup_hook. Only valid while `shared_preload_libraries` is processed.
pub fn install(blocks: &'static [Block], initial: fn() -> Initial) {
    let _ = BLOCKS.set(blocks);
    let _ = INITIAL.set(initial);
    // SAFETY: _PG_init runs single-threaded in the postmaster; hooks are chained.
    unsafe {
        #[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18"))]
        {
            PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(on_shmem_request);
        }
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        request_space();
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(on_shmem_startup);
    }
}

/// Room of the CPU scheduler: every process may join a query, and every client
/// backend may register one (its open cursors share it).
fn sched_capacity() -> Capacity {
    let procs = process_capacity() as u32;
    Capacity {
        max_procs: procs,
        max_queries: procs,
        max_groups: MAX_GROUPS as u32,
    }
}

fn request_space() {
    // SAFETY: called from _PG_init or shmem_request_hook, where this is allowed.
    unsafe {
        pg_sys::RequestAddinShmemSpace(Shared::size(process_capacity()));
        pg_sys::RequestAddinShmemSpace(SchedShared::region_size(&sched_capacity()));
        pg_sys::RequestAddinShmemSpace(TraceRing::region_size(TRACE_CAPACITY));
        pg_sys::RequestNamedLWLockTranche(REGION_NAME.as_ptr(), LOCK_COUNT);
        for block in BLOCKS.get().copied().unwrap_or_default() {
            pg_sys::RequestAddinShmemSpace(block.size);
        }
    }
}

#[cfg(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18"))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_shmem_request() {
    // SAFETY: chaining to the hook installed before ours.
    if let Some(prev) = unsafe { PREV_SHMEM_REQUEST_HOOK } {
        // SAFETY: the hook installed before ours, called as PostgreSQL calls hooks.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| prev()) };
    }
    request_space();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_shmem_startup() {
    // SAFETY: chaining to the hook installed before ours.
    if let Some(prev) = unsafe { PREV_SHMEM_STARTUP_HOOK } {
        // SAFETY: the hook installed before ours, called as PostgreSQL calls hooks.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| prev()) };
    }
    let Some(initial) = INITIAL.get().map(|read| read()) else {
        internal_warning("pg_stride: shared memory was not installed".into());
        return;
    };
    let nprocs = process_capacity();
    let size = Shared::size(nprocs);
    // SAFETY: AddinShmemInitLock (MainLWLockArray[21] in every supported major) guards
    // ShmemInitStruct; the block is initialised before the lock is released, and only
    // when this is the first process to see it (`found` false).
    unsafe {
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let region =
            pg_sys::ShmemInitStruct(REGION_NAME.as_ptr(), size, &mut found).cast::<Shared>();
        debug_assert!(region.is_aligned(), "shared memory is cache-line aligned");
        if !found {
            (&raw mut (*region).scheduler_pid).write(AtomicI32::new(0));
            (&raw mut (*region).nprocs).write(nprocs as u32);
            GroupDirectory::init(&raw mut (*region).groups);
            (&raw mut (*region).admission).write(Counts::new(initial.max_active_queries));
            (*region)
                .admission
                .set_memory_accounting(initial.memory_budget_kb > 0);
            let mut queue = Queue::default();
            queue.set_memory_budget(initial.memory_budget_kb);
            (&raw mut (*region).queue).write(UnsafeCell::new(queue));
            TunerState::init(&raw mut (*region).tuner, initial.decay, initial.tuner);
            NodeCounters::init(&raw mut (*region).nodes);
            RuleHits::init(&raw mut (*region).rule_hits);
            Histories::init(&raw mut (*region).histories);
            (&raw mut (*region).long_runs).write(LongRuns::new());
            (&raw mut (*region).lends_blocked).write(AtomicU64::new(0));
            (&raw mut (*region).yield_requests).write(AtomicU64::new(0));
            (&raw mut (*region).cpu_swaps).write(AtomicU64::new(0));
            (&raw mut (*region).cpu_share_swaps).write(AtomicU64::new(0));
            CpuOwners::init(
                &raw mut (*region).cpu_owners,
                &os::allowed_cpus().unwrap_or_default(),
            );
            let first = region.add(1).cast::<ProcEntry>();
            for i in 0..nprocs {
                first.add(i).write(ProcEntry::default());
            }
            let waiters = first.add(nprocs).cast::<Waiter>();
            for i in 0..nprocs {
                waiters.add(i).write(Waiter::default());
            }
        }
        init_sched(&initial);
        init_trace();
        for block in BLOCKS.get().copied().unwrap_or_default() {
            let mut found = false;
            let ptr = pg_sys::ShmemInitStruct(block.name.as_ptr(), block.size, &mut found);
            (block.attach)(ptr.cast(), found);
        }
        pg_sys::LWLockRelease(lock);
        LOCKS.store(
            pg_sys::GetNamedLWLockTranche(REGION_NAME.as_ptr()),
            Ordering::Release,
        );
        SHARED.store(region, Ordering::Release);
    }
}

/// Creates the CPU scheduler's block, or attaches to it when another process did.
/// Caller holds AddinShmemInitLock.
unsafe fn init_sched(initial: &Initial) {
    let cap = sched_capacity();
    let size = SchedShared::region_size(&cap);
    let mut found = false;
    // SAFETY: ShmemInitStruct returns `size` bytes of shared memory that stay mapped,
    // initialised by whoever finds them new.
    let sched = unsafe {
        let ptr =
            pg_sys::ShmemInitStruct(SCHED_REGION_NAME.as_ptr(), size, &mut found).cast::<u8>();
        if found {
            SchedShared::attach(ptr)
        } else {
            let config = SchedConfig {
                cpu_slots: initial.cpu_slots,
                policy: Policy::DecayingStride,
                decay: initial.decay,
            };
            SchedShared::init_in(ptr, cap, &config)
        }
    };
    match sched {
        Ok(sched) => SCHED.store((sched as *const SchedShared).cast_mut(), Ordering::Release),
        Err(e) => internal_warning(format!("pg_stride: CPU scheduling is off: {e}")),
    }
}

/// Creates the trace ring's block, or attaches to it when another process did. Caller
/// holds AddinShmemInitLock.
unsafe fn init_trace() {
    let mut found = false;
    // SAFETY: ShmemInitStruct returns the requested bytes of shared memory that stay
    // mapped, initialised by whoever finds them new.
    let ring = unsafe {
        let ptr = pg_sys::ShmemInitStruct(
            TRACE_REGION_NAME.as_ptr(),
            TraceRing::region_size(TRACE_CAPACITY),
            &mut found,
        )
        .cast::<u8>();
        if found {
            TraceRing::attach(ptr)
        } else {
            TraceRing::init_in(ptr, TRACE_CAPACITY)
        }
    };
    match ring {
        Ok(ring) => TRACE.store((ring as *const TraceRing).cast_mut(), Ordering::Release),
        Err(e) => internal_warning(format!("pg_stride: the tuner's trace is off: {e}")),
    }
}

/// A shared region that would not initialise: its capacity comes from the server's own
/// limits, so this is a bug, reported without stopping the server.
fn internal_warning(message: String) {
    pg::report(
        pgrx::PgLogLevel::WARNING,
        pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        message,
        None,
    );
}
