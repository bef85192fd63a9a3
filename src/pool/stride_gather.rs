//! The custom scans "Stride Gather" and "Stride Gather Merge": in a plan made while
//! `pg_stride.parallel_mode = pool`, each Gather and Gather Merge is replaced by one,
//! so that EXPLAIN shows which parts of a plan the pool may run, and EXPLAIN ANALYZE
//! VERBOSE whether it did.
//!
//! The custom scan keeps the Gather it replaced, without its children, as the first
//! node of `custom_private`. At executor start-up it builds that Gather's state over its
//! own child plan and runs it: the pool's ExecProcNode when the pool takes the Gather
//! (leader.rs), PostgreSQL's ExecGather / ExecGatherMerge otherwise. So a Stride Gather
//! behaves exactly like the Gather it stands for, fallbacks included, and a plan cached
//! with one still runs when `parallel_mode` is changed later.
//!
//! The plan node copies the Gather's costs, initPlans, parameters and target list, whose
//! Vars (OUTER_VAR) name the child's columns, and has the child plan as its `lefttree`
//! too: so EXPLAIN VERBOSE deparses its output exactly as the Gather's, and nodes above
//! it see the same columns. (ExecInitCustomScan builds a projection from that target
//! list, which is never run: the Gather projects.) The state shows the Gather's child
//! as its own `lefttree`, so that EXPLAIN, parameter changes and the executor's walks
//! (shutdown, instrumentation, pg_stride's yield points) reach the child as they would
//! under a Gather.
//!
//! The callbacks run outside pgrx's error boundary, as the executor calls them: their
//! frames hold nothing with a destructor, and they call PostgreSQL through `ffi`.

use super::ffi::*;
use super::port::{exec_proc_node, raise, INTERNAL_ERROR};
use super::shared;
use super::{gathers, tickets};
use crate::plan_tree::{self, STRIDE_GATHER, STRIDE_GATHER_MERGE};
use pgrx::pg_sys;
use std::ffi::c_int;

/// The two kinds, indexes into the method tables.
const GATHER: usize = 0;
const GATHER_MERGE: usize = 1;

/// The methods PostgreSQL reaches through the plan node and the state node. Filled in
/// once by [`register`], in the postmaster, before any process uses them.
// SAFETY: method tables are null pointers and absent callbacks until filled in.
static mut SCAN_METHODS: [pg_sys::CustomScanMethods; 2] = unsafe { std::mem::zeroed() };
// SAFETY: as above.
static mut EXEC_METHODS: [pg_sys::CustomExecMethods; 2] = unsafe { std::mem::zeroed() };

/// The state of a Stride Gather: the custom scan's, and the Gather's it runs.
#[repr(C)]
struct StrideGatherState {
    css: pg_sys::CustomScanState,
    inner: *mut pg_sys::PlanState,
}

/// Fills in the method tables and registers the plan node's methods by name (so that a
/// plan can be read back from its text form). Called from `_PG_init`.
pub fn register() {
    // SAFETY: the postmaster, single-threaded, while it loads libraries; the tables are
    // static, as RegisterCustomScanMethods requires.
    unsafe {
        #[allow(clippy::deref_addrof)]
        let scan = &mut *&raw mut SCAN_METHODS;
        #[allow(clippy::deref_addrof)]
        let exec = &mut *&raw mut EXEC_METHODS;
        for (kind, name) in [(GATHER, STRIDE_GATHER), (GATHER_MERGE, STRIDE_GATHER_MERGE)] {
            scan[kind].CustomName = name.as_ptr();
            scan[kind].CreateCustomScanState = Some(create_state);
            let e = &mut exec[kind];
            e.CustomName = name.as_ptr();
            e.BeginCustomScan = Some(begin);
            e.ExecCustomScan = Some(exec_node);
            e.EndCustomScan = Some(end);
            e.ReScanCustomScan = Some(rescan);
            e.ShutdownCustomScan = Some(shutdown);
            e.ExplainCustomScan = Some(explain);
            pg_sys::RegisterCustomScanMethods(&raw const scan[kind]);
        }
    }
}

// ---------------------------------------------------------------- the planner side

/// Replaces each Gather (but the invisible one of `debug_parallel_query = regress`,
/// which EXPLAIN must not show) and each Gather Merge of `stmt` by a Stride Gather.
/// Called from the planner hook on the plan standard_planner made, in its memory
/// context, when that plan needs parallel mode (a plan without has no Gather).
///
/// # Safety
/// `stmt` is a PlannedStmt the planner has just finished.
pub unsafe fn replace_gathers(stmt: *mut pg_sys::PlannedStmt) {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type.
    unsafe {
        plan_tree::for_each_plan(stmt, &mut |slot| {
            let plan = *slot;
            match (*plan).type_ {
                T_Gather => {
                    let gather = plan.cast::<pg_sys::Gather>();
                    if !(*gather).invisible && (*gather).num_workers > 0 {
                        *slot = stride_gather(plan, GATHER);
                    }
                }
                T_GatherMerge if (*plan.cast::<pg_sys::GatherMerge>()).num_workers > 0 => {
                    *slot = stride_gather(plan, GATHER_MERGE);
                }
                _ => {}
            }
        });
    }
}

/// The size of a Gather or Gather Merge plan node, for the bytewise copies of it that
/// a Stride Gather keeps and runs.
///
/// # Safety
/// `gather` is a Gather or Gather Merge plan node.
unsafe fn gather_size(gather: *const pg_sys::Plan) -> usize {
    // SAFETY: the caller's promise.
    if unsafe { (*gather).type_ } == pg_sys::NodeTag::T_Gather {
        std::mem::size_of::<pg_sys::Gather>()
    } else {
        std::mem::size_of::<pg_sys::GatherMerge>()
    }
}

/// The custom scan for `gather` (see the module comment).
///
/// # Safety
/// `gather` is a finished Gather (GATHER) or Gather Merge (GATHER_MERGE) plan node.
unsafe fn stride_gather(gather: *mut pg_sys::Plan, kind: usize) -> *mut pg_sys::Plan {
    // SAFETY: the caller's promise; nodes are palloc'd in the planner's context, as
    // makeNode does, and a Plan node may be copied bytewise (its lists are shared, and
    // plans are read-only from here on).
    unsafe {
        let cscan =
            pg_sys::palloc0(std::mem::size_of::<pg_sys::CustomScan>()).cast::<pg_sys::CustomScan>();
        let plan = &mut (*cscan).scan.plan;
        *plan = std::ptr::read(gather);
        plan.type_ = pg_sys::NodeTag::T_CustomScan;
        plan.qual = std::ptr::null_mut();
        plan.righttree = std::ptr::null_mut();
        // From 18 on EXPLAIN marks a node "Disabled" when it counts more disabled nodes
        // than its children, and a custom scan's children are its custom_plans.
        #[cfg(feature = "pg18")]
        {
            (*cscan).custom_plans = pg_sys::lappend(std::ptr::null_mut(), plan.lefttree.cast());
        }
        (*cscan).methods = &raw const SCAN_METHODS[kind];

        let size = gather_size(gather);
        let inner = pg_sys::palloc(size).cast::<pg_sys::Plan>();
        std::ptr::copy_nonoverlapping(gather.cast::<u8>(), inner.cast::<u8>(), size);
        (*inner).lefttree = std::ptr::null_mut();
        (*inner).initPlan = std::ptr::null_mut();
        (*cscan).custom_private = pg_sys::lappend(std::ptr::null_mut(), inner.cast());
        cscan.cast()
    }
}

// ---------------------------------------------------------------- the executor side

/// The Gather state a Stride Gather state runs, or `None` for another node.
///
/// # Safety
/// `ps` is a valid PlanState.
pub unsafe fn inner_state(ps: *mut pg_sys::PlanState) -> Option<*mut pg_sys::PlanState> {
    // SAFETY: the caller's promise; only our states have our exec methods.
    unsafe {
        if (*ps).type_ != pg_sys::NodeTag::T_CustomScanState {
            return None;
        }
        let methods = (*ps.cast::<pg_sys::CustomScanState>()).methods;
        let ours = (&raw const EXEC_METHODS).cast::<pg_sys::CustomExecMethods>();
        (methods == ours || methods == ours.add(1))
            .then(|| (*ps.cast::<StrideGatherState>()).inner)
            .filter(|inner| !inner.is_null())
    }
}

unsafe extern "C-unwind" fn create_state(cscan: *mut pg_sys::CustomScan) -> *mut pg_sys::Node {
    // SAFETY: ExecInitCustomScan's plan node, one of ours.
    unsafe {
        let state = palloc0(std::mem::size_of::<StrideGatherState>()).cast::<StrideGatherState>();
        (*state).css.ss.ps.type_ = pg_sys::NodeTag::T_CustomScanState;
        let kind = if (*cscan).methods == &raw const SCAN_METHODS[GATHER] {
            GATHER
        } else {
            GATHER_MERGE
        };
        (*state).css.methods = &raw const EXEC_METHODS[kind];
        state.cast()
    }
}

unsafe extern "C-unwind" fn begin(
    node: *mut pg_sys::CustomScanState,
    estate: *mut pg_sys::EState,
    eflags: c_int,
) {
    // SAFETY: ExecInitCustomScan's state of one of our plan nodes; the Gather node is
    // copied per execution, as plans are read-only.
    unsafe {
        let cscan = (*node).ss.ps.plan.cast::<pg_sys::CustomScan>();
        let Some(stored) = plan_tree::stride_gather_inner(cscan.cast()) else {
            raise(
                INTERNAL_ERROR,
                c"pg_stride: a Stride Gather without its Gather".as_ptr(),
            );
            return;
        };
        let size = gather_size(stored);
        let plan = palloc0(size).cast::<pg_sys::Plan>();
        std::ptr::copy_nonoverlapping(stored.cast::<u8>(), plan.cast::<u8>(), size);
        (*plan).lefttree = (*cscan).scan.plan.lefttree;
        let inner = ExecInitNode(plan, estate, eflags);
        (*node.cast::<StrideGatherState>()).inner = inner;
        let ps = &mut (*node).ss.ps;
        ps.lefttree = (*inner).lefttree;
        ps.ps_ProjInfo = std::ptr::null_mut();
        // SubPlans of the Gather's own projection: EXPLAIN lists them under this node.
        ps.subPlan = (*inner).subPlan;
        // The slots returned are the Gather's, of more than one kind (ExecInitGather).
        ps.resultops = (*inner).resultops;
        ps.resultopsfixed = (*inner).resultopsfixed;
        ps.resultopsset = true;
    }
}

unsafe fn inner_of(node: *mut pg_sys::CustomScanState) -> *mut pg_sys::PlanState {
    // SAFETY: one of our states, begun.
    unsafe { (*node.cast::<StrideGatherState>()).inner }
}

unsafe extern "C-unwind" fn exec_node(
    node: *mut pg_sys::CustomScanState,
) -> *mut pg_sys::TupleTableSlot {
    // SAFETY: the executor's call on our state.
    unsafe { exec_proc_node(inner_of(node)) }
}

unsafe extern "C-unwind" fn end(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above.
    unsafe { ExecEndNode(inner_of(node)) }
}

unsafe extern "C-unwind" fn rescan(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above. ExecReScan of this node has already passed the changed
    // parameters on to the child, which is the Gather's too.
    unsafe {
        let inner = inner_of(node);
        ExecReScan(inner);
        gathers::rescanned(inner);
    }
}

unsafe extern "C-unwind" fn shutdown(node: *mut pg_sys::CustomScanState) {
    // SAFETY: as above; ExecShutdownNode has shut the child down first, as for a Gather.
    unsafe {
        let inner = inner_of(node);
        if inner.is_null() {
            return;
        }
        // A round the Gather ended early (a LIMIT met) ends before PostgreSQL's shutdown
        // of the Gather: that waits only for its own workers (none in a pool round) and
        // then frees the parameters sent to the workers, which a pool worker that has
        // not started its fragment yet would read freed.
        let pg = gathers::lookup(inner);
        if let (false, Some(pool)) = (pg.is_null(), shared::shared()) {
            tickets::wait_round(pool, pg, false, false);
        }
        if (*inner).type_ == pg_sys::NodeTag::T_GatherState {
            ExecShutdownGather(inner.cast());
        } else {
            ExecShutdownGatherMerge(inner.cast());
        }
    }
}

/// What EXPLAIN shows for a Gather or Gather Merge (explain.c), and, with ANALYZE and
/// VERBOSE, whether the pool ran it.
unsafe extern "C-unwind" fn explain(
    node: *mut pg_sys::CustomScanState,
    _ancestors: *mut pg_sys::List,
    es: *mut pg_sys::ExplainState,
) {
    // SAFETY: as above; the ExplainState of the EXPLAIN being printed.
    unsafe {
        let inner = inner_of(node);
        let plan = (*inner).plan;
        let (planned, launched, init_param, single_copy) =
            if (*plan).type_ == pg_sys::NodeTag::T_Gather {
                let gather = plan.cast::<pg_sys::Gather>();
                (
                    (*gather).num_workers,
                    (*inner.cast::<pg_sys::GatherState>()).nworkers_launched,
                    (*gather).initParam,
                    Some((*gather).single_copy),
                )
            } else {
                let gm = plan.cast::<pg_sys::GatherMerge>();
                (
                    (*gm).num_workers,
                    (*inner.cast::<pg_sys::GatherMergeState>()).nworkers_launched,
                    (*gm).initParam,
                    None,
                )
            };
        ExplainPropertyInteger(
            c"Workers Planned".as_ptr(),
            std::ptr::null(),
            planned as i64,
            es,
        );
        // Up to 16 EXPLAIN names the parameters the node evaluates.
        #[cfg(feature = "pg15")]
        if !init_param.is_null() {
            let mut params = std::ptr::null_mut();
            let mut id = -1;
            loop {
                id = bms_next_member(init_param, id);
                if id < 0 {
                    break;
                }
                params = lappend(params, psprintf(c"$%d".as_ptr(), id).cast());
            }
            if !params.is_null() {
                ExplainPropertyList(c"Params Evaluated".as_ptr(), params, es);
            }
        }
        #[cfg(not(feature = "pg15"))]
        let _ = init_param;
        if (*es).analyze {
            ExplainPropertyInteger(
                c"Workers Launched".as_ptr(),
                std::ptr::null(),
                launched as i64,
                es,
            );
        }
        if let Some(single_copy) = single_copy {
            if single_copy || (*es).format != pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT {
                ExplainPropertyBool(c"Single Copy".as_ptr(), single_copy, es);
            }
        }
        if (*es).analyze && (*es).verbose {
            ExplainPropertyText(c"Pool".as_ptr(), gathers::describe_pool_use(inner), es);
        }
    }
}
