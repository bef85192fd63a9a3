//! The working memory a finished plan may keep at once, for memory-aware admission
//! (`pg_stride_sched::memory` says what counts and why).

use super::walk::{
    for_each_child, for_each_expression, list_len, list_nth, list_ptrs, stride_gather_inner,
};
use pg_stride_sched::memory::{node_need_kb, MemorySettings, NodeMemory};
use pgrx::pg_sys;

/// The working memory, kB, that `stmt`'s nodes may keep at once under `settings`: its
/// plan tree, then each of its subplans (initPlans, CTEs, SubPlans), counted once for
/// each process that runs it: a SubPlan that a node under a Gather evaluates runs in the
/// leader and in each planned worker, as that node does.
///
/// # Safety
/// `stmt` is a valid PlannedStmt whose subplans are a List of Plan nodes or NULLs.
// Out of line, so that bench/instructions.py can count its instructions.
#[inline(never)]
pub unsafe fn need_kb(stmt: *const pg_sys::PlannedStmt, settings: MemorySettings) -> u64 {
    // SAFETY: the caller's promise.
    unsafe {
        if keeps_nothing_in_a_chain(stmt) {
            // The suites run debug builds: every plan they take this way is checked
            // against the walk.
            debug_assert_eq!(walked_kb(stmt, settings), 0, "a chain that keeps memory");
            0
        } else {
            walked_kb(stmt, settings)
        }
    }
}

/// [`need_kb`] of a plan that is not a plain chain, by walking all of it.
///
/// # Safety
/// As [`need_kb`].
#[inline(never)]
unsafe fn walked_kb(stmt: *const pg_sys::PlannedStmt, settings: MemorySettings) -> u64 {
    // SAFETY: the caller's promise.
    let subplans = unsafe { (*stmt).subplans };
    // SAFETY: as above.
    let count = unsafe { list_len(subplans) };
    let mut units = Units {
        subplan_copies: vec![1; count],
        ..Units::default()
    };
    // SAFETY: the caller's promise. A subplan comes after the subplans its own
    // expressions call (the planner plans a subquery's subqueries first), so from the
    // last to the first each is counted once what calls it was.
    unsafe {
        units.add(1, (*stmt).planTree);
        for i in (0..count).rev() {
            let copies = units.subplan_copies[i];
            units.add(copies, list_nth(subplans, i));
        }
    }
    // Most statements of an OLTP workload keep nothing: no arithmetic for them.
    if units.work == 0 && units.hash == 0 {
        return 0;
    }
    node_need_kb(NodeMemory::WorkMem, settings, units.work).saturating_add(node_need_kb(
        NodeMemory::HashMem,
        settings,
        units.hash,
    ))
}

/// Whether `stmt` is a chain of nodes with one child each, none of which keeps memory,
/// and has no subplans: the plan of most OLTP statements (an index scan, a ModifyTable
/// over one), answered in a loop without the walk.
///
/// # Safety
/// As [`need_kb`].
#[inline(always)]
unsafe fn keeps_nothing_in_a_chain(stmt: *const pg_sys::PlannedStmt) -> bool {
    // SAFETY: the caller's promise; a Plan's lefttree and righttree are Plans or NULL.
    unsafe {
        if !(*stmt).subplans.is_null() {
            return false;
        }
        let mut node = (*stmt).planTree;
        while !node.is_null() {
            if !(*node).righttree.is_null() || !is_chain_link((*node).type_) {
                return false;
            }
            node = (*node).lefttree;
        }
        true
    }
}

/// Plan node types that keep nothing and whose only child is their lefttree (or
/// their righttree, checked apart): one bit per type, from `T_Result`, the first plan
/// node type, on. Anything else — a node that keeps memory (a Bitmap Heap Scan's
/// Bitmap Index Scan, a Function Scan's tuple stores), an Agg or a SetOp whose strategy
/// and aggregates decide, a node with a list of children, a type added later — takes
/// the walk. One test per node: this runs for every statement while a budget is set.
const CHAIN_LINKS: u64 = {
    use pg_sys::NodeTag::*;
    let links = [
        T_Result,
        T_ProjectSet,
        T_ModifyTable,
        T_SeqScan,
        T_SampleScan,
        T_IndexScan,
        T_IndexOnlyScan,
        T_BitmapHeapScan,
        T_TidScan,
        T_TidRangeScan,
        T_ValuesScan,
        T_NamedTuplestoreScan,
        T_WorkTableScan,
        T_ForeignScan,
        T_Group,
        T_Unique,
        T_Gather,
        T_LockRows,
        T_Limit,
    ];
    let mut mask = 0u64;
    let mut i = 0;
    while i < links.len() {
        let bit = links[i] as u32 - T_Result as u32;
        assert!(bit < 64, "plan node types span more than 64 values");
        mask |= 1 << bit;
        i += 1;
    }
    mask
};

/// Whether a node of type `tag` is one of [`CHAIN_LINKS`].
#[inline(always)]
fn is_chain_link(tag: pg_sys::NodeTag) -> bool {
    let bit = (tag as u32).wrapping_sub(pg_sys::NodeTag::T_Result as u32);
    bit < 64 && CHAIN_LINKS & (1 << bit) != 0
}

/// The bounds of a plan's nodes, counted in `work_mem`s and in hash tables' bounds
/// (computed with the settings once at the end: this runs for every statement while a
/// budget is set).
#[derive(Default)]
struct Units {
    work: u64,
    hash: u64,
    /// For each of the statement's subplans (by `plan_id` − 1), the most processes that
    /// run a node whose expressions call it; empty without subplans, and only then can
    /// a node's expressions call one ([`SubPlanCalls`]).
    subplan_copies: Vec<u64>,
}

impl Units {
    /// Counts `plan` and the nodes under it, each run by `copies` processes.
    ///
    /// # Safety
    /// `plan` is null or a valid Plan node.
    unsafe fn add(&mut self, copies: u64, plan: *mut pg_sys::Plan) {
        if plan.is_null() {
            return;
        }
        // SAFETY: the caller's promise; a Gather's or a Stride Gather's children are Plans.
        unsafe {
            let (work, mut hash) = bound_of(plan);
            if !self.subplan_copies.is_empty() {
                let mut calls = SubPlanCalls {
                    copies,
                    hashed: 0,
                    subplan_copies: &mut self.subplan_copies,
                };
                for_each_expression(plan, &mut |e| calls.walk(e));
                hash = hash.saturating_add(calls.hashed);
            }
            self.work = self.work.saturating_add(work.saturating_mul(copies));
            self.hash = self.hash.saturating_add(hash.saturating_mul(copies));
            // Below a Gather, the leader and each planned worker run the nodes (with
            // parallel_leader_participation off the leader does not: counted anyway).
            let below = match workers_of(plan) {
                Some(workers) => copies.saturating_mul(1 + workers),
                None => copies,
            };
            for_each_child(plan, &mut |child| {
                if !child.is_null() {
                    self.add(below, *child)
                }
            });
        }
    }
}

/// The bound of node `plan` alone: how many `work_mem`s and how many hash tables' bounds
/// it may keep at once.
///
/// # Safety
/// `plan` is a valid Plan node.
unsafe fn bound_of(plan: *const pg_sys::Plan) -> (u64, u64) {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type.
    unsafe {
        match (*plan).type_ {
            // A Table Function Scan keeps its rows in a tuple store.
            T_Sort | T_IncrementalSort | T_Material | T_WindowAgg | T_CteScan | T_TableFuncScan => {
                (1, 0)
            }
            // TID bitmaps, each bounded by work_mem (tbm_create).
            T_BitmapIndexScan | T_BitmapAnd | T_BitmapOr => (bitmaps(plan), 0),
            // Each function's rows go to a tuple store of their own
            // (ExecMakeTableFunctionResult), whatever way the function returns them.
            T_FunctionScan => (
                list_len((*plan.cast::<pg_sys::FunctionScan>()).functions) as u64,
                0,
            ),
            T_Hash | T_Memoize => (0, 1),
            // Its working and intermediate tables are tuple stores (nodeRecursiveunion.c);
            // UNION, not UNION ALL, also keeps the rows seen in a hash table.
            T_RecursiveUnion => (
                2,
                u64::from((*plan.cast::<pg_sys::RecursiveUnion>()).numCols > 0),
            ),
            T_Agg => {
                let agg = plan.cast::<pg_sys::Agg>();
                let hashed = matches!(
                    (*agg).aggstrategy,
                    pg_sys::AggStrategy::AGG_HASHED | pg_sys::AggStrategy::AGG_MIXED
                );
                (agg_sorts(agg), u64::from(hashed))
            }
            T_SetOp => match (*plan.cast::<pg_sys::SetOp>()).strategy {
                pg_sys::SetOpStrategy::SETOP_HASHED => (0, 1),
                _ => (0, 0),
            },
            _ => (0, 0),
        }
    }
}

/// The TID bitmaps under a Bitmap Index Scan, BitmapAnd or BitmapOr (whose children
/// the plan walk does not visit): one per Bitmap Index Scan, an upper bound (a
/// BitmapOr's index scans add to one bitmap; a BitmapAnd keeps two at a time).
///
/// # Safety
/// `plan` is a valid Plan node.
unsafe fn bitmaps(plan: *const pg_sys::Plan) -> u64 {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; the bitmapplans of a BitmapAnd or BitmapOr are Plans.
    unsafe {
        let children = match (*plan).type_ {
            T_BitmapIndexScan => return 1,
            T_BitmapAnd => (*plan.cast::<pg_sys::BitmapAnd>()).bitmapplans,
            T_BitmapOr => (*plan.cast::<pg_sys::BitmapOr>()).bitmapplans,
            _ => return 0,
        };
        let mut n = 0u64;
        for child in list_ptrs::<pg_sys::Plan>(children) {
            n = n.saturating_add(bitmaps(child));
        }
        n
    }
}

/// The sorts an Agg runs inside itself, which its plan shows no Sort node for: one per
/// aggregate with DISTINCT or ORDER BY, or ordered-set (`WITHIN GROUP`), in each
/// grouping set of the largest phase (nodeAgg.c sorts such an aggregate's input per
/// group; `ordered_set_startup` likewise), and one per further grouping-set phase that
/// sorts its input again (a chained Agg with a Sort below it; hashed phases sort
/// nothing). Plain and sorted aggregation keep nothing else. An aggregate written twice
/// (in the target list and in HAVING) shares one sort and is counted twice: an upper
/// bound.
///
/// # Safety
/// `agg` is a valid Agg node.
unsafe fn agg_sorts(agg: *const pg_sys::Agg) -> u64 {
    let mut ordered = 0u64;
    // SAFETY: the caller's promise; an Agg's targetlist and qual are expression trees,
    // which expression_tree_walker walks (it raises an ERROR only on a node type it
    // does not know, which a finished plan does not hold); an Agg's chain is a List of
    // Agg nodes.
    unsafe {
        for list in [(*agg).plan.targetlist, (*agg).plan.qual] {
            count_ordered_aggregates(list.cast(), (&raw mut ordered).cast());
        }
        let mut sets = list_len((*agg).groupingSets);
        let mut phase_sorts = 0u64;
        for phase in list_ptrs::<pg_sys::Agg>((*agg).chain) {
            sets = sets.max(list_len((*phase).groupingSets));
            phase_sorts += u64::from(!(*phase).plan.lefttree.is_null());
        }
        ordered
            .saturating_mul(sets.max(1) as u64)
            .saturating_add(phase_sorts)
    }
}

/// expression_tree_walker's callback: adds to the count at `context` (a u64) each
/// Aggref under `node` that sorts its input itself. Cannot panic (called from C).
unsafe extern "C-unwind" fn count_ordered_aggregates(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: expression_tree_walker passes nodes of the tree and the context it was
    // given, a u64.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_Aggref {
            let aggref = node.cast::<pg_sys::Aggref>();
            let sorts = !(*aggref).aggdistinct.is_null() || !(*aggref).aggorder.is_null();
            // From PostgreSQL 16 on, the planner may sort the input below the Agg for
            // one such aggregate (a Sort node, counted as such).
            #[cfg(not(feature = "pg15"))]
            let sorts = sorts && !(*aggref).aggpresorted;
            if sorts {
                *context.cast::<u64>() += 1;
            }
            // An aggregate's arguments hold no aggregate of the same level.
            return false;
        }
        pg_sys::expression_tree_walker(node, Some(count_ordered_aggregates), context)
    }
}

/// The SubPlans a node's own expressions call, run by `copies` processes: each raises
/// the copies its subplan is counted with, and a hashed one — `x NOT IN (SELECT …)` and
/// the like keep the subquery's rows in a hash table in each process that evaluates the
/// expression (nodeSubplan.c), which the planner chose only if it fits in
/// `work_mem × hash_mem_multiplier`, and which does not spill — counts one hash table's
/// bound (`hashed`) in the node.
struct SubPlanCalls<'a> {
    copies: u64,
    hashed: u64,
    subplan_copies: &'a mut Vec<u64>,
}

impl SubPlanCalls<'_> {
    /// Walks the expression tree `node`.
    ///
    /// # Safety
    /// `node` is a valid expression node (or List) of a finished plan.
    unsafe fn walk(&mut self, node: *mut pg_sys::Node) {
        // SAFETY: the caller's promise; the context is this value, as the callback
        // expects.
        unsafe { note_subplans(node, (self as *mut Self).cast()) };
    }
}

/// expression_tree_walker's callback, for [`SubPlanCalls`] at `context`. It walks a
/// SubPlan's arguments, not its plan (counted as one of the statement's subplans).
/// Cannot panic (called from C).
unsafe extern "C-unwind" fn note_subplans(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: expression_tree_walker passes nodes of the tree and the context it was
    // given, a SubPlanCalls.
    unsafe {
        if (*node).type_ == pg_sys::NodeTag::T_SubPlan {
            let calls = &mut *context.cast::<SubPlanCalls>();
            let subplan = node.cast::<pg_sys::SubPlan>();
            if (*subplan).useHashTable {
                calls.hashed += 1;
            }
            let index = usize::try_from((*subplan).plan_id)
                .ok()
                .and_then(|id| id.checked_sub(1));
            if let Some(copies) = index.and_then(|i| calls.subplan_copies.get_mut(i)) {
                *copies = (*copies).max(calls.copies);
            }
        }
        pg_sys::expression_tree_walker(node, Some(note_subplans), context)
    }
}

/// The workers planned for `plan` if it is a Gather or Gather Merge, or a Stride
/// Gather standing for one.
///
/// # Safety
/// `plan` is a valid Plan node.
unsafe fn workers_of(plan: *mut pg_sys::Plan) -> Option<u64> {
    // SAFETY: the caller's promise; a Plan's tag tells its type.
    unsafe {
        let gather = stride_gather_inner(plan).unwrap_or(plan);
        let workers = match (*gather).type_ {
            pg_sys::NodeTag::T_Gather => (*gather.cast::<pg_sys::Gather>()).num_workers,
            pg_sys::NodeTag::T_GatherMerge => (*gather.cast::<pg_sys::GatherMerge>()).num_workers,
            _ => return None,
        };
        Some(workers.max(0) as u64)
    }
}
