//! How the planner's CPU cost settings compare with PostgreSQL's defaults, for the cost
//! bounds pg_stride applies to plans (the tiny-statement bound, `cpu/tiny.rs`; the
//! monitoring-query cap, `monitoring.rs`), which are meant for the defaults.
//!
//! Any role may lower `cpu_tuple_cost`, `cpu_index_tuple_cost` and `cpu_operator_cost`
//! for its session, down to 0, and a plan's total cost with them: a bound is scaled by
//! the lowest of the three ratios, so that a session cannot make an expensive plan look
//! cheap. A cached plan (a prepared statement's generic plan, a PL/pgSQL query's) keeps
//! the costs it was planned with after the settings are put back, so the scale is also
//! never above the lowest any plan of this backend was made with. Raised costs leave
//! bounds as they are. Page costs are left out: a server on SSDs lowers
//! `random_page_cost`, and a plan that reads many rows pays for them in tuple costs
//! anyway.

use crate::backend_local::BackendLocal;
use pgrx::pg_sys;
use std::cell::Cell;

/// The lowest [`in_force`] at any planning in this backend.
static LOWEST_PLANNED: BackendLocal<Cell<f64>> = BackendLocal::new(Cell::new(1.0));

/// The ratio of the CPU costs in force to the defaults: the lowest of the three, at most 1.
fn in_force() -> f64 {
    // SAFETY: plain reads of the planner's settings, process-local globals.
    let (tuple, index_tuple, operator) = unsafe {
        (
            pg_sys::cpu_tuple_cost,
            pg_sys::cpu_index_tuple_cost,
            pg_sys::cpu_operator_cost,
        )
    };
    lower(
        lower(
            tuple / pg_sys::DEFAULT_CPU_TUPLE_COST,
            index_tuple / pg_sys::DEFAULT_CPU_INDEX_TUPLE_COST,
        ),
        lower(operator / pg_sys::DEFAULT_CPU_OPERATOR_COST, 1.0),
    )
}

/// The lower of `a` and `b`: one comparison, where `f64::min`, which this runs for every
/// statement, also orders NaNs (no setting is one: PostgreSQL rejects NaN for a real
/// setting's value outside its range).
#[inline(always)]
fn lower(a: f64, b: f64) -> f64 {
    if a < b {
        a
    } else {
        b
    }
}

/// Called by the planner hook for each plan it makes: remembers the costs it was made with.
pub fn planning() {
    let scale = in_force();
    if scale < LOWEST_PLANNED.get() {
        LOWEST_PLANNED.set(scale);
    }
}

/// What a cost bound meant for the defaults is multiplied by (see the module comment).
pub fn scale() -> f64 {
    lower(in_force(), LOWEST_PLANNED.get())
}

/// A plan's `cost` as the default CPU cost settings would have made it, about: what the
/// prediction's cost model, shared by every role, learns from and predicts by
/// (`pg_stride_sched::predict::CostModel`). A session that lowered its costs cannot make
/// its plans look cheaper to it, or teach it that plans cost more CPU than they do; with
/// them at 0 the cost is infinite, and says nothing.
pub fn at_defaults(cost: f64) -> f64 {
    cost / scale()
}
