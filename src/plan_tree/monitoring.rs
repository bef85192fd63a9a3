//! What a plan reads and calls, as the monitoring check needs it (`src/monitoring.rs`
//! composes the rule, docs/design.md §4 rule 4, with its catalog lookups), and whether a
//! statement only reads (rule 2).

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

/// One entry of a read-only statement's range table, as the monitoring check sees it
/// (`src/monitoring.rs`).
pub enum FromItem {
    /// A relation (a table, a view, a catalog), by OID.
    Relation(pg_sys::Oid),
    /// Functions in FROM; they are in the plan's Function Scans ([`from_functions`]).
    Functions,
    /// A table function, a named tuplestore or a recursive WITH's reference to itself:
    /// never part of a monitoring query (the planner prices a recursive WITH at 10
    /// rounds, whatever it runs, so the cost bound cannot bound it).
    Excluded,
}

/// The entries of `stmt`'s range table that the monitoring check looks at, in order;
/// the other kinds (joins, subqueries, values, CTEs, …) are left out: the relations
/// below them have entries of their own, and the user-defined functions they call are
/// in the plan's dependencies ([`calls_no_function_but`]).
///
/// # Safety
/// `stmt` and its range table stay valid and unchanged while the iterator is used.
pub unsafe fn from_items(stmt: *const pg_sys::PlannedStmt) -> impl Iterator<Item = FromItem> {
    use pg_sys::RTEKind::*;
    // SAFETY: the caller's promise; a PlannedStmt's rtable is a List of RangeTblEntry.
    unsafe {
        list_ptrs::<pg_sys::RangeTblEntry>((*stmt).rtable).filter_map(|rte| {
            match (*rte).rtekind {
                RTE_RELATION => Some(FromItem::Relation((*rte).relid)),
                // Its functions are in its Function Scan (the flat rtable drops them).
                RTE_FUNCTION => Some(FromItem::Functions),
                RTE_TABLEFUNC | RTE_NAMEDTUPLESTORE => Some(FromItem::Excluded),
                RTE_CTE if (*rte).self_reference => Some(FromItem::Excluded),
                _ => None,
            }
        })
    }
}

/// The functions that `stmt`'s Function Scans call, or `None` if one of them scans
/// anything other than a plain function call (a `FuncExpr`: not a constant the planner
/// folded it to, say) or the plan has a Table Function Scan.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn from_functions(stmt: *const pg_sys::PlannedStmt) -> Option<Vec<pg_sys::Oid>> {
    let mut functions = Vec::new();
    let mut plain = true;
    // SAFETY: the caller's promise; a Function Scan's functions are a List of
    // RangeTblFunction, whose funcexpr is an expression node.
    unsafe {
        for_each_plan(stmt.cast_mut(), &mut |plan| {
            let plan = *plan;
            if plan.is_null() || !plain {
                return;
            }
            match (*plan).type_ {
                pg_sys::NodeTag::T_FunctionScan => {
                    let scan = plan.cast::<pg_sys::FunctionScan>();
                    for f in list_ptrs::<pg_sys::RangeTblFunction>((*scan).functions) {
                        let expr = (*f).funcexpr;
                        if expr.is_null() || (*expr).type_ != pg_sys::NodeTag::T_FuncExpr {
                            plain = false;
                        } else {
                            functions.push((*expr.cast::<pg_sys::FuncExpr>()).funcid);
                        }
                    }
                }
                pg_sys::NodeTag::T_TableFuncScan => plain = false,
                _ => {}
            }
        });
    }
    plain.then_some(functions)
}

/// Whether every function `stmt` calls anywhere in its plan is one of `allowed`, or a
/// built-in one: the planner records a dependency on each user-defined function it
/// calls (`PlannedStmt.invalItems`).
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn calls_no_function_but(
    stmt: *const pg_sys::PlannedStmt,
    allowed: &[pg_sys::Oid],
) -> bool {
    // SAFETY: the caller's promise; invalItems is a List of PlanInvalItem, whose hash
    // values are the syscache's for the function's OID.
    unsafe {
        let allowed: Vec<u32> = allowed
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

/// Whether `plan` is a Result that calls monitoring built-ins
/// ([`is_monitoring_built_in`]) of constants and parameters, and computes nothing else.
///
/// # Safety
/// `plan` is a valid Plan; inside a guarded function (catalog lookups).
pub unsafe fn calls_only_monitoring_functions(plan: *const pg_sys::Plan) -> bool {
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

/// Built-in functions whose names begin with `pg_` but that wait, take locks, or run
/// user code (a domain's check, PostgreSQL 16's input validation): a statement calling
/// them is scheduled like any other.
const SCHEDULED_PG_BUILT_INS: [&[u8]; 4] = [
    b"pg_sleep",
    b"pg_advisory",
    b"pg_try_advisory",
    b"pg_input_",
];

/// Built-in functions not named `pg_*` that monitoring tools call (the exporter asks
/// `version()` at every scrape).
const MONITORING_BUILT_INS: [&[u8]; 1] = [b"version"];

/// Whether function `funcid` is a built-in one named `pg_*` (the functions under the
/// statistics views, `pg_is_in_recovery`, `pg_database_size`, …) that neither waits,
/// takes locks nor runs user code, or one of [`MONITORING_BUILT_INS`].
///
/// # Safety
/// Inside a guarded function (a catalog lookup).
pub unsafe fn is_monitoring_built_in(funcid: pg_sys::Oid) -> bool {
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
        (name.starts_with(b"pg_") && !SCHEDULED_PG_BUILT_INS.iter().any(|p| name.starts_with(p)))
            || MONITORING_BUILT_INS.contains(&name)
    }
}
