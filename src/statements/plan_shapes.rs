//! What a statement's plan is, as the check of statements too small to admit needs it
//! (`unadmitted::too_small_to_admit`): a plain read, a plain write of one table, or
//! neither (`plan_tree::is_plain_read`, `plan_tree::plain_write_target`). Those walks
//! cost a statement more than the rest of what pg_stride does for it, and a statement
//! prepared at the protocol level (by a driver, `pgbench -M prepared`) runs one saved
//! plan many times, so the answer for a saved plan is kept, by the plan's address, for
//! as long as the plan exists: PostgreSQL calls [`forget`] when the plan's memory
//! context is deleted or reset (a memory-context reset callback), before that address
//! can hold another plan. The answer depends on the plan alone (what the written table
//! does is asked at each execution: `write_targets`). An unnamed statement's plan and a
//! custom plan are saved too, and kept until the next statement replaces them or their
//! execution ends, which costs them some 120 instructions more than the walk alone; a
//! query sent as text has a plan made for it alone, which is walked and not kept.
//!
//! Nothing here can fail for a plan the executor runs (`pg::saved_plan_context` says
//! why): the ExecutorStart hook asks outside pgrx's error boundary, and PostgreSQL calls
//! [`forget`] while it frees memory, error cleanup included.

use crate::backend_local::BackendLocal;
use crate::{pg, plan_tree};
use pgrx::pg_sys;
use std::cell::{Cell, UnsafeCell};

/// What a plan is, for a statement too small to admit.
#[derive(Clone, Copy)]
pub enum Shape {
    /// Neither of the others: the statement is admitted.
    Neither,
    /// A read that does no more than its cost says (`plan_tree::is_plain_read`).
    Read,
    /// A write of one plain table that does no more than its cost says, apart from what
    /// the table does for each row written (`plan_tree::plain_write_target`).
    Write {
        table: pg_sys::Oid,
        command: pg_sys::CmdType::Type,
        upserts: bool,
    },
}

/// How many saved plans are kept. A place is taken until its plan's context goes, since
/// PostgreSQL cannot be asked to drop a callback: a plan whose places ([`PROBES`] from
/// its first) are all taken is walked at each execution.
const PLACES: usize = 64;
/// How many places from its first ([`home`]) a plan may take.
const PROBES: usize = 4;
const _: () = assert!(PLACES.is_power_of_two(), "home() takes the hash's top bits");

/// One kept plan.
struct Place {
    /// The plan's address; null while the place is free, which it is once its callback
    /// has run (or before it was first taken).
    stmt: Cell<*const pg_sys::PlannedStmt>,
    shape: Cell<Shape>,
    /// The callback registered with the plan's memory context while `stmt` is set,
    /// linked into that context's list: it must stay where it is until it has run.
    callback: UnsafeCell<pg_sys::MemoryContextCallback>,
}

static PLANS: BackendLocal<[Place; PLACES]> = BackendLocal::new(
    [const {
        Place {
            stmt: Cell::new(std::ptr::null()),
            shape: Cell::new(Shape::Neither),
            callback: UnsafeCell::new(pg_sys::MemoryContextCallback {
                func: None,
                arg: std::ptr::null_mut(),
                next: std::ptr::null_mut(),
            }),
        }
    }; PLACES],
);

/// The first place a plan at `stmt` may take: the address's bits mixed (Fibonacci
/// hashing), since palloc'd chunks share their low bits.
fn home(stmt: *const pg_sys::PlannedStmt) -> usize {
    ((stmt as usize as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - PLACES.trailing_zeros()))
        as usize
}

/// The places a plan whose first place is `first` may take, in order.
fn places(first: usize) -> impl Iterator<Item = usize> {
    (0..PROBES).map(move |k| (first + k) & (PLACES - 1))
}

/// What `stmt`'s plan is: kept, or walked (and kept if the plan is saved).
///
/// # Safety
/// `stmt` is a valid PlannedStmt allocated with palloc, as ExecutorStart's QueryDesc
/// holds one.
#[inline]
pub unsafe fn shape(stmt: *const pg_sys::PlannedStmt) -> Shape {
    let plans = PLANS.cells();
    let first = home(stmt);
    // A plain loop: an iterator chain here cost a statement sent as text, which is
    // never kept, some 45 instructions more (callgrind).
    for k in 0..PROBES {
        let place = &plans[(first + k) & (PLACES - 1)];
        if place.stmt.get() == stmt {
            return place.shape.get();
        }
    }
    // SAFETY: the caller's promise.
    unsafe { walk_and_keep(stmt, first) }
}

/// What `stmt`'s plan is, from its walk; kept in a free place from `first` on if the
/// plan is saved. Out of line, so that the lookup above stays small.
///
/// # Safety
/// As [`shape`].
#[inline(never)]
unsafe fn walk_and_keep(stmt: *const pg_sys::PlannedStmt, first: usize) -> Shape {
    let plans = PLANS.cells();
    // SAFETY: the caller's promise.
    let shape = unsafe { walk(stmt) };
    // SAFETY: as above; the plan comes from palloc, as every PlannedStmt does.
    if let Some(context) = unsafe { pg::saved_plan_context(stmt) } {
        if let Some(i) = places(first).find(|&i| plans[i].stmt.get().is_null()) {
            let place = &plans[i];
            let callback = place.callback.get();
            // SAFETY: a free place's callback is in no context's list (it ran, or was
            // never registered), and the place lives as long as the process.
            unsafe {
                (*callback).func = Some(forget);
                (*callback).arg = std::ptr::without_provenance_mut(i);
                pg::call_at_reset(context, callback);
            }
            place.shape.set(shape);
            place.stmt.set(stmt);
        }
    }
    shape
}

/// What `stmt`'s plan is, from its walk.
///
/// # Safety
/// As [`shape`].
unsafe fn walk(stmt: *const pg_sys::PlannedStmt) -> Shape {
    // SAFETY: the caller's promise.
    unsafe {
        if plan_tree::reads_only(stmt) {
            if plan_tree::is_plain_read(stmt) {
                Shape::Read
            } else {
                Shape::Neither
            }
        } else {
            plan_tree::plain_write_target(stmt).map_or(
                Shape::Neither,
                |(table, command, upserts)| Shape::Write {
                    table,
                    command,
                    upserts,
                },
            )
        }
    }
}

/// The memory context of the plan kept in place `arg` is being reset or deleted: the
/// place is free again. Called by PostgreSQL, once per registration.
unsafe extern "C-unwind" fn forget(arg: *mut std::ffi::c_void) {
    if let Some(place) = PLANS.cells().get(arg as usize) {
        place.stmt.set(std::ptr::null());
    }
}

/// What is kept for the plan at `stmt`: `Some(true)` for a plain read, `Some(false)` for
/// anything else, `None` for nothing. For the in-server tests.
#[cfg(any(test, feature = "pg_test"))]
pub fn kept(stmt: *const pg_sys::PlannedStmt) -> Option<bool> {
    let plans = PLANS.cells();
    places(home(stmt))
        .map(|i| &plans[i])
        .find(|place| place.stmt.get() == stmt)
        .map(|place| matches!(place.shape.get(), Shape::Read))
}
