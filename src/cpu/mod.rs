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
//!   read). One whose plan is estimated tiny does not even get yield points
//!   (`tiny.rs`); one whose history says it ends within half a slice joins only at its
//!   first check-in past a slice of CPU (`tiny::tiny_by_history`). A plan that may
//!   launch workers joins at once, so that they find the entry;
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
//!
//! Files: `slots.rs` the slot protocol (run, check-in, pause); `yield_points.rs` the
//! wrapped scans; `member.rs` the process-local state; `placement.rs` where the kernel
//! runs a process that gets or gives up a slot, the slot protocol's one way there (its
//! own submodules `pinning.rs`: slots pinned to CPUs, and `slice_share.rs`:
//! how much of its slice a pinned holder ran); `trace.rs` the trace;
//! `watchdog.rs` the scheduler worker's round over slot holders; `priority.rs` a
//! group's priority range; `prediction.rs` the CPU a statement is predicted to use when
//! it joins, which sets where its priority starts, and what it used, recorded when it
//! ends; `tiny.rs` the statements too small to schedule at all. This file registers
//! statements and workers and ends them.

mod member;
mod placement;
mod prediction;
mod priority;
mod runaway;
mod settings;
mod slots;
mod tiny;
mod trace;
mod watchdog;
mod yield_points;

use member::{Member, MEMBER, WORKER_CPU_BASE};
use priority::priority_range;
use slots::{join_query, transaction_wrote};
use yield_points::wrap_scans;

pub use prediction::record_unscheduled;
pub use runaway::run_ended;
pub use settings::{
    decay_params, effective_cpu_slots, predicts, register_settings, slice_ms, slice_ns, traces,
    tuner_on,
};
pub use slots::{begin_run, end_run};
pub use tiny::{
    below_bound, counts_as_far_too_long, counts_as_long, history_runs_unscheduled, is_tiny,
    may_have_run_long, ran_long, sweep_long_runs, tiny_by_history,
};
pub use trace::{read_window, Arrival};
pub use watchdog::watchdog;

use crate::os::thread_cpu_ns;
use crate::pg;
use crate::{numa, plan_costs, plan_tree, shmem};
use pg_stride_sched::tuner::Accounting;
use pg_stride_sched::{GroupConfig, GroupId, GroupSettings, ProcId, QueryId, SchedShared};
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// Whether a statement may be paused (docs/design.md §4 rule 2): it only reads, and its
/// transaction has not written or locked rows (see [`transaction_wrote`]).
pub fn is_pausable(desc: *const pg_sys::QueryDesc) -> bool {
    // SAFETY: a QueryDesc for ExecutorStart, with its PlannedStmt.
    let reads_only = unsafe {
        let stmt = (*desc).plannedstmt;
        !stmt.is_null() && plan_tree::reads_only(stmt)
    };
    reads_only && !transaction_wrote()
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
/// first check-in, or now for a plan whose Gathers may launch workers (`with_workers`),
/// so that they find it; for a statement tiny by its history (`by_history`,
/// [`tiny_by_history`]), at the first check-in after it has used a slice of CPU
/// (`Member::join_after_ns`). Call after ExecutorStart.
pub fn start_statement(
    shared: &shmem::Shared,
    desc: *const pg_sys::QueryDesc,
    group: usize,
    arrival: Arrival,
    with_workers: bool,
    by_history: bool,
) {
    let Some(sched) = shared.sched() else { return };
    let Some(procno) = pg::my_procno() else {
        return;
    };
    // SAFETY: ExecutorStart gives a valid QueryDesc with its PlannedStmt.
    let (query_id, plan_cost) = unsafe { pg::query_id_and_cost((*desc).plannedstmt) };
    let procs = 1 + shared
        .my_entry()
        .map_or(0, |e| e.workers_granted.load(Ordering::Relaxed));
    MEMBER.with_borrow_mut(|member| match member.as_mut() {
        Some(m) => {
            m.statements += 1;
            m.shared = true;
            m.procs = m.procs.max(procs);
            // A statement that is not tiny by its history schedules the query from its
            // first check-in; if the query has not been joined yet, it is this one's (a
            // loop's body beside the loop's query): predicted and traced as itself.
            if !by_history && m.join_after_ns.take().is_some() && m.query.is_none() {
                (m.arrival, m.query_id) = (arrival, query_id);
                m.plan_cost = plan_costs::at_defaults(plan_cost);
            }
        }
        None => {
            let mut m = Member::new(ProcId(procno as u32), group, None, true);
            (m.arrival, m.query_id, m.procs) = (arrival, query_id, procs);
            m.plan_cost = plan_costs::at_defaults(plan_cost);
            if by_history {
                m.defer_join();
            }
            // The leader's run delay counts from the arrival: ExecutorStart included.
            m.start_run_delay_ns = arrival.run_delay_ns.or(m.start_run_delay_ns);
            *member = Some(m);
        }
    });
    if with_workers && !join_query(shared, sched) {
        return;
    }
    wrap_scans(desc);
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

/// A scheduled statement ends (or fails, or its process exits): forgets its wrapped
/// scans and, with the last statement of the process, leaves the query, passing on any
/// slot, and frees the entry when this process registered it, tracing it for the tuner.
pub fn end_statement(shared: &shmem::Shared, desc: Option<*const pg_sys::QueryDesc>, failed: bool) {
    yield_points::forget(desc);
    runaway::statement_ended(desc);
    // A pause that an error ended (cancel, statement_timeout) is over too.
    if let Some(entry) = shared.my_entry() {
        entry.paused.store(0, Ordering::Release);
    }
    let Some(sched) = shared.sched() else { return };
    let mut stays = false;
    let last = MEMBER.with_borrow_mut(|member| {
        let m = member.as_mut()?;
        m.statements = m.statements.saturating_sub(1);
        if desc.is_some() && m.statements > 0 {
            stays = true;
            return None;
        }
        member.take()
    });
    let Some(mut m) = last else {
        if let (true, true, Some(desc)) = (stays, failed, desc) {
            slots::abandon_run(shared, sched, desc);
        }
        return;
    };
    member::disarm_countdown();
    numa::unbind();
    let Some(query) = m.query else { return };
    // A run that an error (or the process's exit) cut short gave its slot back at no
    // ExecutorRun end: its last slice is charged here, as that end would have.
    let (handed, used) = if sched.is_running(m.proc) {
        let used = thread_cpu_ns().saturating_sub(m.slice_start_ns);
        m.slice_used(used);
        (slots::stop_run(shared, sched, m.proc, used), used)
    } else {
        (None, 0)
    };
    let snapshot = sched.query_snapshot(query);
    m.left_slot();
    m.count_runqueue();
    let left = sched.leave(m.proc);
    placement::statement_left(shared, m.proc, handed.or(left), used);
    if let Some(leader) = m.leader {
        // A worker's CPU since its previous statement for a leader is this one's: for a
        // parallel worker of PostgreSQL's the whole process (the fork, attaching and
        // restoring the leader's state count), for a pool worker what it spent since its
        // last fragment (waiting for the ticket, restoring this leader's state).
        let now = thread_cpu_ns();
        m.acct.cpu_total_ns = now.saturating_sub(WORKER_CPU_BASE.replace(now));
        if let Some(entry) = shared.procs().get(leader) {
            entry.inbox.workers_acct.add(&m.acct);
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
                e.inbox.workers_acct.add(&m.acct);
                Accounting {
                    first_slot_ns: m.acct.first_slot_ns,
                    workers_planned: e.workers_planned.load(Ordering::Relaxed),
                    ..e.inbox.workers_acct.take()
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
            // One tiny by its history is recorded by `record_unscheduled`, with the CPU
            // of its own runs, before and after it joined.
            if !m.shared && !failed && !m.by_history {
                prediction::record(
                    shared,
                    sched,
                    (m.query_id, m.plan_cost),
                    m.prediction,
                    s.group.0 as usize,
                    s.cpu_ns,
                );
            }
        }
        // Parallel workers leave before the leader's ExecutorEnd; after an error they
        // may not have yet, and the scheduler worker frees the entry once they have.
        let freed = {
            let _lock = shared.registration_lock();
            sched.unregister_query(query)
        };
        if freed.is_err() {
            shared.orphan_query(query);
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
        let _lock = shared.registration_lock();
        sched.unregister_query(query).is_ok()
    });
}

/// Applies the decay settings after a reload, unless the tuner's are in force and the
/// configured ones did not change (`shmem::TunerState::apply_configured`); the slot
/// count follows at the watchdog's next round.
pub fn apply_settings(shared: &shmem::Shared, sched: &SchedShared) {
    shared
        .tuner
        .apply_configured(sched, settings::decay_params(), settings::tuner_on());
}
