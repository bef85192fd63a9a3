//! Walking a finished plan (a PlannedStmt) for the parts that read or change its
//! Gathers: the concurrency hint lowers their worker counts, the pool puts a Stride
//! Gather in their place (layer 1 of docs/design.md §7: no pg_stride state here).

use pgrx::pg_sys;
use std::ffi::CStr;

/// The custom scan that stands for a Gather in a plan made for the pool.
pub const STRIDE_GATHER: &CStr = c"Stride Gather";
/// The one that stands for a Gather Merge.
pub const STRIDE_GATHER_MERGE: &CStr = c"Stride Gather Merge";

/// Calls `f` with the address of every pointer to a Plan node of `stmt` — its plan
/// tree, then each of its subplans (initPlans, CTEs, SubPlans) — parent before
/// children, in a fixed order. `f` may store another Plan at the address; the walk then
/// goes on into the children of the one stored.
///
/// # Safety
/// `stmt` is a valid PlannedStmt whose subplans are a List of Plan nodes or NULLs; a
/// Plan `f` stores is valid.
pub unsafe fn for_each_plan(
    stmt: *mut pg_sys::PlannedStmt,
    f: &mut dyn FnMut(*mut *mut pg_sys::Plan),
) {
    // SAFETY: the caller's promise.
    unsafe {
        walk(&raw mut (*stmt).planTree, f);
        walk_list((*stmt).subplans, f);
    }
}

/// # Safety
/// `slot` points to a pointer that is null or a valid Plan node.
unsafe fn walk(slot: *mut *mut pg_sys::Plan, f: &mut dyn FnMut(*mut *mut pg_sys::Plan)) {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type, and the lists named
    // here hold Plan nodes. Bitmap heap scans' BitmapAnd/BitmapOr are left out: no
    // Gather can be under them.
    unsafe {
        if (*slot).is_null() {
            return;
        }
        f(slot);
        let plan = *slot;
        match (*plan).type_ {
            T_Append => walk_list((*plan.cast::<pg_sys::Append>()).appendplans, f),
            T_MergeAppend => walk_list((*plan.cast::<pg_sys::MergeAppend>()).mergeplans, f),
            T_CustomScan => walk_list((*plan.cast::<pg_sys::CustomScan>()).custom_plans, f),
            T_SubqueryScan => walk(&raw mut (*plan.cast::<pg_sys::SubqueryScan>()).subplan, f),
            _ => {}
        }
        walk(&raw mut (*plan).lefttree, f);
        walk(&raw mut (*plan).righttree, f);
    }
}

/// # Safety
/// `list` is NIL or a valid List of Plan nodes (or NULLs).
unsafe fn walk_list(list: *mut pg_sys::List, f: &mut dyn FnMut(*mut *mut pg_sys::Plan)) {
    if list.is_null() {
        return;
    }
    // SAFETY: the caller's promise; a pointer List keeps its elements in `elements`.
    unsafe {
        for i in 0..(*list).length as usize {
            let cell = (*list).elements.add(i);
            walk((&raw mut (*cell).ptr_value).cast(), f);
        }
    }
}

/// The Gather or Gather Merge a Stride Gather (or Stride Gather Merge) custom scan
/// stands for — the first node of its `custom_private` —, or `None` when `plan` is
/// another node.
///
/// # Safety
/// `plan` is a valid Plan node.
pub unsafe fn stride_gather_inner(plan: *mut pg_sys::Plan) -> Option<*mut pg_sys::Plan> {
    // SAFETY: the caller's promise; a CustomScan's methods are static and name it.
    unsafe {
        if (*plan).type_ != pg_sys::NodeTag::T_CustomScan {
            return None;
        }
        let cscan = plan.cast::<pg_sys::CustomScan>();
        let name = CStr::from_ptr((*(*cscan).methods).CustomName);
        if name != STRIDE_GATHER && name != STRIDE_GATHER_MERGE {
            return None;
        }
        let private = (*cscan).custom_private;
        (!private.is_null() && (*private).length > 0)
            .then(|| (*(*private).elements).ptr_value.cast::<pg_sys::Plan>())
    }
}
