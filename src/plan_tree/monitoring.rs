//! Which statements are monitoring queries, never queued nor paused (docs/design.md §4
//! rule 4).

use super::walk::{for_each_plan, list_ptrs};
use pgrx::pg_sys;
use std::ffi::CStr;

/// Whether `stmt` only reads: a SELECT that locks no rows (no FOR UPDATE / FOR SHARE)
/// and has no data-modifying WITH. Only such a statement may be paused (docs/design.md
/// §4 rule 2) or be a monitoring query.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn reads_only(stmt: *const pg_sys::PlannedStmt) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        (*stmt).commandType == pg_sys::CmdType::CMD_SELECT
            && !(*stmt).hasModifyingCTE
            && (*stmt).rowMarks.is_null()
    }
}

/// Whether `stmt` is a monitoring query, which pg_stride never queues nor pauses
/// (docs/design.md §4 rule 4): a plain SELECT without FROM that calls monitoring
/// built-ins ([`is_monitoring_built_in`]) of constants, or one that reads at least one
/// relation or function and only these — relations of the system catalogs (views such
/// as `pg_stat_activity` included) or of schema `own_schema` (pg_stride's views and
/// groups table), monitoring built-ins, functions of `own_schema` — and that calls no
/// other user-defined function anywhere in the plan (the planner records a dependency on
/// each one it calls, `PlannedStmt.invalItems`). `own_schema` gives pg_stride's schema
/// and is asked whenever a relation or function is not a built-in one, so it should be
/// cheap (`src/monitoring.rs` keeps it); `relation_schema` gives a relation's schema
/// (InvalidOid for one that is gone).
///
/// # Safety
/// `stmt` is a valid PlannedStmt. Catalog lookups may raise an ERROR: call it inside a
/// guarded function.
#[inline]
pub unsafe fn is_monitoring_query(
    stmt: *const pg_sys::PlannedStmt,
    own_schema: impl Fn() -> pg_sys::Oid,
    relation_schema: impl Fn(pg_sys::Oid) -> pg_sys::Oid,
) -> bool {
    // Split so that a write, most of an OLTP application's statements, is told by the
    // caller's inlined first test, without a call.
    // SAFETY: the caller's promise.
    unsafe { reads_only(stmt) && reads_only_monitoring(stmt, own_schema, relation_schema) }
}

/// [`is_monitoring_query`] for a statement that [`reads_only`].
///
/// # Safety
/// As [`is_monitoring_query`].
#[inline(never)]
unsafe fn reads_only_monitoring(
    stmt: *const pg_sys::PlannedStmt,
    own_schema: impl Fn() -> pg_sys::Oid,
    relation_schema: impl Fn(pg_sys::Oid) -> pg_sys::Oid,
) -> bool {
    use pg_sys::RTEKind::*;
    // Objects created by initdb (the catalogs, their views and built-in functions) have
    // OIDs below this; CREATE EXTENSION's above.
    let built_in = |oid: pg_sys::Oid| u32::from(oid) < pg_sys::FirstNormalObjectId;
    // SAFETY: the caller's promise; a PlannedStmt's rtable is a List of RangeTblEntry,
    // an RTE_FUNCTION's functions a List of RangeTblFunction, invalItems a List of
    // PlanInvalItem; lsyscache lookups return InvalidOid or NULL for what is missing.
    unsafe {
        // Asked only when a relation or function is not a built-in one (the caller
        // keeps the answer between statements).
        let in_own_schema =
            |namespace: pg_sys::Oid| namespace != pg_sys::InvalidOid && namespace == own_schema();
        let mut reads = false;
        let mut own_functions: Vec<pg_sys::Oid> = Vec::new();
        for rte in list_ptrs::<pg_sys::RangeTblEntry>((*stmt).rtable) {
            match (*rte).rtekind {
                RTE_RELATION => {
                    let relid = (*rte).relid;
                    if !built_in(relid) && !in_own_schema(relation_schema(relid)) {
                        return false;
                    }
                    reads = true;
                }
                // Its functions are in its Function Scan (the flat rtable drops them).
                RTE_FUNCTION => reads = true,
                RTE_TABLEFUNC | RTE_NAMEDTUPLESTORE => return false,
                _ => {}
            }
        }
        if !reads {
            // No relation and no function in FROM: a monitoring call such as
            // `SELECT pg_is_in_recovery()` or `SELECT pg_current_wal_lsn()`.
            return calls_only_monitoring_functions((*stmt).planTree);
        }
        let mut scans_allowed = true;
        for_each_plan(stmt.cast_mut(), &mut |plan| {
            let plan = *plan;
            if plan.is_null() || !scans_allowed {
                return;
            }
            match (*plan).type_ {
                pg_sys::NodeTag::T_FunctionScan => {
                    let scan = plan.cast::<pg_sys::FunctionScan>();
                    for f in list_ptrs::<pg_sys::RangeTblFunction>((*scan).functions) {
                        match monitoring_function((*f).funcexpr, &in_own_schema) {
                            Some(Some(own)) => own_functions.push(own),
                            Some(None) => {}
                            None => scans_allowed = false,
                        }
                    }
                }
                pg_sys::NodeTag::T_TableFuncScan => scans_allowed = false,
                _ => {}
            }
        });
        if !scans_allowed {
            return false;
        }
        let allowed: Vec<u32> = own_functions
            .iter()
            .map(|&f| {
                pg_sys::GetSysCacheHashValue(
                    pg_sys::SysCacheIdentifier::PROCOID as i32,
                    pg_sys::Datum::from(f),
                    pg_sys::Datum::from(0),
                    pg_sys::Datum::from(0),
                    pg_sys::Datum::from(0),
                )
            })
            .collect();
        list_ptrs::<pg_sys::PlanInvalItem>((*stmt).invalItems).all(|item| {
            (*item).cacheId != pg_sys::SysCacheIdentifier::PROCOID as i32
                || allowed.contains(&(*item).hashValue)
        })
    }
}

/// Whether `funcexpr`, a function in FROM, may be read by a monitoring query: one whose
/// schema is pg_stride's (`in_own_schema`; `Some(Some(oid))`: its calls are allowed in the plan's
/// dependencies), or a monitoring built-in (`Some(None)`, [`is_monitoring_built_in`]);
/// `None` otherwise.
///
/// # Safety
/// `funcexpr` is null or a valid expression node; inside a guarded function.
unsafe fn monitoring_function(
    funcexpr: *mut pg_sys::Node,
    in_own_schema: &dyn Fn(pg_sys::Oid) -> bool,
) -> Option<Option<pg_sys::Oid>> {
    // SAFETY: the caller's promise; lsyscache lookups return InvalidOid for what is
    // missing.
    unsafe {
        if funcexpr.is_null() || (*funcexpr).type_ != pg_sys::NodeTag::T_FuncExpr {
            return None;
        }
        let funcid = (*funcexpr.cast::<pg_sys::FuncExpr>()).funcid;
        if in_own_schema(pg_sys::get_func_namespace(funcid)) {
            return Some(Some(funcid));
        }
        is_monitoring_built_in(funcid).then_some(None)
    }
}

/// Whether `plan` is a Result that calls monitoring built-ins
/// ([`is_monitoring_built_in`]) of constants and parameters, and computes nothing else.
///
/// # Safety
/// `plan` is a valid Plan; inside a guarded function (catalog lookups).
unsafe fn calls_only_monitoring_functions(plan: *const pg_sys::Plan) -> bool {
    // SAFETY: the caller's promise; a Result's targetlist is a List of TargetEntry.
    unsafe {
        if plan.is_null()
            || (*plan).type_ != pg_sys::NodeTag::T_Result
            || !(*plan).lefttree.is_null()
            || !(*plan.cast::<pg_sys::Result>()).resconstantqual.is_null()
        {
            return false;
        }
        // At least one call: `SELECT 1` and its like stay scheduled like any statement.
        let targets = || list_ptrs::<pg_sys::TargetEntry>((*plan).targetlist);
        let calls = targets()
            .any(|t| (*(*t).expr.cast::<pg_sys::Node>()).type_ == pg_sys::NodeTag::T_FuncExpr);
        let only = targets().all(|t| is_monitoring_call((*t).expr.cast()));
        calls && only
    }
}

/// Whether `node` is a constant, a parameter, or a call of a monitoring built-in whose
/// arguments are such nodes.
///
/// # Safety
/// `node` is null or a valid expression node; inside a guarded function.
unsafe fn is_monitoring_call(node: *const pg_sys::Node) -> bool {
    // SAFETY: the caller's promise; a node's tag tells its type, a FuncExpr's args are a
    // List of expression nodes.
    unsafe {
        if node.is_null() {
            return false;
        }
        match (*node).type_ {
            pg_sys::NodeTag::T_Const | pg_sys::NodeTag::T_Param => true,
            pg_sys::NodeTag::T_FuncExpr => {
                let f = node.cast::<pg_sys::FuncExpr>();
                if !is_monitoring_built_in((*f).funcid) {
                    return false;
                }
                list_ptrs::<pg_sys::Node>((*f).args).all(|a| is_monitoring_call(a))
            }
            _ => false,
        }
    }
}

/// Built-in functions whose names begin with `pg_` but that wait or take locks: a
/// statement calling them is scheduled like any other.
const WAITING_BUILT_INS: [&[u8]; 3] = [b"pg_sleep", b"pg_advisory", b"pg_try_advisory"];

/// Built-in functions not named `pg_*` that monitoring tools call (the exporter asks
/// `version()` at every scrape).
const MONITORING_BUILT_INS: [&[u8]; 1] = [b"version"];

/// Whether function `funcid` is a built-in one named `pg_*` (the functions under the
/// statistics views, `pg_is_in_recovery`, `pg_database_size`, …) that neither waits nor
/// takes locks, or one of [`MONITORING_BUILT_INS`].
///
/// # Safety
/// Inside a guarded function (a catalog lookup).
unsafe fn is_monitoring_built_in(funcid: pg_sys::Oid) -> bool {
    if u32::from(funcid) >= pg_sys::FirstNormalObjectId {
        return false;
    }
    // SAFETY: get_func_name returns NULL or a palloc'd NUL-terminated name.
    unsafe {
        let name = pg_sys::get_func_name(funcid);
        if name.is_null() {
            return false;
        }
        let name = CStr::from_ptr(name).to_bytes();
        (name.starts_with(b"pg_") && !WAITING_BUILT_INS.iter().any(|p| name.starts_with(p)))
            || MONITORING_BUILT_INS.contains(&name)
    }
}
