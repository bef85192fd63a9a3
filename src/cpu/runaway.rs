//! The backend's side of runaway-query rules (the scheduler worker checks them,
//! `worker::rules`): a leader publishes the rows its statement produced at each check-in,
//! raises the error of a rule that cancels its statement at the first check-in where an
//! error is allowed, and moves its query to the group of a rule that moves it.

use super::member::MEMBER;
use super::priority::priority_range;
#[cfg(not(any(feature = "pg17", feature = "pg18")))]
use crate::backend_local::BackendLocal;
use crate::pg::{self, interrupts_can_be_processed};
use crate::shmem;
use pg_stride_sched::{GroupId, SchedShared};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
#[cfg(not(any(feature = "pg17", feature = "pg18")))]
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// The rows the ended ExecutorRuns of a statement produced, and the address of its
/// EState: each run counts `es_processed` from 0 again, so a cursor's FETCHes (a driver's
/// fetch size, psql's FETCH_COUNT) would each count from 0 and a `rows` rule never reach
/// its threshold. PostgreSQL 17 keeps that sum itself (`es_total_processed`). One
/// statement's: with two cursors fetched in turn, each counts from its latest turn.
#[cfg(not(any(feature = "pg17", feature = "pg18")))]
static ROWS_BEFORE: BackendLocal<Cell<(usize, u64)>> = BackendLocal::new(Cell::new((0, 0)));

/// The rows `estate`'s statement produced so far, over all its ExecutorRuns.
///
/// # Safety
/// `estate` is the EState of a statement that has started.
unsafe fn rows_so_far(estate: *const pg_sys::EState) -> u64 {
    // SAFETY: the caller's promise.
    let (now, before) = unsafe {
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        let before = (*estate).es_total_processed;
        #[cfg(not(any(feature = "pg17", feature = "pg18")))]
        let before = match ROWS_BEFORE.get() {
            (at, rows) if at == estate as usize => rows,
            _ => 0,
        };
        ((*estate).es_processed, before)
    };
    before.saturating_add(now)
}

/// An ExecutorRun of `desc`'s statement, which runs on CPU slots, ended: its rows count
/// for the statement's next runs (before PostgreSQL 17, which counts them itself).
/// Cannot panic.
///
/// # Safety
/// `desc` is a started statement's QueryDesc.
pub unsafe fn run_ended(desc: *const pg_sys::QueryDesc) {
    #[cfg(not(any(feature = "pg17", feature = "pg18")))]
    // SAFETY: the caller's promise.
    unsafe {
        let estate = (*desc).estate;
        if !estate.is_null() {
            ROWS_BEFORE.set((estate as usize, rows_so_far(estate)));
        }
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let _ = desc;
}

/// `desc`'s statement ended: its rows no longer count for a statement whose EState is
/// allocated at the same address later.
pub(super) fn statement_ended(desc: Option<*const pg_sys::QueryDesc>) {
    #[cfg(not(any(feature = "pg17", feature = "pg18")))]
    {
        // SAFETY: a QueryDesc that ExecutorEnd or the cleanup of a failed statement
        // passes is still valid; its estate may be null.
        let ends = desc.is_none_or(|d| unsafe { (*d).estate } as usize == ROWS_BEFORE.get().0);
        if ends {
            ROWS_BEFORE.set((0, 0));
        }
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    let _ = desc;
}

/// Publishes the rows the statement of `node`'s executor produced so far, from a
/// leader (a parallel worker's count is of the rows it passed to its leader). Called
/// outside pgrx's error boundary: cannot panic.
///
/// # Safety
/// `node` is a valid PlanState of a running executor.
// Out of line, so that bench/instructions.py can count its instructions.
#[inline(never)]
pub(super) unsafe fn publish_rows(node: *const pgrx::pg_sys::PlanState) {
    if pg::is_parallel_worker() {
        return;
    }
    let Some(entry) = shmem::shared().and_then(|s| s.my_entry()) else {
        return;
    };
    // SAFETY: the caller's promise; a running node's EState is valid.
    let rows = unsafe { rows_so_far((*node).state) };
    entry.rows.store(rows, Ordering::Relaxed);
}

/// Raises the error of a runaway-query rule that cancels this process's statement, if
/// the scheduler worker asked and an error may be raised here (docs/design.md §4 rule 1).
// Out of line, as publish_rows.
#[inline(never)]
pub(super) fn cancel_if_a_rule_says_so(shared: &shmem::Shared) {
    let Some(entry) = shared.my_entry() else {
        return;
    };
    let asked = entry.inbox.rule_cancel.load(Ordering::Acquire);
    if asked == 0 || !interrupts_can_be_processed() {
        return;
    }
    entry.inbox.rule_cancel.store(0, Ordering::Relaxed);
    // Asked for a statement that has ended since.
    if entry.inbox.rule_cancel_key.load(Ordering::Relaxed)
        != entry.registered.load(Ordering::Relaxed)
    {
        return;
    }
    let slot = entry.group.load(Ordering::Relaxed) as usize;
    let group = shared.groups.name_of(slot);
    let rule = shared
        .groups
        .settings_of(slot)
        .and_then(|s| s.rules.get(asked as usize - 1).map(ToString::to_string))
        .unwrap_or_default();
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
        format!("canceling statement due to rule \"{rule}\" of resource group \"{group}\""),
        "pg_stride runaway-query rules",
    )
    .set_hint(
        "pg_stride.rule_hits lists the rules statements met; pg_stride.alter_group() changes them.",
    )
    .report(PgLogLevel::ERROR);
}

/// Moves this leader's query to the group a runaway-query rule names, if the scheduler
/// worker asked: from now on the query has that group's weight and priorities
/// (`SchedShared::move_query`). Done at a check-in while the leader runs its query alone;
/// a query with parallel workers moves at a check-in after they have left it. Its
/// admission stays counted in the group it was admitted in.
// Out of line, as publish_rows.
#[inline(never)]
pub(super) fn move_if_a_rule_says_so(shared: &shmem::Shared, sched: &SchedShared) {
    let Some(entry) = shared.my_entry() else {
        return;
    };
    if entry.inbox.rule_move.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(slot) = entry.move_asked_for_this_statement() else {
        // Asked for a statement that has ended since.
        entry.inbox.rule_move.store(0, Ordering::Relaxed);
        return;
    };
    let moved = MEMBER.with_borrow_mut(|m| {
        let m = m.as_mut().filter(|m| m.owner)?;
        let query = m
            .query
            .filter(|&q| sched.is_running(m.proc) && sched.may_move(q))?;
        let pinned = shared.groups.settings_of(slot).filter(|s| s.pinned);
        let pinned_priority = pinned.map(|s| priority_range(&s).p0);
        {
            let _lock = shared.registration_lock();
            sched.move_query(query, GroupId(slot as u32), pinned_priority)
        }
        .ok()?;
        m.group = slot;
        m.pinned_priority = pinned_priority;
        Some(())
    });
    if moved.is_some() {
        entry.inbox.rule_move.store(0, Ordering::Relaxed);
    }
}
