//! Whether a read's or a write's plan does no more than its cost says, as a statement too
//! small to admit needs it (`statements::runs_unadmitted`, docs/design.md §4 rule 4). A planner cost
//! bounds a plan's work only when the plan reads relations through the executor's own
//! nodes and evaluates nothing that can take long by itself. So the check is an
//! allowlist, of plan nodes and of expression nodes: a node of a kind not named here —
//! one a later PostgreSQL release adds, a function in FROM, a set-returning function, a
//! subplan, a domain's check, a foreign or custom scan — makes the plan not small. A
//! function called by name (`pg_sleep(…)`, `query_to_xml(…)`, `lower(…)`) does too,
//! built-in or not, but for the few quick built-ins that columns' defaults call
//! ([`QUICK_BUILT_INS`]: `now()`, `nextval(…)`, …); casts and aggregates are built-in
//! ones (the planner records every user-defined function a plan calls in `invalItems`,
//! which must be empty), and so are operators, by their own OID: a user-defined
//! operator over a built-in function is recorded nowhere.
//!
//! Plain reads of plan memory, which cannot fail: the ExecutorStart hook asks outside
//! pgrx's error boundary.

use super::walk::{list_len, list_nth, list_nth_int, list_ptrs};
use pgrx::pg_sys;

/// How deep the walks go before they give up (and answer "not small"): an OLTP plan is
/// a few nodes deep, and a deeper one is not worth telling apart.
const MAX_DEPTH: u32 = 32;

/// Built-in functions that take next to no time whatever their arguments, called by name
/// in the defaults of a table's columns: the clock, a sequence's values, a random UUID.
const QUICK_BUILT_INS: [u32; 7] = [
    pg_sys::F_NOW,
    pg_sys::F_STATEMENT_TIMESTAMP,
    pg_sys::F_TRANSACTION_TIMESTAMP,
    pg_sys::F_CLOCK_TIMESTAMP,
    pg_sys::F_NEXTVAL,
    pg_sys::F_CURRVAL,
    pg_sys::F_GEN_RANDOM_UUID,
];

/// Whether `stmt` reads relations and does no more than its plan's cost says: at least
/// one relation, none of them foreign or sampled; no function, VALUES list, CTE or
/// tuplestore in FROM; no user-defined function or domain anywhere (`invalItems`); no
/// subplan; and only allowlisted plan and expression nodes (see the module comment).
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn is_plain_read(stmt: *const pg_sys::PlannedStmt) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        (*stmt).invalItems.is_null()
            && (*stmt).subplans.is_null()
            && reads_relations_only((*stmt).rtable)
            && (is_plain_lookup((*stmt).planTree) || plain_plan((*stmt).planTree, 0))
    }
}

/// The table an INSERT, UPDATE or DELETE `stmt` writes, with the command and whether it
/// may also update the rows it conflicts with (INSERT … ON CONFLICT DO UPDATE, which
/// fires the table's UPDATE triggers too), when its plan does no more than its cost says
/// apart from what that table does for each row written (its triggers, constraints and
/// index entries, which are not in the plan: the caller looks at them). One plain table
/// (not partitioned, not foreign, not a view, whose range-table entry says so), no
/// data-modifying WITH, row marks, security-barrier checks or MERGE actions; its
/// subplan, RETURNING list and ON CONFLICT expressions are as plain as
/// [`is_plain_read`] asks of a read.
///
/// # Safety
/// `stmt` is a valid PlannedStmt.
pub unsafe fn plain_write_target(
    stmt: *const pg_sys::PlannedStmt,
) -> Option<(pg_sys::Oid, pg_sys::CmdType::Type, bool)> {
    use pg_sys::CmdType::*;
    // SAFETY: the caller's promise; a ModifyTable's resultRelations is an integer List
    // of range-table indexes (from 1), and its other fields named here are lists of
    // expression nodes, or single ones.
    unsafe {
        let op = (*stmt).commandType;
        let plan = (*stmt).planTree;
        if !matches!(op, CMD_INSERT | CMD_UPDATE | CMD_DELETE)
            || (*stmt).hasModifyingCTE
            || !(*stmt).rowMarks.is_null()
            || !(*stmt).invalItems.is_null()
            || !(*stmt).subplans.is_null()
            || plan.is_null()
            || (*plan).type_ != pg_sys::NodeTag::T_ModifyTable
        {
            return None;
        }
        let modify = plan.cast::<pg_sys::ModifyTable>();
        let rtable = (*stmt).rtable;
        let targets = (*modify).resultRelations;
        let sub = (*plan).lefttree;
        let plain = (*modify).operation == op
            && (*modify).rootRelation == 0
            && list_len(targets) == 1
            && (*modify).withCheckOptionLists.is_null()
            && (*modify).mergeActionLists.is_null()
            && (*plan).initPlan.is_null()
            && (*plan).qual.is_null()
            && (*plan).righttree.is_null()
            && !sub.is_null()
            && reads_relations_only(rtable)
            && plain_exprs((*plan).targetlist, 0)
            && plain_exprs((*modify).returningLists, 0)
            && plain_exprs((*modify).onConflictSet, 0)
            && ((*modify).onConflictWhere.is_null() || plain_expr((*modify).onConflictWhere, 0))
            && (is_plain_lookup(sub) || plain_plan(sub, 1));
        if !plain {
            return None;
        }
        let index = usize::try_from(list_nth_int(targets, 0)).ok()?;
        if index == 0 || index > list_len(rtable) {
            return None;
        }
        let rte = list_nth::<pg_sys::RangeTblEntry>(rtable, index - 1);
        let upserts = (*modify).onConflictAction == pg_sys::OnConflictAction::ONCONFLICT_UPDATE;
        ((*rte).rtekind == pg_sys::RTEKind::RTE_RELATION
            && (*rte).relkind as u8 == pg_sys::RELKIND_RELATION)
            .then_some(((*rte).relid, op, upserts))
    }
}

/// The shape of most OLTP reads, told inline, without the general walk's calls (which
/// cost a primary-key lookup more than the rest of what pg_stride does for it): one index,
/// index-only or sequential scan, under at most a Limit of values, whose target list
/// holds values and whose conditions are operators over values. A subset of what
/// [`plain_plan`] accepts; any other plan goes to it.
///
/// # Safety
/// `plan` is null or a valid Plan node of a finished plan.
#[inline(always)]
unsafe fn is_plain_lookup(mut plan: *const pg_sys::Plan) -> bool {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type, whose fields named here
    // are lists of expression nodes, or single ones.
    unsafe {
        if plan.is_null() {
            return false;
        }
        if (*plan).type_ == T_Limit {
            let limit = plan.cast::<pg_sys::Limit>();
            let (offset, count) = ((*limit).limitOffset, (*limit).limitCount);
            if !(offset.is_null() || is_value(offset))
                || !(count.is_null() || is_value(count))
                || !(*plan).initPlan.is_null()
                || !(*plan).qual.is_null()
                || !(*plan).righttree.is_null()
            {
                return false;
            }
            plan = (*plan).lefttree;
            if plan.is_null() {
                return false;
            }
        }
        let conditions = match (*plan).type_ {
            T_IndexScan => {
                let scan = plan.cast::<pg_sys::IndexScan>();
                (*scan).indexorderby.is_null() && operators_over_values((*scan).indexqual)
            }
            T_IndexOnlyScan => {
                let scan = plan.cast::<pg_sys::IndexOnlyScan>();
                (*scan).indexorderby.is_null()
                    && operators_over_values((*scan).indexqual)
                    && operators_over_values((*scan).recheckqual)
            }
            T_SeqScan => true,
            _ => false,
        };
        conditions
            && (*plan).initPlan.is_null()
            && (*plan).lefttree.is_null()
            && (*plan).righttree.is_null()
            && operators_over_values((*plan).qual)
            && simple_targets((*plan).targetlist)
    }
}

/// Whether every entry of the target list `targets` is a column, a constant, a parameter
/// or an operator over those ([`is_simple`]).
///
/// # Safety
/// `targets` is a List of TargetEntry nodes of a finished plan.
#[inline(always)]
unsafe fn simple_targets(targets: *mut pg_sys::List) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        for i in 0..list_len(targets) {
            let expr = (*list_nth::<pg_sys::TargetEntry>(targets, i)).expr;
            if expr.is_null() || !is_simple(expr.cast()) {
                return false;
            }
        }
    }
    true
}

/// Whether every expression of `list` is an operator (not a set-returning one) over
/// columns, constants and parameters.
///
/// # Safety
/// `list` is a List of expression nodes of a finished plan.
#[inline(always)]
unsafe fn operators_over_values(list: *mut pg_sys::List) -> bool {
    // SAFETY: the caller's promise. Plain loops over the elements: iterator adaptors
    // here cost a lookup more than the rest of its check.
    unsafe {
        for i in 0..list_len(list) {
            if !is_operator_over_values(list_nth(list, i)) {
                return false;
            }
        }
    }
    true
}

/// Whether operator `opno` is one of initdb's. The plan's dependencies (`invalItems`)
/// name the user-defined functions it calls, not the operators: a user-defined operator
/// may call a built-in function that waits or runs SQL (`pg_sleep`, `ts_rewrite`).
#[inline(always)]
fn is_built_in_operator(opno: pg_sys::Oid) -> bool {
    u32::from(opno) < pg_sys::FirstNormalObjectId
}

/// Whether `node` is a built-in operator (not a set-returning one) over columns,
/// constants and parameters.
///
/// # Safety
/// `node` is a valid expression node of a finished plan.
#[inline(always)]
unsafe fn is_operator_over_values(node: *const pg_sys::Node) -> bool {
    // SAFETY: the caller's promise; an OpExpr's args are a List of expression nodes.
    unsafe {
        if (*node).type_ != pg_sys::NodeTag::T_OpExpr {
            return false;
        }
        let op = node.cast::<pg_sys::OpExpr>();
        if (*op).opretset || !is_built_in_operator((*op).opno) {
            return false;
        }
        let args = (*op).args;
        for j in 0..list_len(args) {
            if !is_value(list_nth(args, j)) {
                return false;
            }
        }
    }
    true
}

/// Whether `node` is a value ([`is_value`]) or an operator over values: most of what an
/// OLTP plan's expressions are, told without a call.
///
/// # Safety
/// `node` is a valid expression node of a finished plan.
#[inline(always)]
unsafe fn is_simple(node: *const pg_sys::Node) -> bool {
    // SAFETY: the caller's promise.
    unsafe { is_value(node) || is_operator_over_values(node) }
}

/// Whether the range table `rtable` names at least one relation, none foreign or
/// sampled, and nothing else but joins, subqueries and results (PostgreSQL 18's grouping
/// entry too).
///
/// # Safety
/// `rtable` is a PlannedStmt's range table.
unsafe fn reads_relations_only(rtable: *mut pg_sys::List) -> bool {
    use pg_sys::RTEKind::*;
    let mut relation = false;
    // SAFETY: the caller's promise; a range table is a List of RangeTblEntry.
    unsafe {
        for i in 0..list_len(rtable) {
            let rte = list_nth::<pg_sys::RangeTblEntry>(rtable, i);
            match (*rte).rtekind {
                RTE_RELATION => {
                    if (*rte).relkind as u8 == pg_sys::RELKIND_FOREIGN_TABLE
                        || !(*rte).tablesample.is_null()
                    {
                        return false;
                    }
                    relation = true;
                }
                RTE_JOIN | RTE_SUBQUERY | RTE_RESULT => {}
                #[cfg(feature = "pg18")]
                RTE_GROUP => {}
                _ => return false,
            }
        }
    }
    relation
}

/// Whether `plan` and the plans below it are allowlisted nodes whose expressions are
/// plain ([`plain_expr`]).
///
/// # Safety
/// `plan` is null or a valid Plan node of a finished plan.
unsafe fn plain_plan(plan: *const pg_sys::Plan, depth: u32) -> bool {
    use pg_sys::NodeTag::*;
    if plan.is_null() {
        return true;
    }
    if depth > MAX_DEPTH {
        return false;
    }
    // SAFETY: the caller's promise; a Plan's tag tells its type, whose fields named here
    // are lists of expression nodes or of Plans, or single ones.
    unsafe {
        if !(*plan).initPlan.is_null()
            || !plain_exprs((*plan).targetlist, depth)
            || !plain_exprs((*plan).qual, depth)
        {
            return false;
        }
        let own = match (*plan).type_ {
            T_SeqScan | T_Sort | T_IncrementalSort | T_Material | T_Unique | T_Group => true,
            // Not the `…orig` copies of the index conditions: their operators are the
            // same, and they are evaluated only to recheck a lossy index's rows.
            T_IndexScan => {
                let scan = plan.cast::<pg_sys::IndexScan>();
                plain_exprs((*scan).indexqual, depth) && plain_exprs((*scan).indexorderby, depth)
            }
            T_IndexOnlyScan => {
                let scan = plan.cast::<pg_sys::IndexOnlyScan>();
                plain_exprs((*scan).indexqual, depth)
                    && plain_exprs((*scan).recheckqual, depth)
                    && plain_exprs((*scan).indexorderby, depth)
            }
            T_BitmapIndexScan => {
                plain_exprs((*plan.cast::<pg_sys::BitmapIndexScan>()).indexqual, depth)
            }
            T_BitmapHeapScan => plain_exprs(
                (*plan.cast::<pg_sys::BitmapHeapScan>()).bitmapqualorig,
                depth,
            ),
            T_BitmapAnd => plain_plans((*plan.cast::<pg_sys::BitmapAnd>()).bitmapplans, depth),
            T_BitmapOr => plain_plans((*plan.cast::<pg_sys::BitmapOr>()).bitmapplans, depth),
            T_TidScan => plain_exprs((*plan.cast::<pg_sys::TidScan>()).tidquals, depth),
            T_Result => plain_expr((*plan.cast::<pg_sys::Result>()).resconstantqual, depth),
            T_Limit => {
                let limit = plan.cast::<pg_sys::Limit>();
                plain_expr((*limit).limitOffset, depth) && plain_expr((*limit).limitCount, depth)
            }
            // Grouping sets chain further Agg nodes.
            T_Agg => (*plan.cast::<pg_sys::Agg>()).chain.is_null(),
            T_Hash => plain_exprs((*plan.cast::<pg_sys::Hash>()).hashkeys, depth),
            T_NestLoop => plain_exprs((*plan.cast::<pg_sys::Join>()).joinqual, depth),
            T_MergeJoin => {
                let join = plan.cast::<pg_sys::MergeJoin>();
                plain_exprs((*join).join.joinqual, depth)
                    && plain_exprs((*join).mergeclauses, depth)
            }
            T_HashJoin => {
                let join = plan.cast::<pg_sys::HashJoin>();
                plain_exprs((*join).join.joinqual, depth)
                    && plain_exprs((*join).hashclauses, depth)
                    && plain_exprs((*join).hashkeys, depth)
            }
            T_Append => plain_plans((*plan.cast::<pg_sys::Append>()).appendplans, depth),
            T_MergeAppend => plain_plans((*plan.cast::<pg_sys::MergeAppend>()).mergeplans, depth),
            T_SubqueryScan => plain_plan((*plan.cast::<pg_sys::SubqueryScan>()).subplan, depth + 1),
            #[cfg(not(feature = "pg13"))]
            T_Memoize => plain_exprs((*plan.cast::<pg_sys::Memoize>()).param_exprs, depth),
            _ => false,
        };
        let (left, right) = ((*plan).lefttree, (*plan).righttree);
        own && (left.is_null() || plain_plan(left, depth + 1))
            && (right.is_null() || plain_plan(right, depth + 1))
    }
}

/// Whether every Plan of `plans` is plain.
///
/// # Safety
/// `plans` is a List of Plan nodes of a finished plan.
unsafe fn plain_plans(plans: *mut pg_sys::List, depth: u32) -> bool {
    // SAFETY: the caller's promise.
    unsafe { list_ptrs::<pg_sys::Plan>(plans).all(|p| plain_plan(p, depth + 1)) }
}

/// Whether every expression of `list` (or target entry's expression) is plain; the
/// simple ones are told inline ([`is_simple`]).
///
/// # Safety
/// `list` is a List of expression nodes of a finished plan.
#[inline(always)]
unsafe fn plain_exprs(list: *mut pg_sys::List, depth: u32) -> bool {
    // SAFETY: the caller's promise; a TargetEntry's expr is an expression node or null.
    unsafe {
        for i in 0..list_len(list) {
            let mut e = list_nth::<pg_sys::Node>(list, i);
            if (*e).type_ == pg_sys::NodeTag::T_TargetEntry {
                e = (*e.cast::<pg_sys::TargetEntry>()).expr.cast();
                if e.is_null() {
                    continue;
                }
            }
            if !(is_simple(e) || plain_expr(e, depth + 1)) {
                return false;
            }
        }
    }
    true
}

/// [`plain_expr`] of an expression field.
///
/// # Safety
/// As [`plain_expr`].
#[inline(always)]
unsafe fn plain_expr_of(e: *mut pg_sys::Expr, depth: u32) -> bool {
    // SAFETY: the caller's promise.
    unsafe { plain_expr(e.cast(), depth + 1) }
}

/// Whether `node` is a column, a constant or a parameter: most of what an OLTP plan's
/// expressions are made of, told before any call.
///
/// # Safety
/// `node` is a valid expression node.
#[inline(always)]
unsafe fn is_value(node: *const pg_sys::Node) -> bool {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise.
    matches!(unsafe { (*node).type_ }, T_Var | T_Const | T_Param)
}

/// Whether the array `node` of a ScalarArrayOpExpr is one the planner prices for the
/// elements it holds: a constant, or ARRAY[…] of elements (not of arrays).
///
/// # Safety
/// `node` is a valid expression node.
unsafe fn priced_for_its_length(node: *const pg_sys::Node) -> bool {
    // SAFETY: the caller's promise; the tag tells the node's type.
    unsafe {
        match (*node).type_ {
            pg_sys::NodeTag::T_Const => true,
            pg_sys::NodeTag::T_ArrayExpr => !(*node.cast::<pg_sys::ArrayExpr>()).multidims,
            _ => false,
        }
    }
}

/// Whether the expression `node` is made of allowlisted nodes only: values, operators,
/// casts, built-in aggregates and the conditional and structural expressions.
///
/// # Safety
/// `node` is null or a valid expression node of a finished plan (or a List of them).
unsafe fn plain_expr(node: *const pg_sys::Node, depth: u32) -> bool {
    use pg_sys::NodeTag::*;
    if node.is_null() {
        return true;
    }
    if depth > MAX_DEPTH {
        return false;
    }
    // SAFETY: the caller's promise; an expression node's tag tells its type, whose
    // fields named here are expression nodes or lists of them.
    unsafe {
        match (*node).type_ {
            // NextValueExpr: an identity column's next value.
            T_Var | T_Const | T_Param | T_CaseTestExpr | T_SQLValueFunction | T_NextValueExpr => {
                true
            }
            T_List => plain_exprs(node.cast_mut().cast(), depth),
            T_OpExpr | T_DistinctExpr | T_NullIfExpr => {
                let op = node.cast::<pg_sys::OpExpr>();
                !(*op).opretset
                    && is_built_in_operator((*op).opno)
                    && plain_exprs((*op).args, depth)
            }
            // `x op ANY (array)` (or ALL): the planner prices an array it cannot see (a
            // parameter of a generic plan, a column, an expression, ARRAY[…] of arrays)
            // at 10 elements (estimate_array_length), whatever the array holds when the
            // plan runs; a constant array, or ARRAY[…] of elements, is priced for its
            // length.
            T_ScalarArrayOpExpr => {
                let op = node.cast::<pg_sys::ScalarArrayOpExpr>();
                let args = (*op).args;
                is_built_in_operator((*op).opno)
                    && list_len(args) == 2
                    && priced_for_its_length(list_nth(args, 1))
                    && plain_exprs(args, depth)
            }
            T_BoolExpr => plain_exprs((*node.cast::<pg_sys::BoolExpr>()).args, depth),
            // A cast, written or implied, or one of the few quick built-ins a column's
            // default calls; any other function called by name is not plain.
            T_FuncExpr => {
                let f = node.cast::<pg_sys::FuncExpr>();
                ((*f).funcformat != pg_sys::CoercionForm::COERCE_EXPLICIT_CALL
                    || QUICK_BUILT_INS.contains(&(*f).funcid.to_u32()))
                    && !(*f).funcretset
                    && plain_exprs((*f).args, depth)
            }
            T_RelabelType => plain_expr_of((*node.cast::<pg_sys::RelabelType>()).arg, depth),
            // A cast through text into a user-defined type may check a domain (an array
            // of one, a row type with a domain column) whose CHECK calls any function,
            // and the plan records no dependency on that type (`invalItems`).
            T_CoerceViaIO => {
                let coerce = node.cast::<pg_sys::CoerceViaIO>();
                u32::from((*coerce).resulttype) < pg_sys::FirstNormalObjectId
                    && plain_expr_of((*coerce).arg, depth)
            }
            T_CollateExpr => plain_expr_of((*node.cast::<pg_sys::CollateExpr>()).arg, depth),
            T_NullTest => plain_expr_of((*node.cast::<pg_sys::NullTest>()).arg, depth),
            T_BooleanTest => plain_expr_of((*node.cast::<pg_sys::BooleanTest>()).arg, depth),
            T_FieldSelect => plain_expr_of((*node.cast::<pg_sys::FieldSelect>()).arg, depth),
            T_CaseExpr => {
                let case = node.cast::<pg_sys::CaseExpr>();
                plain_expr_of((*case).arg, depth)
                    && plain_exprs((*case).args, depth)
                    && plain_expr_of((*case).defresult, depth)
            }
            T_CaseWhen => {
                let when = node.cast::<pg_sys::CaseWhen>();
                plain_expr_of((*when).expr, depth) && plain_expr_of((*when).result, depth)
            }
            T_CoalesceExpr => plain_exprs((*node.cast::<pg_sys::CoalesceExpr>()).args, depth),
            T_MinMaxExpr => plain_exprs((*node.cast::<pg_sys::MinMaxExpr>()).args, depth),
            T_ArrayExpr => plain_exprs((*node.cast::<pg_sys::ArrayExpr>()).elements, depth),
            T_RowExpr => plain_exprs((*node.cast::<pg_sys::RowExpr>()).args, depth),
            T_Aggref => {
                let agg = node.cast::<pg_sys::Aggref>();
                plain_exprs((*agg).aggdirectargs, depth)
                    && plain_exprs((*agg).args, depth)
                    && plain_expr_of((*agg).aggfilter, depth)
            }
            _ => false,
        }
    }
}
