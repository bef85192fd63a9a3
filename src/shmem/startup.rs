//! How pg_stride's shared memory comes to be: the one request path (shmem_request_hook,
//! or `_PG_init` before PostgreSQL 15) and the one startup path (shmem_startup_hook),
//! for pg_stride's regions — the [`Shared`] header with its process entries, the CPU
//! scheduler's block, the trace ring — and the blocks other modules give [`install`].

use super::*;

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
    pub cpu_slots: u32,
    pub decay: pg_stride_sched::DecayParams,
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
            (&raw mut (*region).queue).write(UnsafeCell::new(Queue::default()));
            TunerState::init(&raw mut (*region).tuner, initial.decay);
            NodeCounters::init(&raw mut (*region).nodes);
            RuleHits::init(&raw mut (*region).rule_hits);
            Histories::init(&raw mut (*region).histories);
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
