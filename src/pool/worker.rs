//! The pool worker: a dynamic background worker connected to one database as the
//! bootstrap superuser, that serves fragments (tickets) one at a time, the way
//! `ParallelWorkerMain` (parallel.c) runs one and exits, but undoing each step after it
//! (docs/design.md §6's table). A fragment runs inside the worker's own `sigsetjmp`, so that
//! an ERROR in it (a division by zero, a cancel the leader sent) is reported to the
//! leader whole and the worker goes back to idle; an ERROR while undoing a fragment,
//! and a FATAL, end the process.

use super::ffi::*;
use super::port::*;
use super::shared::{self, pack, set_latch_of, Counter, Slot, State, MAX_TICKETS};
use super::{identity, lifecycle, messages, settings, worker_settings};
use crate::{cpu, pg, shmem};
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// What the worker restored for the fragment in progress, read by the teardown after a
/// longjmp: a static, not a local, so that the updates before an ERROR are seen.
#[derive(Clone, Copy)]
struct Frag {
    gen: u64,
    seg: *mut pg_sys::dsm_segment,
    leader: *mut pg_sys::PGPROC,
    leader_pid: i32,
    leader_procno: i32,
    /// The leader's serialized settings, when this fragment restored them (not already in
    /// force).
    settings: *mut c_char,
    /// The leader's users, which settings kept in force are kept for.
    users: worker_settings::Users,
    redirected: bool,
    joined: bool,
    session: bool,
    entered: bool,
    ok: bool,
    declined: bool,
    retire: bool,
    sigints: u32,
    t_taken: u64,
    t_entered: u64,
    t_ran: u64,
}

const NO_FRAG: Frag = Frag {
    gen: 0,
    seg: std::ptr::null_mut(),
    leader: std::ptr::null_mut(),
    leader_pid: 0,
    leader_procno: -1,
    settings: std::ptr::null_mut(),
    users: worker_settings::NO_USERS,
    redirected: false,
    joined: false,
    session: false,
    entered: false,
    ok: false,
    declined: false,
    retire: false,
    sigints: 0,
    t_taken: 0,
    t_entered: 0,
    t_ran: 0,
};

// Process-local state of the worker (one thread; statics because a longjmp skips
// Rust frames).
static mut FRAG: Frag = NO_FRAG;
static mut SLOT: usize = usize::MAX;
static mut FRAGMENT_CONTEXT: pg_sys::MemoryContext = std::ptr::null_mut();
static mut OWN: Option<identity::Own> = None;
/// When this worker last finished a fragment, or started (ms, CLOCK_MONOTONIC).
static mut LAST_USED_MS: i64 = 0;

/// SIGINTs this process received from the leader of the ticket it took: the leader
/// sends one after it won the compare-and-swap that cancels the fragment (tickets.rs),
/// and the teardown waits for it, so that it cannot cancel the next fragment. SIGINTs
/// from elsewhere do not count: this process's own lock or statement timeout (its
/// handler signals the process itself), or `pg_cancel_backend` by the leader's role.
static LEADER_SIGINTS: AtomicU32 = AtomicU32::new(0);
/// The pid whose SIGINTs count in [`LEADER_SIGINTS`]: the leader of the ticket taken.
static CANCELLER: AtomicI32 = AtomicI32::new(0);

/// The SIGINT handler: PostgreSQL's StatementCancelHandler, installed with the sender's
/// pid (`SA_SIGINFO`), which pqsignal does not give.
unsafe extern "C" fn on_sigint(signo: c_int, info: *mut libc::siginfo_t, _: *mut c_void) {
    // SAFETY: async-signal-safe calls and atomics only, errno kept, as PostgreSQL's
    // wrapper_handler (pqsignal.c) does; `info` is the kernel's for this signal.
    unsafe {
        let errno = *libc::__errno_location();
        if !info.is_null() {
            let sender = (*info).si_pid();
            if sender != 0 && sender == CANCELLER.load(Ordering::SeqCst) {
                LEADER_SIGINTS.fetch_add(1, Ordering::SeqCst);
            }
        }
        StatementCancelHandler(signo);
        *libc::__errno_location() = errno;
    }
}

/// Installs [`on_sigint`] for SIGINT, with pqsignal's flags.
///
/// # Safety
/// In the pool worker, before it unblocks signals.
unsafe fn install_sigint_handler() {
    // SAFETY: a zeroed sigaction is a valid empty one; the caller's promise.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
    }
}

/// The worker's on_shmem_exit callback: it runs after ShutdownPostgres (transaction
/// aborted, locks released) and after the DSM segments are detached, before ProcKill
/// takes the process out of any lock group. The slot becomes FREE; a leader waiting
/// for the ticket is woken.
unsafe extern "C-unwind" fn on_exit(_code: c_int, arg: pg_sys::Datum) {
    let Some(pool) = shared::shared() else { return };
    let Some(slot) = pool.slots.get(arg.value()) else {
        return;
    };
    slot.pid.store(0, Ordering::Release);
    let mut before = (0, State::Free);
    let _ = slot
        .word
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            before = shared::unpack(w);
            Some(pack(before.0, State::Free))
        });
    // A fragment in ParallelQueryMain ends with the process: its FATAL went to the
    // leader's error queue, which the leader reads even while it waits for this worker
    // inside its own part of the plan (failure_watch.rs). Not once the fragment's part
    // of the plan is done: the leader waits for it nowhere then.
    // SAFETY: the process-local fragment state, read after the fragment's code stopped.
    let in_plan = unsafe { FRAG.gen == before.0 && FRAG.entered && !FRAG.ok };
    if matches!(before.1, State::Running | State::Cancel) && in_plan {
        slot.failed_gen.store(before.0, Ordering::Release);
    }
    if matches!(
        before.1,
        State::Reserved | State::Posted | State::Running | State::Cancel
    ) {
        set_latch_of(slot.t_leader_procno.load(Ordering::Acquire));
    }
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_stride_pool_main(arg: pg_sys::Datum) {
    let index = arg.value();
    // SAFETY: the worker's own entry; bgw_extra holds what spawn() wrote.
    let (database, gen) = unsafe {
        let extra = (*pg_sys::MyBgworkerEntry).bgw_extra.as_ptr();
        (
            std::ptr::read_unaligned(extra.cast::<u32>()),
            std::ptr::read_unaligned(extra.add(8).cast::<u64>()),
        )
    };
    // SAFETY: signal handlers of a backend: die (FATAL at the next interrupt check),
    // cancel (ERROR there), reload.
    unsafe {
        pqsignal(libc::SIGTERM, die);
        install_sigint_handler();
        pqsignal(libc::SIGHUP, SignalHandlerForConfigReload);
        pg_sys::BackgroundWorkerUnblockSignals();
    }
    let Some(pool) = shared::shared() else { return };
    let Some(slot) = pool.slots.get(index) else {
        return;
    };
    // A test build starts slowly, as a worker forked on a busy server does.
    if pg::test_fault("pool_start_slowly") {
        std::thread::sleep(std::time::Duration::from_secs(4));
    }
    if !slot.cas((gen, State::Starting), (gen, State::Connecting)) {
        return;
    }
    // SAFETY: process-local globals; the exit callback is registered once.
    unsafe {
        SLOT = index;
        slot.pid.store(pg_sys::MyProcPid, Ordering::Release);
        slot.procno.store(shared::my_procno(), Ordering::Release);
        pg_sys::on_shmem_exit(Some(on_exit), pg_sys::Datum::from(index));
        // The bootstrap superuser, between fragments; each fragment takes its leader's
        // identity (identity.rs).
        pg_sys::BackgroundWorkerInitializeConnectionByOid(database.into(), pg_sys::InvalidOid, 0);
        worker_settings::keep_database_encoding();
        FrontendProtocol = PG_PROTOCOL_LATEST;
        FRAGMENT_CONTEXT = pg_sys::AllocSetContextCreateInternal(
            pg_sys::TopMemoryContext,
            c"pg_stride pool fragment".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        worker_settings::take_baseline();
        OWN = Some(identity::own());
        LAST_USED_MS = shared::now_ms();
        pgstat_report_activity(pg_sys::BackendState::STATE_IDLE, std::ptr::null());
    }
    // SAFETY: holding no LWLock.
    unsafe { pg::show_as_autovacuum(true) };
    if !slot.cas((gen, State::Connecting), (gen, State::Idle)) {
        return;
    }
    pool.count(Counter::WorkersSpawned);
    // SAFETY: the idle loop of this worker.
    unsafe { idle_loop(pool, slot) }
}

unsafe fn idle_loop(pool: &shared::PoolShared, slot: &Slot) -> ! {
    loop {
        let (gen, state) = slot.load();
        if state == State::Retiring {
            // Taken out of service by a DROP DATABASE (lifecycle::release_database),
            // which also sends SIGTERM.
            pool.count(Counter::WorkersRetired);
            // SAFETY: exits the process; on_exit frees the slot.
            unsafe { proc_exit(0) };
        }
        if state == State::Posted {
            // Only the leader that posted the ticket may cancel it, and only once it runs
            // (before, it revokes it): what is pending now is stale.
            CANCELLER.store(slot.leader_pid.load(Ordering::Relaxed), Ordering::SeqCst);
            // SAFETY: process-local interrupt flags, which signal handlers only set.
            unsafe { clear_stale_interrupts() };
        }
        // A test build takes the second ticket of a round late, as a worker slow to
        // wake does, so that its leader may meet a LIMIT before it is taken.
        if state == State::Posted
            && slot.t_worker_number.load(Ordering::Relaxed) == 1
            && pg::test_fault("pool_revoke_race")
        {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // Read before the ticket runs: its cancel may come as soon as it does.
        let sigints = LEADER_SIGINTS.load(Ordering::SeqCst);
        if state == State::Posted && slot.cas((gen, State::Posted), (gen, State::Running)) {
            // A test build is slow to stop showing itself as an autovacuum worker, as a
            // worker taken off its CPU right after it took the ticket is.
            if pg::test_fault("pool_take_slowly") {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            // SAFETY: the ticket is ours; holding no LWLock.
            unsafe {
                pg::show_as_autovacuum(false);
                run_ticket(pool, slot, gen, sigints);
            }
            continue;
        }
        // A reload that came during a fragment: its latch was taken by the fragment's
        // waits.
        // SAFETY: ProcessConfigFile in a background worker, holding no LWLock.
        unsafe { reload_config_if_pending() };
        // Above the caps (lowered by a reload, or this worker started by a process that
        // had not seen it yet): retire now, not at the idle timeout (never, for a pool
        // that stays busy).
        // SAFETY: process-local globals, set at the worker's start.
        let (index, database) = unsafe { (SLOT, pg_sys::MyDatabaseId) };
        if lifecycle::above_caps(pool, index, database) {
            slot.retire.store(true, Ordering::Release);
        }
        let idle_timeout = settings::idle_timeout_ms();
        let timed_out = idle_timeout > 0
            // SAFETY: a process-local global.
            && shared::now_ms().saturating_sub(unsafe { LAST_USED_MS }) >= i64::from(idle_timeout);
        let retiring = slot.retire.load(Ordering::Acquire);
        if retiring || timed_out {
            // Leaders reserve idle slots only: once the slot is retiring none can post
            // to it. A leader that reserved it first is served first (it sets the latch
            // when its ticket is posted).
            if slot.cas((gen, State::Idle), (gen, State::Retiring)) {
                pool.count(if retiring {
                    Counter::WorkersRetired
                } else {
                    Counter::WorkersIdleExited
                });
                // SAFETY: exits the process; on_exit frees the slot.
                unsafe { proc_exit(0) };
            }
        }
        // SAFETY: the latch wait of a background worker; a stray cancel while idle is
        // ignored, anything else (die, barriers, sinval catch-up) is served.
        unsafe {
            let rc = wait_latch(Some(1000), pg_sys::PG_WAIT_EXTENSION);
            pg_sys::QueryCancelPending = 0;
            check_for_interrupts();
            if rc & pg_sys::WL_TIMEOUT as c_int != 0 {
                // Keeps up with the invalidation queue while idle, so that the caches
                // stay warm instead of being reset (docs/design.md §6, Operations).
                StartTransactionCommand();
                CommitTransactionCommand();
            }
        }
    }
}

/// Forgets interrupts that came for no fragment: a cancel (a role's `pg_cancel_backend`
/// while the worker was idle), and from PostgreSQL 17 a transaction timeout that fired
/// after the last fragment's last interrupt check.
///
/// # Safety
/// Between fragments.
unsafe fn clear_stale_interrupts() {
    // SAFETY: the caller's promise; plain process-local flags.
    unsafe {
        pg_sys::QueryCancelPending = 0;
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            pg_sys::TransactionTimeoutPending = 0;
        }
    }
}

/// Reloads the configuration if a SIGHUP asked for it, around the baseline of settings
/// that fragments restore from.
///
/// # Safety
/// In the idle loop, holding no LWLock.
unsafe fn reload_config_if_pending() {
    // SAFETY: the caller's promise; ConfigReloadPending is set by the signal handler.
    unsafe {
        if pg_sys::ConfigReloadPending != 0 {
            pg_sys::ConfigReloadPending = 0;
            // Its transactions take locks: not as an idle worker that the command of a
            // database, or a lock waiter, may end as it ends autovacuum.
            pg::show_as_autovacuum(false);
            worker_settings::back_to_baseline();
            ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
            worker_settings::keep_database_encoding();
            worker_settings::take_baseline();
            pg::show_as_autovacuum(true);
        }
    }
}

/// Runs the ticket of generation `gen` that this worker took, and undoes it. `sigints`:
/// the leader's SIGINTs counted before it took the ticket.
unsafe fn run_ticket(pool: &shared::PoolShared, slot: &Slot, gen: u64, sigints: u32) {
    // SAFETY: the whole function is the worker's fragment protocol; see the module
    // comment. Nothing with a destructor lives in a frame a longjmp may skip.
    unsafe {
        FRAG = NO_FRAG;
        FRAG.gen = gen;
        FRAG.leader_procno = slot.t_leader_procno.load(Ordering::Relaxed);
        FRAG.sigints = sigints;
        FRAG.t_taken = crate::os::monotonic_ns();
        pool.add(
            Counter::NsWake,
            FRAG.t_taken
                .saturating_sub(slot.t_posted_ns.load(Ordering::Relaxed)),
        );
        let handle = slot.t_dsm.load(Ordering::Relaxed);
        let number = slot.t_worker_number.load(Ordering::Relaxed);
        messages::reset();
        let prev_stack = pg_sys::PG_exception_stack;
        let prev_context_stack = pg_sys::error_context_stack;
        pg_sys::CurrentMemoryContext = FRAGMENT_CONTEXT;
        let rc = cee_scape::call_with_sigsetjmp(true, |jump_buffer| {
            pg_sys::PG_exception_stack = std::ptr::from_ref(jump_buffer).cast_mut().cast();
            fragment(pool, slot, handle, number);
            0
        });
        pg_sys::PG_exception_stack = prev_stack;
        pg_sys::error_context_stack = prev_context_stack;
        hold_interrupts();
        let failed = rc != 0;
        if failed {
            // PostgreSQL's error state holds the ERROR: to the leader (while the error
            // queue is ours) and to the log, as a parallel worker's would go.
            // Sending it marks the slot failed first (messages.rs), while the fragment
            // is in the plan.
            EmitErrorReport();
            pool.count(Counter::FragmentsError);
            slot.errors.fetch_add(1, Ordering::Relaxed);
        } else if FRAG.declined {
            pool.count(Counter::FragmentsDeclined);
        }
        teardown(pool, slot, gen, failed);
        resume_interrupts();
    }
}

/// Attaches to the leader's DSM and restores its state, in ParallelWorkerMain's order,
/// then runs the plan fragment. Returns early (declined) when the fragment cannot run
/// here; it then never entered ParallelQueryMain, and the leader treats the slot as
/// one that took no work.
unsafe fn fragment(pool: &shared::PoolShared, slot: &Slot, handle: u32, number: i32) {
    // SAFETY: the caller's sigsetjmp catches every ERROR raised below.
    unsafe {
        // The error queues are an array of the context's nworkers (at most MAX_TICKETS
        // tickets are posted): a number outside it would write another's queue.
        let nworkers = slot.t_nworkers.load(Ordering::Relaxed);
        if number < 0 || number >= nworkers || number as usize >= MAX_TICKETS {
            FRAG.declined = true;
            return;
        }
        // A command (DROP DATABASE, say) waits for this database to empty, and may have
        // seen this worker, idle before it took the ticket, as an autovacuum worker to
        // terminate (lifecycle::mark_closing): it retires without starting the fragment.
        // Its caller stopped showing it as one first, so a command that marks the
        // database after this look sees it busy and leaves it to its leader. So does a
        // worker already told to terminate (by a command that has returned since).
        if pool.is_closing(pg_sys::MyDatabaseId) || pg_sys::ProcDiePending != 0 {
            FRAG.declined = true;
            FRAG.retire = true;
            return;
        }
        pg_sys::ParallelWorkerNumber = number;
        pg_sys::InitializingParallelWorker = true;
        let seg = dsm_attach(handle);
        if seg.is_null() {
            FRAG.declined = true; // the leader is gone already
            return;
        }
        FRAG.seg = seg;
        let toc = shm_toc_attach(PARALLEL_MAGIC, dsm_segment_address(seg));
        if toc.is_null() {
            FRAG.declined = true;
            return;
        }
        let fps = shm_toc_lookup(toc, PARALLEL_KEY_FIXED, false).cast::<FixedParallelState>();
        let entrypoint = shm_toc_lookup(toc, PARALLEL_KEY_ENTRYPOINT, false).cast::<c_char>();
        let function = entrypoint.add(libc::strlen(entrypoint) + 1);
        let libraries = shm_toc_lookup(toc, PARALLEL_KEY_LIBRARY, false).cast::<c_char>();
        if (*fps).database_id != pg_sys::MyDatabaseId
            || libc::strcmp(entrypoint, c"postgres".as_ptr()) != 0
            || libc::strcmp(function, c"ParallelQueryMain".as_ptr()) != 0
        {
            FRAG.declined = true;
            return;
        }
        // A worker serves one identity's leaders (identity.rs). Leaders check that before
        // they post; should a leader of another identity post all the same, the worker
        // declines and makes way for a fresh one.
        let users = identity::users_of(fps);
        if !identity::may_serve(&slot.served, users) {
            FRAG.declined = true;
            FRAG.retire = true;
            return;
        }
        identity::mark_served(&slot.served, users);
        // A library the leader loaded (plpgsql, say) is loaded here too, for good.
        if worker_settings::load_libraries(libraries) {
            pool.count(Counter::LibrariesLoaded);
        }
        FRAG.leader = (*fps).parallel_leader_pgproc;
        FRAG.leader_pid = (*fps).parallel_leader_pid;

        // Error queue, and protocol messages redirected to it (ours, not pqmq's).
        let queues = shm_toc_lookup(toc, PARALLEL_KEY_ERROR_QUEUE, false).cast::<u8>();
        let mq = queues
            .add(number as usize * PARALLEL_ERROR_QUEUE_SIZE)
            .cast::<pg_sys::shm_mq>();
        shm_mq_set_sender(mq, pg_sys::MyProc);
        let mqh = shm_mq_attach(mq, seg, std::ptr::null_mut());
        messages::redirect_to(mqh);
        FRAG.redirected = true;
        set_parallel_leader(fps);

        // Lock group: before anything takes a heavyweight lock.
        if !BecomeLockGroupMember((*fps).parallel_leader_pgproc, (*fps).parallel_leader_pid) {
            FRAG.declined = true;
            return;
        }
        FRAG.joined = true;
        SetParallelStartTimestamps((*fps).xact_ts, (*fps).stmt_ts);
        // Settings already in force are not restored again (worker_settings.rs). Others
        // are restored from the baseline, as a fresh parallel worker restores them, and
        // the baseline comes back before the identity is taken: restoring over another
        // leader's settings resets its `role`, whose assign hook clears the current role,
        // and the leader's `role` then takes the cleared one (its check hook copies the
        // current role while InitializingParallelWorker).
        let settings = shm_toc_lookup(toc, PARALLEL_KEY_GUC, false).cast::<c_char>();
        FRAG.users = worker_settings::Users {
            session_user: (*fps).session_user_id,
            session_user_is_superuser: (*fps).session_user_is_superuser,
            outer_user: (*fps).outer_user_id,
            role_is_superuser: (*fps).role_is_superuser,
        };
        if !worker_settings::in_force(settings, FRAG.users) {
            worker_settings::back_to_baseline();
            FRAG.settings = settings;
        }
        identity::adopt_users(fps);

        // RestoreLibraryState is replaced by the check above: nothing gets loaded.
        // Up to 17 the settings come first, in a transaction of their own; 18 restores
        // them inside the worker's transaction, once the snapshot is there, and the
        // pending syncs, relation map and reindex state before the combo CIDs.
        #[cfg(not(feature = "pg18"))]
        if !FRAG.settings.is_null() {
            StartTransactionCommand();
            worker_settings::restore_leader(settings);
            CommitTransactionCommand();
            pool.count(Counter::SettingsRestored);
        }
        StartParallelWorkerTransaction(
            shm_toc_lookup(toc, PARALLEL_KEY_TRANSACTION_STATE, false).cast(),
        );
        #[cfg(feature = "pg18")]
        restore_storage_state(toc);
        RestoreComboCIDState(shm_toc_lookup(toc, PARALLEL_KEY_COMBO_CID, false).cast());
        AttachSession(*shm_toc_lookup(toc, PARALLEL_KEY_SESSION_DSM, false).cast::<u32>());
        FRAG.session = true;
        let asnapspace = shm_toc_lookup(toc, PARALLEL_KEY_ACTIVE_SNAPSHOT, false).cast::<c_char>();
        let tsnapspace =
            shm_toc_lookup(toc, PARALLEL_KEY_TRANSACTION_SNAPSHOT, true).cast::<c_char>();
        let asnapshot = RestoreSnapshot(asnapspace);
        let tsnapshot = if tsnapspace.is_null() {
            asnapshot
        } else {
            RestoreSnapshot(tsnapspace)
        };
        RestoreTransactionSnapshot(tsnapshot, (*fps).parallel_leader_pgproc.cast());
        PushActiveSnapshot(asnapshot);
        #[cfg(feature = "pg18")]
        if !FRAG.settings.is_null() {
            worker_settings::restore_leader(settings);
            pool.count(Counter::SettingsRestored);
        }
        // No InvalidateSystemCaches (ParallelWorkerMain's): the leader has no XID
        // (checked before posting), hence no uncommitted catalog rows to see, and the
        // transaction start above took in every committed change; the caches stay warm.
        SetUserIdAndSecContext((*fps).current_user_id, (*fps).sec_context);
        SetTempNamespaceState((*fps).temp_namespace_id, (*fps).temp_toast_namespace_id);
        #[cfg(not(feature = "pg18"))]
        restore_storage_state(toc);
        RestoreUncommittedEnums(shm_toc_lookup(toc, PARALLEL_KEY_UNCOMMITTEDENUMS, false));
        #[cfg(not(feature = "pg15"))]
        if !identity::adopt_connection(toc) {
            // Leaders without a client identity post only to workers without one
            // (leader.rs): reaching this is a bug, never a fragment run with another
            // leader's system_user.
            FRAG.retire = true;
            raise(
                INTERNAL_ERROR,
                c"pg_stride pool: the pool worker cannot take the leader's client identity"
                    .as_ptr(),
            );
        }
        // Not restored: the serializable transaction (SERIALIZABLE leaders are declined).
        pg_sys::InitializingParallelWorker = false;
        EnterParallelMode();
        FRAG.entered = true;
        slot.entered_gen.store(FRAG.gen, Ordering::SeqCst);
        messages::plan_entered(&slot.failed_gen, FRAG.gen);
        pool.count(Counter::FragmentsEntered);
        FRAG.t_entered = crate::os::monotonic_ns();
        slot.last_setup_ns.store(
            FRAG.t_entered
                .saturating_sub(slot.t_posted_ns.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        ParallelQueryMain(seg, toc);
        messages::plan_done();
        FRAG.t_ran = crate::os::monotonic_ns();
        ExitParallelMode();
        PopActiveSnapshot();
        FRAG.ok = true;
    }
}

/// The leader's pending fsyncs of new relfilenodes, relation map and reindex state.
///
/// # Safety
/// `toc` is the table of contents of a parallel context's segment.
unsafe fn restore_storage_state(toc: *mut pg_sys::shm_toc) {
    // SAFETY: the caller's promise; the keys every parallel context has.
    unsafe {
        RestorePendingSyncs(shm_toc_lookup(toc, PARALLEL_KEY_PENDING_SYNCS, false).cast());
        RestoreReindexState(shm_toc_lookup(toc, PARALLEL_KEY_REINDEX_STATE, false));
        RestoreRelationMap(shm_toc_lookup(toc, PARALLEL_KEY_RELMAPPER_STATE, false).cast());
    }
}

/// Undoes a fragment, whatever point it reached, and gives the slot back. Runs with
/// interrupts held; an ERROR here ends the process (PG_exception_stack is the
/// background worker's), which frees the slot.
unsafe fn teardown(pool: &shared::PoolShared, slot: &Slot, gen: u64, failed: bool) {
    // SAFETY: see the function comment; each step undoes one of fragment()'s.
    unsafe {
        pg_sys::InitializingParallelWorker = false;
        // A fragment that ended well leaves the leader's settings it restored in force
        // (worker_settings.rs). 18 restored them inside the fragment's transaction, whose
        // abort would undo them: they outlive it, as at a commit. There they also set the
        // transaction's read-only flag, which a fragment that skips them takes from
        // default_transaction_read_only instead: settings that made it differ (BEGIN
        // READ ONLY) are not kept.
        #[cfg(not(feature = "pg18"))]
        let keep = FRAG.ok && !FRAG.settings.is_null();
        #[cfg(feature = "pg18")]
        let keep = FRAG.ok
            && !FRAG.settings.is_null()
            && pg_sys::XactReadOnly == pg_sys::DefaultXactReadOnly;
        #[cfg(feature = "pg18")]
        if keep {
            AtEOXact_GUC(true, 1);
        }
        // Never a commit (docs/design.md §6): CommitTransaction would report XactLastRecEnd
        // through parallel.c's MyFixedParallelState, NULL in this process.
        AbortOutOfAnyTransaction();
        LockReleaseAll(2 /* USER_LOCKMETHOD */, true);
        if failed {
            FlushErrorState();
        }
        if FRAG.session {
            // The record-typmod registry (docs/design.md §6): a worker may have cached
            // pointers into this session's DSA for any RECORD typmod; with none in the
            // registry, it cannot have.
            let registry = (*CurrentSession).shared_typmod_registry;
            if !registry.is_null()
                && std::ptr::read_volatile(&raw const (*registry).next_typmod) > 0
            {
                FRAG.retire = true;
            }
            DetachSession();
        }
        leave_cpu_scheduling(!FRAG.ok);
        if FRAG.ok {
            messages::send_terminate();
            pool.count(Counter::FragmentsOk);
            let now = crate::os::monotonic_ns();
            pool.add(Counter::NsRestore, FRAG.t_entered - FRAG.t_taken);
            pool.add(Counter::NsRun, FRAG.t_ran - FRAG.t_entered);
            pool.add(Counter::NsUntilX, now - FRAG.t_ran);
            FRAG.t_ran = now;
        }
        if FRAG.redirected {
            messages::restore();
        }
        if keep {
            worker_settings::keep(FRAG.settings, FRAG.users);
        }
        if !FRAG.seg.is_null() {
            dsm_detach(FRAG.seg);
        }
        if FRAG.joined && !leave_lock_group(FRAG.leader, FRAG.leader_pid) {
            // The leader exited while this process was in its group: only ProcKill
            // may return its PGPROC (docs/design.md §6).
            pool.count(Counter::WorkersRetired);
            proc_exit(0);
        }
        set_parallel_leader(std::ptr::null());
        pg_sys::ParallelWorkerNumber = -1;
        pg_sys::debug_query_string = std::ptr::null();
        if FRAG.entered {
            slot.fragments.fetch_add(1, Ordering::Relaxed);
        }
        // A test build may be slow here after a failed fragment, as a worker taken off
        // its CPU is, so that its leader, aborting, cancels the ticket first.
        if failed && pg::test_fault("pool_cancel_race") {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // The ticket is done: no lock held, out of the leader's group.
        let cancelled = !slot.cas((gen, State::Running), (gen, State::Restoring));
        if cancelled {
            // CANCEL: the leader sends SIGINT right after winning that CAS; wait until
            // it arrived, so that it cannot cancel the next fragment.
            slot.word
                .store(pack(gen, State::Restoring), Ordering::Release);
        }
        set_latch_of(FRAG.leader_procno);
        let released = crate::os::monotonic_ns();
        if FRAG.ok {
            pool.add(Counter::NsUntilReleased, released - FRAG.t_ran);
        }
        if cancelled {
            let mut waited = 0;
            while LEADER_SIGINTS.load(Ordering::SeqCst) == FRAG.sigints && waited < 5000 {
                wait_latch(Some(10), pg_sys::PG_WAIT_EXTENSION);
                waited += 10;
            }
            if LEADER_SIGINTS.load(Ordering::SeqCst) == FRAG.sigints {
                FRAG.retire = true;
            }
            pg_sys::QueryCancelPending = 0;
        }
        // Back to this process's own identity, and to its own settings unless the
        // leader's are known to be in force.
        worker_settings::settle();
        if let Some(own) = OWN {
            identity::restore_own(&own);
        }
        slot.system_user_set
            .store(identity::system_user_set(), Ordering::Release);
        SetTempNamespaceState(pg_sys::InvalidOid, pg_sys::InvalidOid);
        // Placeholders the leader's settings created (`SET app.tenant`) cannot be
        // removed: RestoreGUCState keeps them, reset to an empty string, and another
        // leader's fragment would read '' where its own backend reads NULL.
        if worker_settings::added_placeholders() {
            FRAG.retire = true;
            pool.count(Counter::RetiredForSettings);
        }
        // The fragment's statistics (its scans, tuples, blocks, temporary files) are
        // flushed now, as a parallel worker's are when it exits: a pool worker that
        // lives on would hold them back while it serves, and until it exits.
        pg_sys::pgstat_report_stat(true);
        pgstat_report_activity(pg_sys::BackendState::STATE_IDLE, std::ptr::null());
        pg_sys::CurrentMemoryContext = pg_sys::TopMemoryContext;
        MemoryContextReset(FRAGMENT_CONTEXT);
        if FRAG.ok {
            pool.add(Counter::NsOwnRestore, crate::os::monotonic_ns() - released);
        }
        if FRAG.retire {
            pool.count(Counter::WorkersRetired);
            proc_exit(0);
        }
        LAST_USED_MS = shared::now_ms();
        pg::show_as_autovacuum(true);
        slot.word.store(pack(gen, State::Idle), Ordering::Release);
    }
}

/// Leaves the leader's lock group the way ProcKill does, if the leader is still there
/// and still leads it; returns false otherwise (the caller then exits).
unsafe fn leave_lock_group(leader: *mut pg_sys::PGPROC, pid: i32) -> bool {
    // SAFETY: the leader's PGPROC is in allProcs; its partition lock protects the
    // group fields of every member.
    unsafe {
        let lock = lock_group_lwlock(leader);
        LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let me = pg_sys::MyProc;
        let ok = (*me).lockGroupLeader == leader
            && (*leader).pid == pid
            && (*leader).lockGroupLeader == leader;
        if ok {
            dlist_delete(&raw mut (*me).lockGroupLink);
            (*me).lockGroupLeader = std::ptr::null_mut();
        }
        LWLockRelease(lock);
        ok
    }
}

/// A fragment that ended without ExecutorEnd (an ERROR, `failed`) leaves the leader's
/// CPU scheduling here; a parallel worker would have exited.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn leave_cpu_scheduling(failed: bool) {
    // Also after a fragment that ended well: no statement of this process runs any
    // more, and nothing it wrapped may outlive it.
    if let Some(shared) = shmem::shared() {
        cpu::end_statement(shared, None, failed);
    }
}
