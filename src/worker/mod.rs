//! pg_stride's three static background workers (docs/design.md §2).
//!
//! * `pg_stride scheduler` keeps the safety net (docs/design.md §4 rule 9) from shared
//!   memory alone: it connects to no database and never uses SPI, so it keeps working
//!   when `pg_stride.database` is missing, locked or slow. It applies configuration
//!   reloads (`cpu_slots`, limits, decay), runs the CPU watchdog and the admission
//!   watchdog (every 20 ms), samples the
//!   concurrency hint (every 50 ms), reclaims the shared entries of
//!   processes that are gone (rule 8), admits queued backends that block admitted
//!   ones (rule 5), checks the groups' runaway-query rules (module [`rules`]), and
//!   clears the relations of expired statements that ran long (`cpu::sweep_long_runs`).
//! * `pg_stride tuner` (module [`tuner`]) chooses the decay parameters from the traced
//!   workload while `pg_stride.tuner` is on; shared memory only, like the scheduler.
//! * `pg_stride groups` connects to `pg_stride.database` and loads the resource groups
//!   from its table at start and whenever they change. If it cannot connect, it fails
//!   and is restarted later; meanwhile every session runs in `default`.

mod rules;
mod signals;
mod tuner;

pub use tuner::register_settings;

use signals::{exit_to_be_restarted, forget_this_worker, reload_config_if_signalled};

use crate::{admission, config, cpu, groups, parallel, pg, pool, shmem};
use pg_stride_sched::hint;
use pg_stride_sched::retry::RetryAfterFailure;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::{PgLogLevel, PgMemoryContexts, PgSqlErrorCode, PgTryBuilder};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Name and `backend_type` of the scheduler worker, as `pg_stat_activity` shows it.
pub const SCHEDULER_NAME: &str = "pg_stride scheduler";
/// Name and `backend_type` of the groups loader.
pub const LOADER_NAME: &str = "pg_stride groups";

/// How often the scheduler runs the CPU and admission watchdogs: a slot holder that
/// waits on an event, or an admitted statement that waits for its client, is seen at
/// two rounds in a row before its slot or admission is lent, so others wait behind it
/// 20–40 ms at most; each round is one pass over the process entries.
const WATCHDOG_INTERVAL: Duration = Duration::from_millis(20);

/// How often the scheduler sweeps the shared entries and looks for queued backends
/// that block admitted ones.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// Registers the workers. Called from `_PG_init` while preloading.
pub fn register() {
    // The scheduler connects to no database: that gives it a pg_stat_activity row,
    // nothing else.
    register_one(SCHEDULER_NAME, "pg_stride_scheduler_main", 5);
    register_one(LOADER_NAME, "pg_stride_groups_main", 10);
    register_one(tuner::TUNER_NAME, "pg_stride_tuner_main", 10);
}

/// Registers a static worker named `name` running `function`, restarted `restart_s`
/// seconds after it exits. Both start as soon as the server accepts connections, not
/// only after recovery: read-only queries on a hot standby are scheduled too.
fn register_one(name: &str, function: &str, restart_s: u64) {
    BackgroundWorkerBuilder::new(name)
        .set_type(name)
        .set_library("pg_stride")
        .set_function(function)
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::ConsistentState)
        .set_restart_time(Some(Duration::from_secs(restart_s)))
        .load();
}

/// The scheduler's periodic tasks and when each is due next.
struct Timers {
    watchdog: Instant,
    hint: Instant,
    sweep: Instant,
}

impl Timers {
    /// Every task due now: at start, and after a reload, so that a changed interval or
    /// slot count takes effect at once rather than at the time the old interval set.
    fn due_now() -> Self {
        let now = Instant::now();
        Timers {
            watchdog: now,
            hint: now,
            sweep: now,
        }
    }

    /// Whether the task due at `*due` is due; if so, schedules its next run `every` later.
    fn take(due: &mut Instant, every: Duration) -> bool {
        let now = Instant::now();
        if now < *due {
            return false;
        }
        *due = now + every;
        true
    }

    /// Time until the next task is due.
    fn sleep(&self) -> Duration {
        let next = self.watchdog.min(self.hint).min(self.sweep);
        next.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    }
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_stride_scheduler_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    let Some(shared) = shmem::shared() else {
        return;
    };
    shared.scheduler_pid.store(pg::my_pid(), Ordering::Release);
    pg::on_exit(forget_this_worker);
    config::apply(shared);
    pool::publish_server_settings();
    let mut cpu_seen = Vec::new();
    let mut admission_waits = Vec::new();
    let mut stalled_before = Vec::new();
    let mut rules_seen = HashMap::new();
    let sweep_context = PgMemoryContexts::new("pg_stride scheduler sweep");
    let mut timers = Timers::due_now();
    while BackgroundWorker::wait_latch(Some(timers.sleep())) {
        if reload_config_if_signalled() {
            config::apply(shared);
            pool::publish_server_settings();
            timers = Timers::due_now();
        }
        if Timers::take(&mut timers.watchdog, WATCHDOG_INTERVAL) {
            cpu::watchdog(shared, &mut cpu_seen);
            lend_waiting_admissions(shared, &mut admission_waits);
        }
        // The paper's sampling of the free workers (psaroudakis2013 §6).
        if Timers::take(
            &mut timers.hint,
            Duration::from_millis(hint::HINT_INTERVAL_MS),
        ) {
            if let Some(sched) = shared.sched() {
                sched.sample_hint(hint::HINT_ALPHA, shared.statements_wanting_cpu(None));
                sched.sample_node_util();
            }
        }
        if Timers::take(&mut timers.sweep, SWEEP_INTERVAL) {
            reclaim_entries(shared);
            cpu::reclaim(shared);
            cpu::sweep_long_runs(shared);
            rules::check(shared, &mut rules_seen);
            // SAFETY: the context was created above and is only used here; nothing
            // allocated in it outlives the call.
            unsafe {
                PgMemoryContexts::For(sweep_context.value())
                    .switch_to(|_| break_admission_cycles(shared, &mut stalled_before));
                pg_sys::MemoryContextReset(sweep_context.value());
            }
        }
    }
    exit_to_be_restarted();
}

#[pgrx::pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn pg_stride_groups_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // As pg_cron reads its jobs from cron.database_name.
    BackgroundWorker::connect_worker_to_spi(Some(&groups::database_name()), None);
    let Some(shared) = shmem::shared() else {
        return;
    };
    if let Some(procno) = pg::my_procno() {
        shared.groups.set_loader(procno);
    }
    pg::on_exit(forget_this_worker);
    let mut retry = RetryAfterFailure::default();
    let request = shared.groups.pending_reload();
    retry.record(Instant::now(), reload_groups(shared, request), request);
    // The pool of this database starts now rather than at its first Gather, and again
    // when parallel_mode becomes pool; not at every reload (an idle pool may have
    // exited on purpose, pg_stride.pool_idle_timeout).
    let mut pool_mode = parallel::pool_mode();
    pool::prestart();
    // Between reloads the loader is out of its database's way, as an idle pool worker
    // is (pg::show_as_autovacuum): DROP DATABASE, ALTER DATABASE … RENAME and CREATE
    // DATABASE … TEMPLATE end it rather than fail, and it comes back 10 s later.
    // SAFETY: between transactions, holding no LWLock.
    unsafe { pg::show_as_autovacuum(true) };
    while BackgroundWorker::wait_latch(retry.wait(Instant::now())) {
        if reload_config_if_signalled() && parallel::pool_mode() != pool_mode {
            pool_mode = parallel::pool_mode();
            pool::prestart();
        }
        let request = shared.groups.pending_reload();
        if retry.should_try(Instant::now(), request) {
            // SAFETY: as above; marked again once the reload's transaction ended.
            unsafe { pg::show_as_autovacuum(false) };
            let read = reload_groups(shared, request);
            // SAFETY: as above.
            unsafe { pg::show_as_autovacuum(true) };
            retry.record(Instant::now(), read, request);
        }
    }
    exit_to_be_restarted();
}

/// Reads the groups table into the directory, answering `request` (the newest made
/// before the read started, if one is pending); false if the read failed.
///
/// A failed read leaves the directory as it was (it is only written under its lock) and
/// the requests pending, and the loader goes on: it tries again later, or at once when
/// the groups change again (`pg_stride_sched::retry`).
/// Exiting instead would leave the groups as they were until the postmaster restarts
/// the loader, 10 s on. The read fails, for one, when a `DROP EXTENSION` takes the
/// table while the loader waits to read it: the loader found the table in the catalog
/// before the drop committed.
fn reload_groups(shared: &shmem::Shared, request: Option<u64>) -> bool {
    let read = PgTryBuilder::new(|| {
        BackgroundWorker::transaction(std::panic::AssertUnwindSafe(|| {
            config::reload_groups(shared, true)
        }));
        true
    })
    .catch_others(|error| {
        pg::abort_transaction_after_error();
        let message = match &error {
            CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => {
                report.message()
            }
            CaughtError::RustPanic { ereport, .. } => ereport.message(),
        };
        pg::report(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("pg_stride: could not reload the resource groups: {message}"),
            Some("The groups stay as they were until a read succeeds; the loader tries again after 1 s, then less often, up to every minute."),
        );
        false
    })
    .execute();
    if let (true, Some(request)) = (read, request) {
        shared.groups.reload_done(request);
    }
    read
}

/// The admission watchdog (docs/design.md §4 rules 5 and 12, psaroudakis2013 §5
/// applied to admission): an admitted statement that waits for its client at two
/// consecutive rounds, where lending cannot let it go on beyond the limits
/// ([`lendable_client_wait`]), has its admission lent out, so that a statement the
/// client may be waiting for can be admitted. A lent statement seen running counts
/// again if it can do so within the limits; otherwise its process takes the admission
/// back through the queue at its next yield point or ExecutorRun. A statement waiting
/// on a lock keeps its admission (it could not be stopped when the lock is granted),
/// unless that is needed to break a cycle (`break_admission_cycles`).
/// `waited_before` carries, per entry, the statement seen waiting at the previous round.
///
/// The entry's statement count is read around each look, because a backend between two
/// statements waits for its client too: a wait seen then belongs to no statement, and
/// lending the admission of the statement that follows it would let one statement more
/// than the limits run.
fn lend_waiting_admissions(shared: &shmem::Shared, waited_before: &mut Vec<Option<u32>>) {
    let procs = shared.procs();
    waited_before.resize(procs.len(), None);
    for (procno, (entry, before)) in procs.iter().zip(waited_before.iter_mut()).enumerate() {
        if !shared.is_live(procno) {
            *before = None;
            continue;
        }
        let waiting = || lendable_client_wait(entry, procno);
        let statement = statement_waiting(entry, waiting);
        match statement {
            Some(seen) if *before == Some(seen) => {
                admission::lend_if(shared, entry, false, || {
                    statement_waiting(entry, waiting) == Some(seen)
                });
            }
            Some(_) => {}
            None if entry.running.load(Ordering::Acquire) > 0 => {
                admission::reclaim_if_room(shared, entry);
            }
            None => {}
        }
        *before = statement;
    }
}

/// Whether process `procno`, of `entry`, waits for its client where its admission may be
/// lent without letting its statement go on beyond the limits. Reading from its client
/// (between statements or FETCHes), the statement takes an admission back at its next
/// ExecutorRun. In the middle of a statement (sending rows to a client that does not
/// read them, or waiting for a standby), only when the process's one statement runs
/// with its yield points armed (`checks_in`), without parallel workers: it takes one
/// back at its next check-in. Otherwise — a write, a read of a transaction that wrote,
/// a read too small to schedule, a Gather's leader passing on its workers' tuples — it
/// keeps its admission: lent, it would run on beyond the limits once its client reads
/// again. A cycle through such a client lasts until `pg_stride.queue_timeout`, as any
/// cycle the server cannot see (docs/design.md §4 rule 12).
fn lendable_client_wait(entry: &shmem::ProcEntry, procno: usize) -> bool {
    match pg::proc_waiting(procno) {
        pg::Waiting::Client { reading: true } => true,
        pg::Waiting::Client { reading: false } => {
            entry.running.load(Ordering::Acquire) == 1
                && entry.checks_in.load(Ordering::Acquire) == 1
                && entry.workers_granted.load(Ordering::Acquire) == 0
        }
        _ => false,
    }
}

/// The statement (its registration count) of `entry` that `waiting` saw waiting: one
/// that was registered before the look and still is after it.
fn statement_waiting(entry: &shmem::ProcEntry, waiting: impl Fn() -> bool) -> Option<u32> {
    let before = entry.registered.load(Ordering::Acquire);
    if entry.running.load(Ordering::Acquire) == 0 || !waiting() {
        return None;
    }
    // `registered` counts up before `running` does: a statement registered since the
    // first read shows in the count, whatever `running` says now.
    (entry.running.load(Ordering::Acquire) > 0
        && entry.registered.load(Ordering::Acquire) == before)
        .then_some(before)
}

/// Frees entries whose process is gone. Only the pid is cleared (with a compare-and-swap,
/// so an entry a new process has just claimed is left alone); counters are reset by the
/// next process that claims the entry, and readers ignore entries that are not live.
fn reclaim_entries(shared: &shmem::Shared) {
    for (procno, entry) in shared.procs().iter().enumerate() {
        let pid = entry.pid.load(Ordering::Acquire);
        if pid != 0 && !shared.is_live(procno) {
            let _ = entry
                .pid
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Breaks the cycles of waits that go through admission (docs/design.md §4 rules 5 and
/// 12), looking with the lock manager's own data (`pg_blocking_pids`), not SQL, while
/// statements are queued:
///
/// * a queued backend may hold locks (taken by its transaction's earlier statements, or
///   by its own statement while it was planned or before its admission was lent) that
///   a statement holding an admission waits for, directly or through backends waiting
///   on locks themselves (up to [`CHAIN_DEPTH`] steps): it is admitted ahead of its turn;
/// * an admitted statement whose lock wait can only end through a client — its chain of
///   blockers ends at a backend waiting for its client, seen so at two consecutive
///   sweeps — lends its admission: that client may be waiting for a queued statement
///   (an application that holds a lock on one connection while it queries on another).
///
/// Both cross the limits and are counted in the group's `over_limit_total`.
/// `stalled_before` carries, per entry, the statement seen stalled at the previous sweep.
fn break_admission_cycles(shared: &shmem::Shared, stalled_before: &mut Vec<Option<u32>>) {
    let procs = shared.procs();
    stalled_before.resize(procs.len(), None);
    if shared.admission.waiting() == 0 {
        stalled_before.fill(None);
        return;
    }
    let mut running = Vec::new();
    let mut queued = Vec::new();
    let lock_waits = pg::lock_waits_by_group(procs.len());
    let pids: HashMap<i32, usize> = (0..procs.len())
        .map(|procno| (pg::proc_pid(procno), procno))
        .filter(|&(pid, _)| pid != 0)
        .collect();
    for (procno, entry) in procs.iter().enumerate() {
        if !shared.is_live(procno) {
            continue;
        }
        let pid = entry.pid.load(Ordering::Acquire);
        if entry.queued.load(Ordering::Acquire) > 0 {
            queued.push((pid, procno));
        } else if entry.running.load(Ordering::Acquire) > 0 && lock_waits[procno] {
            // For a leader, pg_blocking_pids counts its workers' waits too.
            running.push((pid, procno));
        }
    }
    let mut stalled = vec![None; procs.len()];
    let waits = Waits {
        pids: &pids,
        on_lock: &lock_waits,
        blockers: RefCell::new(HashMap::new()),
    };
    for (waiter, waiter_procno) in running {
        let blockers = waits.blockers_of(waiter);
        let entry = &procs[waiter_procno];
        // A statement that holds an admission, waiting on a lock that a queued backend
        // holds, directly or through backends that wait on locks themselves (a DDL, a
        // write too small to admit: never registered): that backend waits for the
        // admission the statement holds, or for one its group's others hold.
        let holds_admission = entry.lease.group_in_use().is_some() && !entry.lease.is_lent();
        let mut on_chain = Vec::new();
        if holds_admission {
            waits.queued_on_chain(waiter, CHAIN_DEPTH, &queued, &mut on_chain);
        }
        for (blocker, procno) in on_chain {
            if admission::force_admit(shared, procno) {
                pgrx::log!(
                    "pg_stride: admitted process {blocker} ahead of its turn: it holds a lock that admitted process {waiter} waits for"
                );
            }
        }
        if entry.lease.lent_group().is_some()
            || !blockers.iter().any(|&b| waits.for_a_client(b, CHAIN_DEPTH))
        {
            continue;
        }
        let lock_wait = || pg::proc_waiting(waiter_procno) != pg::Waiting::No;
        let seen = statement_waiting(entry, lock_wait);
        if seen.is_some() && stalled_before[waiter_procno] == seen {
            let lent = admission::lend_if(shared, entry, true, || {
                statement_waiting(entry, lock_wait) == seen
            });
            if lent {
                pgrx::log!(
                    "pg_stride: process {waiter} lent its admission: the lock it waits for is held by a session waiting for its client"
                );
            }
        }
        stalled[waiter_procno] = seen;
    }
    *stalled_before = stalled;
}

/// Most blockers followed from a lock waiter to the backend its wait ends with.
const CHAIN_DEPTH: u32 = 4;

/// Who waits for what, as one look of the lock-holder watchdog saw it.
struct Waits<'a> {
    /// The server's pids, to process numbers.
    pids: &'a HashMap<i32, usize>,
    /// Per process number: it, or one of its parallel workers, waits on a lock.
    on_lock: &'a [bool],
    /// `pg_blocking_pids` of the processes asked about so far in this look: each call
    /// takes every lock-manager partition lock, and a hot row's waiters share blockers.
    blockers: RefCell<HashMap<i32, Vec<i32>>>,
}

impl Waits<'_> {
    /// `pg_blocking_pids(pid)`, asked once per look.
    fn blockers_of(&self, pid: i32) -> Vec<i32> {
        if let Some(known) = self.blockers.borrow().get(&pid) {
            return known.clone();
        }
        let found = pg::blocking_pids(pid);
        self.blockers.borrow_mut().insert(pid, found.clone());
        found
    }

    /// The queued backends (of `queued`: pid, process number) among the blockers of
    /// backend `pid`, and among those of each blocker that itself waits on a lock, within
    /// `depth` steps, added to `found`.
    fn queued_on_chain(
        &self,
        pid: i32,
        depth: u32,
        queued: &[(i32, usize)],
        found: &mut Vec<(i32, usize)>,
    ) {
        for blocker in self.blockers_of(pid) {
            if blocker == pid || found.iter().any(|&(p, _)| p == blocker) {
                continue;
            }
            if let Some(&q) = queued.iter().find(|&&(p, _)| p == blocker) {
                found.push(q);
                continue;
            }
            let waits_on_lock = self
                .pids
                .get(&blocker)
                .is_some_and(|&procno| self.on_lock.get(procno) == Some(&true));
            if depth > 0 && waits_on_lock {
                self.queued_on_chain(blocker, depth - 1, queued, found);
            }
        }
    }

    /// Whether backend `pid` waits for its client, or on a lock (itself or through its
    /// parallel workers) whose chain of blockers reaches one within `depth` steps.
    fn for_a_client(&self, pid: i32, depth: u32) -> bool {
        let Some(&procno) = self.pids.get(&pid) else {
            return false;
        };
        if matches!(pg::proc_waiting(procno), pg::Waiting::Client { .. }) {
            return true;
        }
        // For a leader, pg_blocking_pids counts its workers' waits too.
        depth > 0
            && self.on_lock.get(procno) == Some(&true)
            && self
                .blockers_of(pid)
                .into_iter()
                .any(|b| b != pid && self.for_a_client(b, depth - 1))
    }
}
