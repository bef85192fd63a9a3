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

/// Calls `f` with each expression tree (an expression node or a List of them, never
/// null) that plan node `plan` holds itself: its target list and filter, then the
/// expression fields of its type (index conditions, join clauses, a Limit's counts, a
/// Function Scan's calls, …); not its initPlans (SubPlans run once, by the leader) nor
/// its children's, nor an Append's or Merge Append's partition pruning. Returns false,
/// having called `f` for its target list and filter only, for a node type not named
/// here: one a later release adds, a foreign scan, a custom scan other than a Stride
/// Gather; a caller that must see every expression then answers for the unknown.
///
/// # Safety
/// `plan` is a valid Plan node of a finished plan.
pub unsafe fn for_each_expression(
    plan: *const pg_sys::Plan,
    f: &mut dyn FnMut(*mut pg_sys::Node),
) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        let own = own_expressions(plan);
        let common = nodes(&[(*plan).targetlist, (*plan).qual]);
        let known = own.is_some();
        for e in common.into_iter().chain(own.into_iter().flatten()) {
            if !e.is_null() {
                f(e);
            }
        }
        known
    }
}

/// The expression trees of `plan`'s own type ([`for_each_expression`]), `None` for a
/// type not named here.
///
/// # Safety
/// As [`for_each_expression`].
unsafe fn own_expressions(plan: *const pg_sys::Plan) -> Option<Vec<*mut pg_sys::Node>> {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type, whose fields named here
    // are expression nodes or lists of them.
    unsafe {
        Some(match (*plan).type_ {
            T_SeqScan
            | T_SubqueryScan
            | T_CteScan
            | T_WorkTableScan
            | T_NamedTuplestoreScan
            | T_ProjectSet
            | T_RecursiveUnion
            | T_Material
            | T_Sort
            | T_IncrementalSort
            | T_Group
            | T_Agg
            | T_Unique
            | T_SetOp
            | T_Gather
            | T_GatherMerge
            | T_Append
            | T_MergeAppend
            | T_BitmapAnd
            | T_BitmapOr => vec![],
            T_Result => vec![(*plan.cast::<pg_sys::Result>()).resconstantqual],
            T_SampleScan => vec![(*plan.cast::<pg_sys::SampleScan>()).tablesample.cast()],
            T_IndexScan => {
                let scan = plan.cast::<pg_sys::IndexScan>();
                nodes(&[
                    (*scan).indexqual,
                    (*scan).indexqualorig,
                    (*scan).indexorderby,
                    (*scan).indexorderbyorig,
                ])
            }
            T_IndexOnlyScan => {
                let scan = plan.cast::<pg_sys::IndexOnlyScan>();
                nodes(&[(*scan).indexqual, (*scan).recheckqual, (*scan).indexorderby])
            }
            T_BitmapIndexScan => {
                let scan = plan.cast::<pg_sys::BitmapIndexScan>();
                nodes(&[(*scan).indexqual, (*scan).indexqualorig])
            }
            T_BitmapHeapScan => nodes(&[(*plan.cast::<pg_sys::BitmapHeapScan>()).bitmapqualorig]),
            T_TidScan => nodes(&[(*plan.cast::<pg_sys::TidScan>()).tidquals]),
            T_TidRangeScan => nodes(&[(*plan.cast::<pg_sys::TidRangeScan>()).tidrangequals]),
            T_FunctionScan => nodes(&[(*plan.cast::<pg_sys::FunctionScan>()).functions]),
            T_ValuesScan => nodes(&[(*plan.cast::<pg_sys::ValuesScan>()).values_lists]),
            T_NestLoop => nodes(&[(*plan.cast::<pg_sys::Join>()).joinqual]),
            T_MergeJoin => {
                let join = plan.cast::<pg_sys::MergeJoin>();
                nodes(&[(*join).join.joinqual, (*join).mergeclauses])
            }
            T_HashJoin => {
                let join = plan.cast::<pg_sys::HashJoin>();
                nodes(&[(*join).join.joinqual, (*join).hashclauses, (*join).hashkeys])
            }
            T_Hash => nodes(&[(*plan.cast::<pg_sys::Hash>()).hashkeys]),
            T_Memoize => nodes(&[(*plan.cast::<pg_sys::Memoize>()).param_exprs]),
            T_WindowAgg => {
                let window = plan.cast::<pg_sys::WindowAgg>();
                let mut own = vec![(*window).startOffset, (*window).endOffset];
                own.extend(nodes(&[(*window).runCondition]));
                own
            }
            T_Limit => {
                let limit = plan.cast::<pg_sys::Limit>();
                vec![(*limit).limitOffset, (*limit).limitCount]
            }
            T_CustomScan if stride_gather_inner(plan.cast_mut()).is_some() => {
                let scan = plan.cast::<pg_sys::CustomScan>();
                nodes(&[(*scan).custom_exprs, (*scan).custom_scan_tlist])
            }
            _ => return None,
        })
    }
}

/// Lists as expression trees.
fn nodes(lists: &[*mut pg_sys::List]) -> Vec<*mut pg_sys::Node> {
    lists.iter().map(|&l| l.cast()).collect()
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
