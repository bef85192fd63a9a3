//! What a plan reads and calls, as the monitoring check needs it (`src/monitoring.rs`
//! composes the rule, docs/design.md §4 rule 4, with its catalog lookups), and whether a
//! statement only reads (rule 2).

use super::walk::{for_each_expression, for_each_plan, list_ptrs};
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

/// Built-in functions (by the start of their names) that wait, take locks, or run user
/// code or SQL of their own (a domain's check, PostgreSQL 16's input validation, the
/// query or table the `…_to_xml` family, `ts_stat` and `ts_rewrite` are given): a
/// statement calling them anywhere is scheduled like any other. The SQL they run is
/// nested in the statement, which is where admission and CPU scheduling see it.
const SCHEDULED_BUILT_INS: [&[u8]; 15] = [
    b"pg_sleep",
    b"pg_advisory",
    b"pg_try_advisory",
    b"pg_input_",
    // Logical decoding, which decodes WAL for as long as there is some.
    b"pg_logical_slot_",
    b"pg_replication_slot_advance",
    b"pg_create_logical_replication_slot",
    b"pg_copy_logical_replication_slot",
    b"query_to_xml",
    b"cursor_to_xml",
    b"table_to_xml",
    b"schema_to_xml",
    b"database_to_xml",
    b"ts_stat",
    b"ts_rewrite",
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
        (name.starts_with(b"pg_") && !is_scheduled_name(name))
            || MONITORING_BUILT_INS.contains(&name)
    }
}

/// Whether a built-in function named `name` is one of [`SCHEDULED_BUILT_INS`].
fn is_scheduled_name(name: &[u8]) -> bool {
    SCHEDULED_BUILT_INS.iter().any(|p| name.starts_with(p))
}

/// The input functions that read a value into a type their call names (by OID), a
/// user-defined one too, its domains' checks included: called by name, as functions.
/// (A cast runs the input function of its result type, a built-in one here, or the
/// result type is a user's, refused as such.)
const TYPE_INPUT_BUILT_INS: [u32; 8] = [
    pg_sys::F_RECORD_IN,
    pg_sys::F_RECORD_RECV,
    pg_sys::F_DOMAIN_IN,
    pg_sys::F_DOMAIN_RECV,
    pg_sys::F_ARRAY_IN,
    pg_sys::F_ARRAY_RECV,
    pg_sys::F_RANGE_IN,
    pg_sys::F_RANGE_RECV,
];

/// Whether no expression anywhere in `stmt`'s plan calls a built-in function of
/// [`SCHEDULED_BUILT_INS`] (as a function, an operator's, an aggregate's or a cast's),
/// nor checks a user-defined domain (whose CHECK may call any function; the plan's
/// dependencies name the domain, not the function) or reads a value into a user-defined
/// type through its input function (a row type with a domain column checks it). The
/// user-defined functions a plan calls are in its dependencies
/// ([`calls_no_function_but`]); built-in ones are not, so the plan's expressions are
/// walked, node by node: a plan node whose expressions this does not know (one a later
/// release adds, a foreign or another extension's custom scan) answers false.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; inside a guarded function (catalog lookups).
pub unsafe fn calls_no_scheduled_built_in(stmt: *const pg_sys::PlannedStmt) -> bool {
    let mut clean = true;
    // SAFETY: the caller's promise.
    unsafe {
        for_each_plan(stmt.cast_mut(), &mut |plan| {
            clean = clean && plan_is_clean(*plan);
        });
    }
    clean
}

/// [`calls_no_scheduled_built_in`] of one plan node's own expressions and initPlans
/// (their arguments; their plans are the statement's subplans), and of the bitmap scans
/// under a BitmapAnd or BitmapOr, which `for_each_plan` does not visit.
///
/// # Safety
/// `plan` is null or a valid Plan node of a finished plan; inside a guarded function.
unsafe fn plan_is_clean(plan: *const pg_sys::Plan) -> bool {
    use pg_sys::NodeTag::*;
    if plan.is_null() {
        return true;
    }
    let mut clean = true;
    // SAFETY: the caller's promise; a BitmapAnd's or BitmapOr's bitmapplans are Plans,
    // a Plan's initPlan a List of SubPlans.
    unsafe {
        let known = for_each_expression(plan, &mut |e| clean = clean && expr_is_clean(e));
        let bitmaps = match (*plan).type_ {
            T_BitmapAnd => (*plan.cast::<pg_sys::BitmapAnd>()).bitmapplans,
            T_BitmapOr => (*plan.cast::<pg_sys::BitmapOr>()).bitmapplans,
            _ => std::ptr::null_mut(),
        };
        known
            && clean
            && expr_is_clean((*plan).initPlan.cast())
            && list_ptrs::<pg_sys::Plan>(bitmaps).all(|p| plan_is_clean(p))
            // Partition pruning's expressions are not looked at: a monitoring query
            // reads no partitioned table.
            && !(matches!((*plan).type_, T_Append | T_MergeAppend) && prunes(plan))
    }
}

/// Whether the Append or MergeAppend `plan` prunes partitions as it runs.
///
/// # Safety
/// `plan` is a valid Append or MergeAppend node.
unsafe fn prunes(plan: *const pg_sys::Plan) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        #[cfg(feature = "pg18")]
        let index = match (*plan).type_ {
            pg_sys::NodeTag::T_Append => (*plan.cast::<pg_sys::Append>()).part_prune_index,
            _ => (*plan.cast::<pg_sys::MergeAppend>()).part_prune_index,
        };
        #[cfg(feature = "pg18")]
        return index >= 0;
        #[cfg(not(feature = "pg18"))]
        let info = match (*plan).type_ {
            pg_sys::NodeTag::T_Append => (*plan.cast::<pg_sys::Append>()).part_prune_info,
            _ => (*plan.cast::<pg_sys::MergeAppend>()).part_prune_info,
        };
        #[cfg(not(feature = "pg18"))]
        return !info.is_null();
    }
}

/// Whether the expression `node` (or List of them) holds none of what
/// [`calls_no_scheduled_built_in`] looks for.
///
/// # Safety
/// `node` is null or a valid expression node (or List) of a finished plan; inside a
/// guarded function.
unsafe fn expr_is_clean(node: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's promise.
    !unsafe { finds_scheduled_work(node, std::ptr::null_mut()) }
}

/// expression_tree_walker's callback: whether `node` or a node under it calls a function
/// of [`SCHEDULED_BUILT_INS`], or makes a value of a user-defined type (a cast to a
/// domain checks it; a row or a constant of a user type given to a built-in such as
/// `jsonb_populate_record` has its domain columns checked): a query over the catalogs
/// has no other way to one. expression_tree_walker walks a SubPlan's arguments, not its
/// plan (that is one of the statement's subplans, walked on its own). Called from C: an
/// ERROR in the guarded calls (a catalog lookup) unwinds through it as a Rust panic, as
/// through the plan walks of `memory.rs`.
unsafe extern "C-unwind" fn finds_scheduled_work(
    node: *mut pg_sys::Node,
    context: *mut std::ffi::c_void,
) -> bool {
    use pg_sys::NodeTag::*;
    if node.is_null() {
        return false;
    }
    let user_type = |t: pg_sys::Oid| u32::from(t) >= pg_sys::FirstNormalObjectId;
    // SAFETY: expression_tree_walker passes nodes of the tree; a node's tag tells its
    // type; check_functions_in_node calls back with the OIDs of the functions the node
    // itself calls.
    unsafe {
        let found = match (*node).type_ {
            T_CoerceToDomain => user_type((*node.cast::<pg_sys::CoerceToDomain>()).resulttype),
            T_CoerceViaIO => user_type((*node.cast::<pg_sys::CoerceViaIO>()).resulttype),
            T_ArrayCoerceExpr => user_type((*node.cast::<pg_sys::ArrayCoerceExpr>()).resulttype),
            T_RelabelType => user_type((*node.cast::<pg_sys::RelabelType>()).resulttype),
            T_Const => user_type((*node.cast::<pg_sys::Const>()).consttype),
            T_RowExpr => user_type((*node.cast::<pg_sys::RowExpr>()).row_typeid),
            T_FuncExpr => {
                let f = node.cast::<pg_sys::FuncExpr>();
                user_type((*f).funcresulttype)
                    || TYPE_INPUT_BUILT_INS.contains(&(*f).funcid.to_u32())
            }
            _ => false,
        };
        found
            || pg_sys::check_functions_in_node(node, Some(is_scheduled_built_in), context)
            || pg_sys::expression_tree_walker(node, Some(finds_scheduled_work), context)
    }
}

/// check_functions_in_node's callback: whether `funcid` is a built-in function of
/// [`SCHEDULED_BUILT_INS`]. Called from C, as above.
unsafe extern "C-unwind" fn is_scheduled_built_in(
    funcid: pg_sys::Oid,
    _context: *mut std::ffi::c_void,
) -> bool {
    if u32::from(funcid) >= pg_sys::FirstNormalObjectId {
        return false;
    }
    // SAFETY: get_func_name returns NULL or a palloc'd NUL-terminated name.
    unsafe {
        let name = pg_sys::get_func_name(funcid);
        !name.is_null() && is_scheduled_name(CStr::from_ptr(name).to_bytes())
    }
}
