//! One statement's life in this backend, from its arrival at ExecutorStart to its end:
//! the executor hooks (`executor.rs`) come here, and this module drives admission, the
//! parallel workers' grant and CPU scheduling, in that order.
//!
//! A top-level read or write too small to admit runs at once, unregistered, only its
//! ExecutorRuns timed ([`runs_unadmitted`]). Any other top-level statement arrives
//! ([`arrive`]): it waits in the admission queue until it
//! is admitted (or skips the queue: exempt, or its backend already holds an admission),
//! and is registered as a [`Statement`] in stage [`Stage::Admitted`], its parallel
//! workers reserved. Once ExecutorStart built its plan state, a statement that may be
//! paused, unless its plan is too small to schedule (`cpu::is_tiny`; its ExecutorRuns
//! are then only timed, to learn a misestimate), joins CPU scheduling
//! ([`executor_started`], [`Stage::Joined`]): its scans
//! become yield points, and from its first check-in it holds a CPU slot or waits for
//! one (`cpu`). One whose fingerprint's history says its executions end within half a
//! slice (`cpu::tiny_by_history`) joins too, but takes a slot only once it has used a
//! slice of CPU: until then its yield points only count. Each ExecutorRun takes the
//! slot and gives it back ([`run_begins`], [`run_ends`]), taking back first an
//! admission lent while the client was away ([`resume`]). The statement ends at
//! ExecutorEnd ([`end`]), giving back, in reverse order, its CPU scheduling, its
//! workers, its memory and its admission.
//!
//! A statement is registered when the executor starts it (a cursor that a function
//! opened, nested, when a cursor's portal first runs it at depth 0: [`cursor_arrives`])
//! and unregistered when the executor ends it. When a statement fails, is cancelled or
//! times out, ExecutorEnd never runs; its portal's resource owner is released instead,
//! and the release callback (`ending`) unregisters every statement started under that
//! owner (docs/design.md §2, §4 rule 8).
//! When the process exits, its shared entry is cleared by a `before_shmem_exit` callback
//! (the one exit callback of pg_stride); a process that dies without running it
//! (SIGKILL) makes the postmaster reinitialise shared memory, and the scheduler worker
//! clears entries of processes that are gone.
//!
//! Parallel workers are here too: their part of a statement joins the leader's CPU
//! scheduling, and they clear their entry the same way when they exit.

mod client_utility;
mod ending;
#[cfg(not(any(test, feature = "pg_test")))]
mod plan_shapes;
#[cfg(any(test, feature = "pg_test"))]
pub mod plan_shapes;
mod registry;
mod unadmitted;
mod write_targets;

pub use client_utility::{client_utility_ended, client_utility_started, subtransaction_aborted};
pub use ending::{end, end_at_once, let_waiters_in, Ending};
pub use unadmitted::{
    learn_long_run, runs_unadmitted, unadmitted_aborted, unadmitted_ended, unadmitted_run_begins,
    unadmitted_run_ended,
};

use ending::claim;
use registry::{
    ByHistory, Stage, Statement, BY_HISTORY_REGISTERED, LAST_OF_COMMAND, REGISTERED,
    TINY_REGISTERED,
};

use crate::backend_local::BackendLocal;
use crate::gucs::Setting;
use crate::os;
use crate::parallel::{self, Grant};
use crate::shmem;
use crate::{admission, cpu, groups, pg, plan_costs, plan_tree};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::atomic::{fence, Ordering};

/// Whether the shared entry may hold what a statement writes there only once it joined
/// CPU scheduling or planned workers (rows, prediction, workers, pauses and the workers'
/// CPU): the next registered statement clears them then, and only then, since most
/// statements (writes, reads too small to schedule) leave them zero.
static ENTRY_WRITTEN: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(true));
/// Whether a statement of this backend ever planned workers: pool workers report their
/// CPU to the leader's entry when their part ends, which can be after the leader's
/// statement failed and another began, so such a backend clears the entry at every
/// statement.
static PLANNED_WORKERS: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Asks for query identifiers where they are used. Called once from `_PG_init`.
///
/// Query identifiers key the prediction of a statement's CPU, the trace and the tuner's
/// replay. A backend asks for them once it runs a statement that joins CPU scheduling
/// ([`executor_started`]): PostgreSQL's walk of a parse tree costs a short statement
/// sent as text more than everything else pg_stride adds to it, so a backend that only
/// runs statements too small to schedule, and writes, never pays it. Its first
/// scheduled statement has no identifier, and is predicted from its plan's cost, as a
/// statement never seen is. With the trace or the tuner on at server start, every
/// backend computes them (`compute_query_id = auto` then means on; `off` at start makes
/// the request a no-op), as pg_stat_statements asks for them: the trace records every
/// scheduled statement, the first of each backend too. Also registers the
/// relation-cache callback that keeps the answers about tables written unadmitted fresh
/// (`write_targets`).
pub fn install() {
    if cpu::tuner_on() || cpu::traces() {
        pg::enable_query_id();
    }
    write_targets::install();
}

/// Whether this backend's cached plans were analysed again for their query identifiers:
/// a statement that joined CPU scheduling found an identifier's user on while
/// identifiers were computed ([`executor_started`]).
static PLANS_IDENTIFIED: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// `desc`, a top-level statement of this backend, arrives in the session's resource
/// group: admits it (waiting for its turn if the limits are reached), registers it,
/// and grants its Gathers their parallel workers. Superusers skip admission when
/// `pg_stride.exempt_superuser` is on, and so does a statement of a backend that holds
/// an admission for another of its statements. Call before ExecutorStart: it may
/// replace the statement's plan by a copy with fewer workers (a cursor's serial plan,
/// which no such copy replaces, also arrives after it: [`cursor_arrives`]). Returns whether the
/// statement joins CPU scheduling once the executor started it ([`executor_started`]):
/// one that may be paused (docs/design.md §4 rule 2: writes are never paused) and whose
/// plan is not too small to schedule (one tiny by its history joins, and takes a slot
/// only past a slice of CPU: `cpu::tiny_by_history`).
pub fn arrive(desc: *mut pg_sys::QueryDesc) -> bool {
    // Computed once, if at all (only for a statement whose relation key a statement
    // that ran long may have).
    let computed = std::cell::OnceCell::new();
    // SAFETY: `desc` is the statement the executor is about to start.
    let fingerprint = || *computed.get_or_init(|| unsafe { pg::statement_fingerprint(desc) });
    // SAFETY: as above.
    let relation = unsafe { pg::statement_relation((*desc).plannedstmt) };
    // Too small to admit, once its fingerprint is known not to have run long, or once
    // the table it writes was looked up (`runs_unadmitted` could not tell).
    if (cpu::may_have_run_long(|| relation) || write_targets::missed())
        // SAFETY: as above.
        && unsafe {
            unadmitted::too_small_to_admit(
                desc,
                |cost| cpu::is_tiny(cost, relation, fingerprint),
                write_targets::allowed,
            )
        }
    {
        unadmitted::runs_after_all(desc);
        return false;
    }
    let Some(shared) = shmem::shared() else {
        return false;
    };
    let Some(entry) = shared.my_entry() else {
        return false;
    };
    claim(shared, entry);
    let sender = client_utility::sender();
    let group =
        groups::resolve_statement_group(&shared.groups, client_utility::group_tag(), sender);
    admission::switch_group(shared, entry, group);
    // A backend that holds an admission already (an open cursor, the query of a FOR
    // loop in a DO block) runs its further statements under it: it runs one at a
    // time, and waiting for another admission could mean waiting for itself. If that
    // admission was lent while the backend waited for its client, it takes it back
    // first, through the queue if need be.
    let holds_one = REGISTERED.with_borrow(|list| list.iter().any(|r| r.admitted));
    if holds_one && pg::interrupts_can_be_processed() {
        admission::take_back(shared);
    }
    // SAFETY: `desc` is the statement the executor is about to start.
    let ((query_id, plan_cost), parallel) = unsafe {
        let stmt = (*desc).plannedstmt;
        (pg::query_id_and_cost(stmt), (*stmt).parallelModeNeeded)
    };
    let pausable = cpu::is_pausable(desc);
    let serial_read = pausable && !parallel;
    let tiny_plan = serial_read && cpu::is_tiny(plan_cost, relation, fingerprint);
    // A plan above the bound may still be tiny by its fingerprint's history: one lookup
    // of the histories, for statements that would otherwise be scheduled only.
    let by_history = (serial_read && !tiny_plan)
        .then(|| cpu::tiny_by_history(shared, group, query_id, relation, fingerprint))
        .flatten()
        .map(|predicted_us| ByHistory {
            query_id,
            plan_cost: plan_costs::at_defaults(plan_cost),
            predicted_us,
            cpu_ns: 0,
        });
    let tiny = tiny_plan;
    let joins = pausable && !tiny;
    // The clocks are read for the trace of a statement that joins CPU scheduling only.
    let mut arrival = if joins {
        cpu::Arrival::now()
    } else {
        cpu::Arrival::default()
    };
    let exempt = || EXEMPT_SUPERUSER.get() && pg::is_superuser_role(sender);
    let mut need_kb = 0;
    let admitted = !holds_one && !exempt() && {
        need_kb = memory_need(shared, desc);
        admission::admit(shared, entry, group, need_kb)
    };
    if joins {
        arrival.admit_ns = os::monotonic_ns();
    }
    if !admitted {
        // Runaway-query rules time a statement from its admission: one that skipped
        // admission counts from here (as `admission::admitted_at_once` reads the clock).
        entry
            .admitted_at
            .store(pg::now_timestamp(), Ordering::Relaxed);
    }
    entry.query_id.store(query_id, Ordering::Relaxed);
    // SAFETY: CurrentResourceOwner is a plain process-local global.
    let owner = unsafe { pg_sys::CurrentResourceOwner };
    let command = client_utility::command();
    // The process's query entry, if it has one already, is that of a statement still
    // registered: an open cursor, a protocol portal between its fetches, the query of a
    // DO block's loop. A statement of another client command than that one's shares the
    // entry but is judged by the runaway-query rules on the CPU used from its start (its
    // base); the statements of one command (a loop and its body) are judged together, as
    // one, from the base their command had (a DO block's loop beside a cursor declared
    // before it).
    let base = if entry.cpu_query.load(Ordering::Relaxed) == 0 {
        0
    } else if command.is_some()
        && REGISTERED.with_borrow(|list| list.iter().any(|r| r.command == command))
    {
        entry.cpu_base_ns.load(Ordering::Relaxed)
    } else {
        shared.query_cpu_ns(entry)
    };
    // The owner alone writes the count (docs/design.md §3): a store, not a locked add.
    let key = entry.registered.load(Ordering::Relaxed).wrapping_add(1);
    REGISTERED.with_borrow_mut(|list| {
        list.push(Statement {
            desc,
            owner,
            stage: Stage::Admitted,
            group,
            admitted,
            reserved_memory: admitted && need_kb > 0,
            workers: Grant::default(),
            arrival,
            tiny,
            by_history,
            ran_ns: 0,
            command,
            key,
        })
    });
    if tiny {
        TINY_REGISTERED.set(TINY_REGISTERED.get() + 1);
    }
    if by_history.is_some() {
        BY_HISTORY_REGISTERED.set(BY_HISTORY_REGISTERED.get() + 1);
    }
    // Cleared before the count that names the statement is published, so that a reader
    // who sees the new count sees none of the last statement's figures under it (the
    // runaway-query rules would judge this statement by the last one's rows).
    if ENTRY_WRITTEN.replace(PLANNED_WORKERS.get()) {
        entry.clear_statement();
    }
    // Before the count too: a reader who saw the count with a zero base would judge the
    // statement by the cursor's CPU.
    if base != 0 {
        ENTRY_WRITTEN.set(true);
        entry.cpu_base_ns.store(base, Ordering::Relaxed);
    }
    // Neither this count nor the one before it, for a statement that joins: a reader of
    // the old count must not take it for the old statement's.
    let unscheduled = if joins { key.wrapping_add(1) } else { key };
    entry.unscheduled.store(unscheduled, Ordering::Relaxed);
    if let Some(command) = command {
        LAST_OF_COMMAND.set((command, key));
    }
    entry.registered.store(key, Ordering::Release);
    // The statement's figures are written after its count: a reader who sees one of
    // them and then reads the count again (behind an acquire fence, `worker::rules`)
    // sees this count.
    fence(Ordering::Release);
    // Counted as running before its workers are reserved, so that statements reserving
    // at the same moment see each other (`shmem::Shared::statements_elsewhere`).
    entry.running.fetch_add(1, Ordering::AcqRel);
    // A plan with a Gather needs parallel mode; most plans have none, and
    // `reserve_workers` is called for the others only.
    if !parallel {
        return joins;
    }
    ENTRY_WRITTEN.set(true);
    PLANNED_WORKERS.set(true);
    let Some(reservation) = parallel::reserve_workers(shared, desc, group, cpu::predicts()) else {
        return joins;
    };
    // Recorded before the plan copy may raise an error: from here on the statement's
    // end, or its resource owner's release, gives the workers back.
    let grant = reservation.grant;
    REGISTERED.with_borrow_mut(|list| {
        if let Some(r) = list.iter_mut().find(|r| r.desc == desc.cast_const()) {
            r.workers = grant;
        }
    });
    entry
        .workers_planned
        .store(grant.planned, Ordering::Relaxed);
    entry
        .workers_granted
        .store(grant.granted, Ordering::Relaxed);
    parallel::apply(desc, reservation);
    joins
}

/// The working memory `desc`'s plan reserves when it is admitted, kB: 0 unless a memory
/// budget is set (`pg_stride_sched::memory`).
fn memory_need(shared: &shmem::Shared, desc: *const pg_sys::QueryDesc) -> u64 {
    if !shared.admission.memory_accounting() {
        return 0;
    }
    // SAFETY: `desc` is the statement the executor is about to start; its plan is
    // complete.
    unsafe { plan_tree::memory_need_kb((*desc).plannedstmt, pg::memory_settings()) }
}

/// The executor has started `desc`, a registered statement that may be paused and is
/// not tiny ([`arrive`] said so): it joins CPU scheduling, its scans becoming yield
/// points.
pub fn executor_started(desc: *const pg_sys::QueryDesc) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let registered = REGISTERED.with_borrow_mut(|list| {
        let r = list.iter_mut().find(|r| r.desc == desc)?;
        r.stage = Stage::Joined;
        Some((r.group, r.arrival, r.workers, r.by_history.is_some()))
    });
    if let Some((group, arrival, workers, by_history)) = registered {
        ENTRY_WRITTEN.set(true);
        // SAFETY: ExecutorStart's QueryDesc holds its PlannedStmt.
        let parallel = unsafe { (*(*desc).plannedstmt).parallelModeNeeded };
        let with_workers = parallel && parallel::may_launch_workers(workers);
        cpu::start_statement(shared, desc, group, arrival, with_workers, by_history);
        // This backend runs statements worth scheduling: from its next one on, they
        // carry query identifiers for their prediction and the trace (see `install`).
        // Asked at every such statement, since a `compute_query_id = off` in force the
        // first time makes the request a no-op. Once the trace, prediction or the tuner
        // needs them, the backend's cached plans (prepared statements, PL/pgSQL's) are
        // marked for re-analysis, once, which computes their identifiers: without it a
        // statement prepared before would keep identifier 0 for the rest of the
        // session. Not otherwise: re-planning every cached plan is a change a session
        // would not expect for identifiers nothing reads; nor while they are not
        // computed (`compute_query_id = off`). Where they were computed all along
        // (`compute_query_id = on`, pg_stat_statements) this re-plans for nothing, once:
        // telling that apart would take a look at every statement, and would still miss
        // a PREPARE (a utility, which the executor hooks never see) made while they were
        // off. A `compute_query_id` turned off and on again after the reset is not
        // followed.
        pg::enable_query_id();
        if !PLANS_IDENTIFIED.get()
            && (cpu::traces() || cpu::predicts() || cpu::tuner_on())
            && pg::query_ids_computed()
        {
            PLANS_IDENTIFIED.set(true);
            pg::reset_plan_cache();
        }
    }
}

/// Whether `desc`, which a cursor's portal is about to run at depth 0 for the client's
/// command (its FETCH or MOVE, PL/pgSQL's FETCH in its DO block or procedure) or for a
/// COMMIT storing a holdable cursor, is a query no statement of this backend
/// registered: one that a function opened (PL/pgSQL's OPEN, a DECLARE it ran) started
/// nested, inside the function's statement, and arrives only now ([`arrive`];
/// docs/design.md §4 rule 4). A monitoring query's cursor is let go ([`LET_GO`]). Not
/// the extended protocol's portals, also listed in pg_cursors but run by the client's
/// Execute, not a command: their statements were judged when they started. A plan that
/// is parallel (not a DECLARE's or PL/pgSQL's) does not arrive: its workers could not
/// be granted fewer once it started. Cannot panic: the ExecutorRun hook asks it outside
/// pgrx's error boundary.
pub fn cursor_arrives(desc: *const pg_sys::QueryDesc) -> bool {
    pg::cursor_portal_runs(desc)
        && (client_utility::running() || pg::portal_stores_held_rows())
        && LET_GO.get() != desc as usize
        // SAFETY: the QueryDesc ExecutorRun is given, started, with its PlannedStmt.
        && !unsafe { (*(*desc).plannedstmt).parallelModeNeeded }
        && registered(desc) == Some(false)
}

/// Whether `desc` is one of this backend's registered statements; `None` while the list
/// is borrowed. Cannot panic.
fn registered(desc: *const pg_sys::QueryDesc) -> Option<bool> {
    REGISTERED.try_with_borrow(|list| list.iter().any(|r| r.desc == desc))
}

/// The cursor's query that [`arrive`] last let go unregistered when its portal ran it
/// ([`cursor_arrives`]): a monitoring query's, which is then not looked at again at
/// each of its FETCHes (a PL/pgSQL loop fetches every ten rows). An address, compared,
/// never followed: forgotten at that statement's ExecutorEnd, and when a transaction or
/// subtransaction aborts, which can free its portal without one.
static LET_GO: BackendLocal<Cell<usize>> = BackendLocal::new(Cell::new(0));

/// [`arrive`] has judged `desc`, a cursor's query: if it left it unregistered, it is not
/// asked again ([`LET_GO`]).
pub fn cursor_judged(desc: *const pg_sys::QueryDesc) {
    if registered(desc) == Some(false) {
        LET_GO.set(desc as usize);
    }
}

/// `desc` ends (`None`: a transaction or subtransaction aborted): a cursor's query let go
/// at that address is no longer there. Cannot panic: called from hooks and callbacks
/// outside pgrx's error boundary.
pub fn cursor_ended(desc: Option<*const pg_sys::QueryDesc>) {
    if desc.is_none_or(|d| LET_GO.get() == d as usize) {
        LET_GO.set(0);
    }
}

/// Whether ExecutorRun of `desc` runs on a CPU slot: a statement of this backend that
/// joined CPU scheduling, or the part of one that this parallel worker runs. Cannot
/// panic: the executor hooks ask it outside pgrx's error boundary.
pub fn runs_on_cpu_slots(desc: *const pg_sys::QueryDesc) -> bool {
    cpu::is_member()
        && (pg::is_parallel_worker()
            || REGISTERED.try_with_borrow(|list| {
                list.iter()
                    .any(|r| r.desc == desc && r.stage == Stage::Joined)
            }) == Some(true))
}

/// A top-level ExecutorRun begins: returns when, if a tiny statement is registered and
/// this run is on no CPU slot (`on_cpu`), and the thread's CPU clock then if a
/// statement tiny by its history is registered (the runs of such statements are timed,
/// [`timed_run_ended`]). Cannot panic: the executor hooks call it outside pgrx's error
/// boundary.
pub fn timed_run_begins(on_cpu: bool) -> Option<RunStart> {
    let by_history = BY_HISTORY_REGISTERED.get() > 0;
    ((!on_cpu && TINY_REGISTERED.get() > 0) || by_history).then(|| RunStart {
        wall_ns: os::monotonic_ns(),
        cpu_ns: by_history.then(os::thread_cpu_ns),
    })
}

/// When a timed ExecutorRun began ([`timed_run_begins`]).
pub struct RunStart {
    wall_ns: u64,
    cpu_ns: Option<u64>,
}

/// The ExecutorRun of `desc` that began at `started` ended: a tiny statement adds its
/// time, and one tiny by its history its CPU. Cannot panic, as above. A run that ends
/// with an ERROR is not counted.
pub fn timed_run_ended(desc: *const pg_sys::QueryDesc, started: RunStart) {
    let took = os::monotonic_ns().saturating_sub(started.wall_ns);
    let used = started
        .cpu_ns
        .map(|at| os::thread_cpu_ns().saturating_sub(at));
    REGISTERED.try_with_borrow_mut(|list| {
        if let Some(r) = list
            .iter_mut()
            .find(|r| r.desc == desc && (r.tiny || r.by_history.is_some()))
        {
            r.ran_ns = r.ran_ns.saturating_add(took);
            if let (Some(h), Some(used)) = (r.by_history.as_mut(), used) {
                h.cpu_ns = h.cpu_ns.saturating_add(used);
            }
        }
    });
}

/// Whether this backend's admission is lent out and `desc` is one of its registered
/// statements (a cursor's FETCH): its ExecutorRun then calls [`resume`] first. A query
/// that is not registered — a monitoring query, one PostgreSQL runs at COMMIT — runs
/// without taking the admission back, as it would run without one. Cannot panic: the
/// executor hooks ask it outside pgrx's error boundary, so that a statement whose
/// admission is its own enters no guarded function.
pub fn runs_on_lent_admission(desc: *const pg_sys::QueryDesc) -> bool {
    // The list first: a statement that is not registered, one that ran unadmitted among
    // them, learns it without reading shared memory.
    registered(desc) == Some(true) && shmem::shared().is_some_and(admission::is_lent)
}

/// A top-level ExecutorRun begins: a statement whose admission was lent while its
/// client was away (a cursor between fetches) takes it back before it runs again
/// (docs/design.md §4 rule 12).
pub fn resume() {
    if let Some(shared) = shmem::shared() {
        if admission::is_lent(shared) && pg::interrupts_can_be_processed() {
            admission::take_back(shared);
        }
    }
}

/// ExecutorRun of a statement on CPU slots begins: its process takes a slot, waiting
/// for one if none is free.
pub fn run_begins(desc: *const pg_sys::QueryDesc) {
    ENTRY_WRITTEN.set(true);
    if let Some(shared) = shmem::shared() {
        cpu::begin_run(shared, desc);
    }
}

/// ExecutorRun of `desc`, a statement on CPU slots, ended: its process gives its slot
/// back, and the rows of the run count for the statement's next ones.
pub fn run_ends(desc: *const pg_sys::QueryDesc) {
    // SAFETY: the QueryDesc whose ExecutorRun just returned.
    unsafe { cpu::run_ended(desc) };
    if let Some(shared) = shmem::shared() {
        cpu::end_run(shared);
    }
}

/// A parallel worker starts its part of a statement: it joins its leader's CPU
/// scheduling, if the leader's statement takes part. Call after ExecutorStart.
pub fn worker_started(desc: *const pg_sys::QueryDesc) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    if cpu::start_worker(shared, desc) {
        if let Some(entry) = shared.my_entry() {
            claim(shared, entry);
        }
    }
}

static EXEMPT_SUPERUSER: Setting<bool> = Setting::new(GucSetting::<bool>::new(true));

/// Registers `pg_stride.exempt_superuser`. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_bool_guc(
        c"pg_stride.exempt_superuser",
        c"Superusers' statements are admitted at once, without counting against the limits.",
        c"",
        EXEMPT_SUPERUSER.inner(),
        GucContext::Sighup,
        GucFlags::default(),
    );
}
