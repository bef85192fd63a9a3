//! The pool's shared memory: one slot per pool worker, and counters.
//!
//! A slot's `word` packs a ticket generation (high 56 bits) and a state (low 8 bits);
//! every transition is a compare-and-swap on it, so a leader and a worker (or a worker
//! that exits) never both win one:
//!
//! ```text
//! FREE ─leader─▶ STARTING ─worker─▶ CONNECTING ─▶ IDLE
//! IDLE ─leader: reserve (gen+1)─▶ RESERVED ─leader: post─▶ POSTED
//! POSTED ─worker: take─▶ RUNNING     POSTED ─leader: revoke─▶ IDLE
//! RUNNING ─leader: cancel (then SIGINT)─▶ CANCEL
//! RUNNING|CANCEL ─worker: left the lock group─▶ RESTORING ─▶ IDLE
//! IDLE ─worker: retires or times out─▶ RETIRING (no leader reserves it) ─▶ exits
//! IDLE|CONNECTING ─DROP DATABASE's hook, then SIGTERM─▶ RETIRING ─worker sees it─▶ exits
//! any ─worker exits (on_shmem_exit, after its locks and DSM are gone)─▶ FREE
//! ```
//!
//! A ticket of generation g is *done* once the slot is no longer RESERVED, POSTED,
//! RUNNING or CANCEL at generation g: its worker holds no lock and is out of the
//! leader's lock group (or exited).

use crate::shmem;
use pgrx::pg_sys;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

pub const MAX_POOL: usize = 32;
/// Most pool workers one Gather uses (tickets of one round).
pub const MAX_TICKETS: usize = 16;

/// Sets the latch of the process with PGPROC number `procno` (-1: none).
pub fn set_latch_of(procno: i32) {
    if let Ok(procno) = usize::try_from(procno) {
        crate::pg::set_latch(procno);
    }
}

/// CLOCK_MONOTONIC in ms.
pub fn now_ms() -> i64 {
    (crate::os::monotonic_ns() / 1_000_000) as i64
}

/// This process's PGPROC number, -1 before it has one.
pub fn my_procno() -> i32 {
    crate::pg::my_procno().map_or(-1, |n| n as i32)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Free = 0,
    Starting = 1,
    Connecting = 2,
    Idle = 3,
    Reserved = 4,
    Posted = 5,
    Running = 6,
    Cancel = 7,
    Restoring = 8,
    /// The worker exits: leaders, which reserve idle slots only, pass it over.
    Retiring = 9,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Starting,
            2 => State::Connecting,
            3 => State::Idle,
            4 => State::Reserved,
            5 => State::Posted,
            6 => State::Running,
            7 => State::Cancel,
            8 => State::Restoring,
            9 => State::Retiring,
            _ => State::Free,
        }
    }
}

pub fn pack(gen: u64, state: State) -> u64 {
    (gen << 8) | state as u64
}
pub fn unpack(word: u64) -> (u64, State) {
    (word >> 8, State::from_u8((word & 0xff) as u8))
}

#[repr(C, align(64))]
#[derive(Default)]
pub struct Slot {
    pub word: AtomicU64,
    pub pid: AtomicI32,
    pub procno: AtomicI32,
    pub database: AtomicU32,
    pub starting_since_ms: AtomicI64,
    /// Set when the worker must exit at its next idle wake-up (DROP DATABASE …).
    pub retire: AtomicBool,
    // The ticket, written by the leader between RESERVED and POSTED.
    pub t_dsm: AtomicU32,
    pub t_worker_number: AtomicI32,
    /// The parallel context's worker count: the error queues the fragment may index.
    pub t_nworkers: AtomicI32,
    pub t_leader_procno: AtomicI32,
    pub t_posted_ns: AtomicU64,
    /// Generation of the last ticket whose fragment entered ParallelQueryMain here.
    pub entered_gen: AtomicU64,
    /// Generation of the last ticket whose fragment failed in its part of the plan: set
    /// when its ERROR or FATAL is about to go into the leader's error queue
    /// (messages.rs), or when the process exits there (failure_watch.rs reads it).
    pub failed_gen: AtomicU64,
    pub fragments: AtomicU64,
    /// Fragments of this worker that ended in an ERROR.
    pub errors: AtomicU64,
    /// The pid of the leader whose ticket the slot holds (0: none yet).
    pub leader_pid: AtomicI32,
    /// The last fragment's set-up: ticket posted → ParallelQueryMain entered (ns).
    pub last_setup_ns: AtomicU64,
    /// The worker's `system_user` is set (by a leader with a client identity), which
    /// cannot be undone: leaders without one do not post to it (identity.rs).
    pub system_user_set: AtomicBool,
    /// The authenticated, session and outer user of the leaders this worker served
    /// (InvalidOid: none yet). A worker serves leaders of one identity only: what a
    /// fragment leaves in the process — functions compiled under its search_path and
    /// temporary types, procedural languages' session data — must not reach another
    /// role's fragments (identity.rs).
    pub served: [AtomicU32; 3],
}

impl Slot {
    pub fn load(&self) -> (u64, State) {
        unpack(self.word.load(Ordering::Acquire))
    }

    pub fn cas(&self, from: (u64, State), to: (u64, State)) -> bool {
        self.word
            .compare_exchange(
                pack(from.0, from.1),
                pack(to.0, to.1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Whether the ticket of generation `gen` is done (see the module comment).
    pub fn done(&self, gen: u64) -> bool {
        let (g, s) = self.load();
        g != gen
            || !matches!(
                s,
                State::Reserved | State::Posted | State::Running | State::Cancel
            )
    }
}

/// Counters, in the order of [`COUNTER_NAMES`].
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Counter {
    GathersPooled,
    TicketsPosted,
    TicketsShort,
    FragmentsEntered,
    FragmentsOk,
    FragmentsError,
    FragmentsDeclined,
    CancelsSent,
    WorkersSpawned,
    WorkersRetired,
    WorkersIdleExited,
    LibrariesLoaded,
    TermEscalations,
    /// Workers that retired because a leader's settings created placeholders.
    RetiredForSettings,
    /// Gathers that found no idle worker and waited for one being started.
    WaitedForStart,
    /// Fragments that restored their leader's settings: those not already in force
    /// (worker_settings.rs).
    SettingsRestored,
    // Summed phase times of the fragments that ran (ns): posted → taken, taken →
    // ParallelQueryMain, ParallelQueryMain, → 'X' sent, → out of the lock group (the
    // ticket done), → own identity back (idle again).
    NsWake,
    NsRestore,
    NsRun,
    NsUntilX,
    NsUntilReleased,
    NsOwnRestore,
    /// Gathers that their leader ran alone while a command (DROP DATABASE, say) waited
    /// for their database to empty ([`PoolShared::closing`]).
    AloneForDatabaseCommand,
}
pub const COUNTER_NAMES: [&str; 23] = [
    "gathers_pooled",
    "tickets_posted",
    "tickets_short",
    "fragments_entered",
    "fragments_ok",
    "fragments_error",
    "fragments_declined_by_worker",
    "cancels_sent",
    "workers_spawned",
    "workers_retired",
    "workers_idle_exited",
    "libraries_loaded",
    "sigterm_escalations",
    "workers_retired_for_settings",
    "gathers_waited_for_start",
    "leader_settings_restored",
    "ns_wake",
    "ns_restore",
    "ns_run",
    "ns_until_x",
    "ns_until_released",
    "ns_own_restore",
    "gathers_alone_for_database_command",
];

/// Why a Gather ran with PostgreSQL's own workers instead of the pool, in the order of
/// [`FALLBACK_NAMES`].
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Fallback {
    /// The leader's transaction has an XID: its uncommitted catalog rows would need the
    /// cache invalidation and combo-CID handling of a fresh worker (docs/design.md §6).
    Xid,
    /// SERIALIZABLE: the pool does not attach to the leader's predicate-lock state.
    Serializable,
    /// No idle pool worker of the database (all busy, or still starting).
    NoIdleWorker,
    /// PostgreSQL set up no DSM segment for the Gather (no worker slot, or none wanted).
    NoDsm,
    /// The server's minor release is outside the range whose private layouts the pool
    /// was checked against (pg_stride_sched::pool::versions).
    UncheckedRelease,
    /// The server was built with assertions, which forbid taking a leader's
    /// authenticated user more than once per process (identity.rs).
    AssertBuild,
}
pub const FALLBACK_NAMES: [&str; 6] = [
    "transaction has an xid",
    "serializable",
    "no idle pool worker",
    "no parallel context",
    "server release not checked for the pool",
    "server built with assertions",
];

/// Databases whose fallbacks are counted apart; further ones share `other_databases`.
pub const FALLBACK_DATABASES: usize = 16;

#[repr(C)]
#[derive(Default)]
pub struct DatabaseFallbacks {
    pub database: AtomicU32,
    pub counts: [AtomicU64; FALLBACK_NAMES.len()],
}

#[repr(C)]
pub struct PoolShared {
    pub slots: [Slot; MAX_POOL],
    pub counters: [AtomicU64; COUNTER_NAMES.len()],
    pub fallbacks: [DatabaseFallbacks; FALLBACK_DATABASES],
    /// Fallbacks of the databases beyond the first [`FALLBACK_DATABASES`] (database 0).
    pub other_databases: DatabaseFallbacks,
    /// The WARNING that this server cannot run the pool was logged (once per server).
    pub unavailable_warned: AtomicBool,
    /// The server's `max_parallel_workers` and pool size, each plus one (0: not read
    /// yet), for the caps (lifecycle::publish_server_settings).
    pub server_parallel_workers: AtomicI32,
    pub server_pool_size: AtomicI32,
    /// The databases that a command waits to see empty (lifecycle::mark_closing): each
    /// entry is the database's OID << 32 | the command's procno + 1, 0 when free.
    pub closing: [AtomicU64; CLOSING_COMMANDS],
}

/// Commands that may wait for their database to empty at the same time. One beyond them
/// marks nothing: its pool is left to the autovacuum terminations alone.
pub const CLOSING_COMMANDS: usize = 16;

impl PoolShared {
    pub fn count(&self, c: Counter) {
        self.add(c, 1);
    }
    pub fn add(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a Gather of `database` that fell back for `why`. Entries are claimed by
    /// compare-and-swap from database 0 and never given back (a dropped database's stay).
    pub fn fall_back(&self, database: pg_sys::Oid, why: Fallback) {
        let database = u32::from(database);
        let entry = self
            .fallbacks
            .iter()
            .find(|e| {
                let owner = e.database.load(Ordering::Acquire);
                owner == database
                    || (owner == 0
                        && e.database
                            .compare_exchange(0, database, Ordering::AcqRel, Ordering::Acquire)
                            .map_or_else(|now| now == database, |_| true))
            })
            .unwrap_or(&self.other_databases);
        entry.counts[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Marks `database` as closing for the command of backend `procno`; false if every
    /// entry is taken.
    pub fn mark_closing(&self, database: pg_sys::Oid, procno: u32) -> bool {
        let mark = (u64::from(u32::from(database)) << 32) | (u64::from(procno) + 1);
        self.closing.iter().any(|entry| {
            entry.load(Ordering::SeqCst) == mark
                || entry
                    .compare_exchange(0, mark, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
        })
    }

    /// Takes away the marks of backend `procno`'s commands.
    pub fn unmark_closing(&self, procno: u32) {
        for entry in &self.closing {
            let mark = entry.load(Ordering::SeqCst);
            if mark != 0 && mark & u64::from(u32::MAX) == u64::from(procno) + 1 {
                let _ = entry.compare_exchange(mark, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }

    /// Whether a command waits for `database` to empty. Sequentially consistent with
    /// what the caller did before (a pool worker stopped showing itself as an autovacuum
    /// worker): either that command's wait sees it so, or this sees the mark.
    pub fn is_closing(&self, database: pg_sys::Oid) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        let database = u64::from(u32::from(database));
        self.closing.iter().any(|entry| {
            let mark = entry.load(Ordering::SeqCst);
            mark != 0 && mark >> 32 == database
        })
    }
}

/// The pool's block of shared memory, created with pg_stride's own (`shmem::install`).
pub const SHMEM_BLOCK: shmem::Block = shmem::Block {
    name: c"pg_stride pool",
    size: std::mem::size_of::<PoolShared>(),
    attach,
};

static mut SHARED: *const PoolShared = std::ptr::null();

pub fn shared() -> Option<&'static PoolShared> {
    // SAFETY: set once in shmem_startup_hook (inherited by every child), never changed.
    unsafe { SHARED.as_ref() }
}

/// Attaches to the pool's block, zeroing it first when this process is the first to
/// see it: zeroed memory is a valid PoolShared (every field is an atomic whose zero is
/// FREE / 0).
///
/// # Safety
/// `block` is the block `SHMEM_BLOCK` describes, in shared memory for the server's
/// life; called under AddinShmemInitLock.
unsafe fn attach(block: *mut u8, found: bool) {
    // SAFETY: the caller's promise.
    unsafe {
        if !found {
            std::ptr::write_bytes(block, 0, std::mem::size_of::<PoolShared>());
        }
        SHARED = block.cast();
    }
}
