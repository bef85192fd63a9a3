//! Yield points: the leaf scans of a scheduled statement's plan and the nodes that
//! emit work already done get an
//! ExecProcNode of pg_stride's that counts tuples down and checks in when a chunk is
//! done (`slots::check_in`).

use super::member::{asked_to_yield, COUNTDOWN};
use super::slots::check_in;
use crate::backend_local::BackendLocal;
use crate::{pg, plan_tree};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Wrapped scan nodes, by node address, with the function each one ran before and the
/// statement it belongs to. A yield point looks its node up for every tuple, so this is
/// a hash table (O(1), no allocation on lookup) rather than a list: a plan over 500
/// partitions has 500 wrapped scans. Apart from `statements::registry::Statement`: a parallel
/// worker wraps its nodes without a statement of its own, and the per-tuple lookup must
/// not go through the statement list.
static WRAPPED: BackendLocal<RefCell<HashMap<usize, Wrapped, BuildHasherDefault<AddressHasher>>>> =
    BackendLocal::new(RefCell::new(
        HashMap::with_hasher(BuildHasherDefault::new()),
    ));

/// The node the last yield point looked up and its function: a scan returns its tuples
/// one after another, so most yield points are that node's again, and a compare replaces
/// the hash lookup, which would otherwise be paid for every tuple of every scan.
/// Cleared whenever `WRAPPED` changes.
static LAST_LOOKUP: BackendLocal<Cell<(usize, pg_sys::ExecProcNodeMtd)>> =
    BackendLocal::new(Cell::new((0, None)));

#[derive(Clone, Copy)]
struct Wrapped {
    desc: *const pg_sys::QueryDesc,
    original: pg_sys::ExecProcNodeMtd,
}

/// Hashes a node address: Fibonacci hashing of the address, whose low bits are the
/// same for every palloc'd node and whose high bits the table's mask would drop.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64 >> 3)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(32);
    }
}

/// Wraps the scans of `desc`'s plan with yield points, those of its subplans and
/// initPlans (`es_subplanstates`: an InitPlan can be as big as the rest of the query,
/// as in TPC-H Q11) included, and the nodes that return tuples from work already done.
/// The scans produce the tuples everything above them consumes, so they check in
/// regularly while their consumers take input (docs/design.md §8); a sort, an aggregate
/// or a materialized result then emits its output with no scan below it, which without
/// a yield point of its own would run as one long slice, however long the output
/// (bench/results/sim-gap/SIM_GAP.md measures the long slices with and without them).
/// ExecSetExecProcNode keeps PostgreSQL's first-call shim working.
pub(super) fn wrap_scans(desc: *const pg_sys::QueryDesc) {
    // SAFETY: after ExecutorStart the QueryDesc has its PlanState tree and EState, whose
    // es_subplanstates lists the PlanStates of every subplan.
    unsafe {
        wrap_scans_below(desc, (*desc).planstate);
        let estate = (*desc).estate;
        if !estate.is_null() {
            for plan in plan_tree::list_ptrs::<pg_sys::PlanState>((*estate).es_subplanstates) {
                wrap_scans_below(desc, plan);
            }
        }
    }
}

/// Forgets the wrapped scans of `desc`'s statement (`None`: of every statement).
pub(super) fn forget(desc: Option<*const pg_sys::QueryDesc>) {
    WRAPPED.with_borrow_mut(|w| w.retain(|_, x| desc.is_some_and(|d| x.desc != d)));
    LAST_LOOKUP.set((0, None));
}

/// Installs the yield point on `node`, once.
///
/// # Safety
/// `node` is a PlanState of the tree ExecInitNode built for `desc`.
unsafe fn wrap(desc: *const pg_sys::QueryDesc, node: *mut pg_sys::PlanState) {
    // SAFETY: the caller's promise.
    unsafe {
        // A node met twice keeps the function it had before the first time. An entry
        // of another statement at the same address is stale (that statement's nodes
        // were freed; a pool worker's next fragment reuses their memory) and is
        // replaced: calling its function on this node would run another node type.
        let original = (*node).ExecProcNodeReal;
        WRAPPED.with_borrow_mut(|w| {
            w.entry(node as usize)
                .and_modify(|x| {
                    if x.desc != desc {
                        *x = Wrapped { desc, original };
                    }
                })
                .or_insert(Wrapped { desc, original });
        });
        LAST_LOOKUP.set((0, None));
        pg::set_exec_proc_node(node, Some(yield_point));
    }
}

/// Wraps the scans of the plan-state subtree at `node` and the nodes that return
/// tuples from work already done (recursive: plan trees are shallow, and
/// this allocates nothing). Gather and Gather Merge stay as they are: the pool installs
/// its own function on them.
///
/// # Safety
/// `node` is null or a PlanState of the tree ExecInitNode built for `desc`.
unsafe fn wrap_scans_below(desc: *const pg_sys::QueryDesc, node: *mut pg_sys::PlanState) {
    if node.is_null() {
        return;
    }
    // SAFETY: `node` is a PlanState of the tree (the caller's promise); its children are
    // too.
    unsafe {
        use pg_sys::NodeTag::*;
        match (*node).type_ {
            T_SeqScanState
            | T_IndexScanState
            | T_IndexOnlyScanState
            | T_BitmapHeapScanState
            | T_FunctionScanState
            | T_ValuesScanState
            | T_SampleScanState
            | T_TidScanState
            | T_TableFuncScanState
            | T_CteScanState
            | T_WorkTableScanState
            | T_NamedTuplestoreScanState => wrap(desc, node),
            #[cfg(not(feature = "pg13"))]
            T_TidRangeScanState => wrap(desc, node),
            T_SortState
            | T_IncrementalSortState
            | T_AggState
            | T_WindowAggState
            | T_SetOpState
            | T_MaterialState => wrap(desc, node),
            #[cfg(not(feature = "pg13"))]
            T_MemoizeState => wrap(desc, node),
            T_AppendState => {
                let a = node.cast::<pg_sys::AppendState>();
                for i in 0..(*a).as_nplans as usize {
                    wrap_scans_below(desc, *(*a).appendplans.add(i));
                }
            }
            T_MergeAppendState => {
                let a = node.cast::<pg_sys::MergeAppendState>();
                for i in 0..(*a).ms_nplans as usize {
                    wrap_scans_below(desc, *(*a).mergeplans.add(i));
                }
            }
            T_SubqueryScanState => {
                wrap_scans_below(desc, (*node.cast::<pg_sys::SubqueryScanState>()).subplan)
            }
            _ => {}
        }
        wrap_scans_below(desc, (*node).lefttree);
        wrap_scans_below(desc, (*node).righttree);
    }
}

/// The yield point: counts tuples down and, when a chunk is done, checks in. It runs
/// outside pgrx's error boundary, so it cannot panic (a `try_` borrow, a hash lookup, a
/// counter), and it holds nothing with a destructor across the call of the scan's own
/// function, so an ERROR there may unwind through it as through C code.
unsafe extern "C-unwind" fn yield_point(
    node: *mut pg_sys::PlanState,
) -> *mut pg_sys::TupleTableSlot {
    let left = COUNTDOWN.get();
    if left <= 1 || asked_to_yield() {
        // SAFETY: the node the executor is running; check_in is a guarded function, it
        // raises errors as PostgreSQL errors.
        unsafe {
            super::runaway::publish_rows(node);
            check_in()
        };
    } else {
        COUNTDOWN.set(left - 1);
    }
    let original = match LAST_LOOKUP.get() {
        (last, original) if last == node as usize => original,
        _ => {
            let original = WRAPPED
                .try_with_borrow(|w| w.get(&(node as usize)).and_then(|x| x.original))
                .flatten();
            if original.is_some() {
                LAST_LOOKUP.set((node as usize, original));
            }
            original
        }
    };
    match original {
        // SAFETY: the function ExecInitNode installed for this node.
        Some(f) => unsafe { f(node) },
        // SAFETY: a guarded function that raises an ERROR.
        None => unsafe { lost_scan_function() },
    }
}

/// A wrapped node whose own function is not known any more: an internal error, never
/// a silently shortened scan.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn lost_scan_function() -> *mut pg_sys::TupleTableSlot {
    pg::raise(
        pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        "pg_stride: a yield point lost the scan function it wraps".into(),
        None,
    );
}
