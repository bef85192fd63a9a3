//! Walking a finished plan's nodes, and the Gathers that the pool's custom scans stand
//! for.

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
    // SAFETY: the caller's promise.
    unsafe {
        if (*slot).is_null() {
            return;
        }
        f(slot);
        for_each_child(*slot, &mut |child| walk(child, f));
    }
}

/// Calls `f` with the address of each pointer to a child of `plan` (null ones
/// included): the plans of an Append, Merge Append or custom scan, a subquery scan's
/// subplan, then the left and right trees. Bitmap heap scans' BitmapAnd/BitmapOr are
/// left out: no Gather, sort or hash can be under them (the memory bound counts the
/// bitmaps below them itself).
///
/// # Safety
/// `plan` is a valid Plan node.
pub unsafe fn for_each_child<F: FnMut(*mut *mut pg_sys::Plan)>(plan: *mut pg_sys::Plan, f: &mut F) {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type, and the lists named
    // here hold Plan nodes.
    unsafe {
        let mut left_listed = false;
        match (*plan).type_ {
            T_Append => each_in_list((*plan.cast::<pg_sys::Append>()).appendplans, f),
            T_MergeAppend => each_in_list((*plan.cast::<pg_sys::MergeAppend>()).mergeplans, f),
            T_CustomScan => {
                let listed = (*plan.cast::<pg_sys::CustomScan>()).custom_plans;
                // From 18 on a Stride Gather lists its child in custom_plans too
                // (`stride_gather`): visited once.
                left_listed = list_ptrs::<pg_sys::Plan>(listed).any(|p| p == (*plan).lefttree);
                each_in_list(listed, f)
            }
            T_SubqueryScan => f(&raw mut (*plan.cast::<pg_sys::SubqueryScan>()).subplan),
            _ => {}
        }
        if !left_listed {
            f(&raw mut (*plan).lefttree);
        }
        f(&raw mut (*plan).righttree);
    }
}

/// # Safety
/// `list` is NIL or a valid List of Plan nodes (or NULLs).
unsafe fn walk_list(list: *mut pg_sys::List, f: &mut dyn FnMut(*mut *mut pg_sys::Plan)) {
    // SAFETY: the caller's promise.
    unsafe { each_in_list(list, &mut |slot| walk(slot, f)) }
}

/// The elements of `list`, a List of pointers to `T` (NIL: none), read from its array:
/// pgrx's `PgList` reads each one through a guarded call of PostgreSQL's `list_nth`
/// (a sigsetjmp per element), which the per-statement path cannot afford.
///
/// # Safety
/// `list` is NIL or a valid pointer List, unchanged while the iterator is used.
pub unsafe fn list_ptrs<T>(list: *const pg_sys::List) -> impl Iterator<Item = *mut T> {
    // SAFETY: the caller's promise.
    let length = unsafe { list_len(list) };
    // SAFETY: the caller's promise; every index is below the length.
    (0..length).map(move |i| unsafe { list_nth(list, i) })
}

/// The length of `list` (0 for NIL).
///
/// # Safety
/// `list` is NIL or a valid List.
#[inline(always)]
pub(super) unsafe fn list_len(list: *const pg_sys::List) -> usize {
    // SAFETY: the caller's promise.
    // A List's length is never negative.
    unsafe { list.as_ref().map_or(0, |l| l.length as usize) }
}

/// Element `i` of `list`, a List of pointers.
///
/// # Safety
/// `list` is a valid pointer List and `i` below its length.
#[inline(always)]
pub(super) unsafe fn list_nth<T>(list: *const pg_sys::List, i: usize) -> *mut T {
    // SAFETY: the caller's promise; a List keeps its N elements in `elements[0..N]`.
    unsafe { (*(*list).elements.add(i)).ptr_value.cast::<T>() }
}

/// Element `i` of `list`, a List of integers.
///
/// # Safety
/// `list` is a valid integer List and `i` below its length.
#[inline(always)]
pub(super) unsafe fn list_nth_int(list: *const pg_sys::List, i: usize) -> i32 {
    // SAFETY: the caller's promise; a List keeps its N elements in `elements[0..N]`.
    unsafe { (*(*list).elements.add(i)).int_value }
}

/// Calls `f` with the address of each element of `list`, a List of pointers.
///
/// # Safety
/// `list` is NIL or a valid pointer List.
pub(super) unsafe fn each_in_list<F: FnMut(*mut *mut pg_sys::Plan)>(
    list: *mut pg_sys::List,
    f: &mut F,
) {
    if list.is_null() {
        return;
    }
    // SAFETY: the caller's promise; a pointer List keeps its elements in `elements`.
    unsafe {
        for i in 0..(*list).length as usize {
            let cell = (*list).elements.add(i);
            f((&raw mut (*cell).ptr_value).cast());
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
        list_ptrs::<pg_sys::Plan>((*cscan).custom_private).next()
    }
}
