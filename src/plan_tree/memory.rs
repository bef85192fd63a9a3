//! The working memory a finished plan may keep at once, for memory-aware admission
//! (`pg_stride_sched::memory` says what counts and why).

use super::walk::{each_in_list, for_each_child, stride_gather_inner};
use pg_stride_sched::memory::{node_need_kb, MemorySettings, NodeMemory};
use pgrx::pg_sys;

/// The working memory, kB, that `stmt`'s nodes may keep at once under `settings`: its
/// plan tree, then each of its subplans (initPlans, CTEs, SubPlans), counted once.
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
    let mut units = Units::default();
    // SAFETY: the caller's promise.
    unsafe {
        units.add(1, (*stmt).planTree);
        each_in_list((*stmt).subplans, &mut |slot| units.add(1, *slot));
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
/// node type, on. Anything else — a node that keeps memory, an Agg or a SetOp whose
/// strategy decides, a node with a list of children, a type added later — takes the
/// walk. One test per node: this runs for every statement while a budget is set.
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
        T_BitmapIndexScan,
        T_BitmapHeapScan,
        T_TidScan,
        T_TidRangeScan,
        T_FunctionScan,
        T_TableFuncScan,
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
            match kind_of(plan) {
                NodeMemory::None => {}
                NodeMemory::WorkMem => self.work = self.work.saturating_add(copies),
                NodeMemory::HashMem => self.hash = self.hash.saturating_add(copies),
            }
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

/// How node `plan` bounds its memory.
///
/// # Safety
/// `plan` is a valid Plan node.
unsafe fn kind_of(plan: *const pg_sys::Plan) -> NodeMemory {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type.
    unsafe {
        match (*plan).type_ {
            T_Sort | T_IncrementalSort | T_Material | T_WindowAgg | T_CteScan => {
                NodeMemory::WorkMem
            }
            T_Hash | T_Memoize | T_RecursiveUnion => NodeMemory::HashMem,
            T_Agg => match (*plan.cast::<pg_sys::Agg>()).aggstrategy {
                pg_sys::AggStrategy::AGG_HASHED | pg_sys::AggStrategy::AGG_MIXED => {
                    NodeMemory::HashMem
                }
                _ => NodeMemory::None,
            },
            T_SetOp => match (*plan.cast::<pg_sys::SetOp>()).strategy {
                pg_sys::SetOpStrategy::SETOP_HASHED => NodeMemory::HashMem,
                _ => NodeMemory::None,
            },
            _ => NodeMemory::None,
        }
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
