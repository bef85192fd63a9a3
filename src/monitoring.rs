//! Monitoring queries, which `pg_stride.bypass_monitoring` keeps out of admission and
//! CPU scheduling, so that a DBA can look at a saturated server: told apart from the
//! plan ([`bypasses_scheduling`], with `plan_tree`'s readings of it), with the catalog
//! lookups that needs.
//!
//! The lookups' caches here are process-local and cleared by syscache callbacks: a
//! change of a schema or a relation can change an answer (a table moved into or out of
//! schema `pg_stride`, the extension created again).

use crate::backend_local::BackendLocal;
use crate::gucs::Setting;
use crate::{plan_costs, plan_tree};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// Whether `desc` is a monitoring query that `pg_stride.bypass_monitoring` keeps out of
/// scheduling. Asked again for every statement: the answer depends on the plan, not only
/// on the query (a parameter can fold away the branch that calls a user-defined
/// function), and PostgreSQL 18's query identifiers name relations by their names, so
/// neither could key a kept answer safely.
///
/// # Safety
/// `desc` is ExecutorStart's QueryDesc; call inside a guarded function (catalog lookups).
pub unsafe fn bypasses_scheduling(desc: *const pg_sys::QueryDesc) -> bool {
    if !BYPASS_MONITORING.get() {
        return false;
    }
    // SAFETY: ExecutorStart's QueryDesc has its PlannedStmt; a guarded function may look
    // up the catalogs.
    unsafe {
        let stmt = (*desc).plannedstmt;
        // A write, most of an OLTP application's statements, is told by this inlined
        // first test, without a call.
        plan_tree::reads_only(stmt)
            && (*(*stmt).planTree).total_cost < MAX_COST * plan_costs::scale()
            && reads_only_monitoring(stmt)
    }
}

/// The highest planner cost of a monitoring query (at PostgreSQL's default CPU costs;
/// `plan_costs::scale`): a look at the catalogs and statistics views costs far
/// less, even on a server with many thousand tables; a query over them that the planner
/// puts above it (a cross join of catalogs, a built-in set-returning function asked for
/// billions of rows) is scheduled like any other.
const MAX_COST: f64 = 100_000.0;

/// Whether `stmt`, a statement that only reads, is a monitoring query (docs/design.md §4
/// rule 4): a plain SELECT without FROM that calls monitoring built-ins
/// (`plan_tree::is_monitoring_built_in`) of constants, or one that reads at least one
/// relation or function and only these — relations of the system catalogs (views such as
/// `pg_stat_activity` included) or of schema `pg_stride` (its views and groups table),
/// monitoring built-ins, functions of schema `pg_stride` — and that calls no other
/// user-defined function anywhere in the plan.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; inside a guarded function (catalog lookups).
#[inline(never)]
unsafe fn reads_only_monitoring(stmt: *const pg_sys::PlannedStmt) -> bool {
    use plan_tree::FromItem;
    // Objects created by initdb (the catalogs, their views and built-in functions) have
    // OIDs below this; CREATE EXTENSION's above.
    let built_in = |oid: pg_sys::Oid| u32::from(oid) < pg_sys::FirstNormalObjectId;
    // Asked for a relation that is not a built-in one, and for every function in FROM.
    let in_own_schema =
        |namespace: pg_sys::Oid| namespace != pg_sys::InvalidOid && namespace == own_schema();
    let mut reads = false;
    // SAFETY: the caller's promises; lsyscache lookups return InvalidOid or NULL for what
    // is missing.
    unsafe {
        for item in plan_tree::from_items(stmt) {
            match item {
                FromItem::Relation(relid) => {
                    if !built_in(relid) && !in_own_schema(relation_schema(relid)) {
                        return false;
                    }
                    reads = true;
                }
                FromItem::Functions => reads = true,
                FromItem::Excluded => return false,
            }
        }
        if !reads {
            // No relation and no function in FROM: a monitoring call such as
            // `SELECT pg_is_in_recovery()` or `SELECT pg_current_wal_lsn()`, without a
            // sub-select (whose plan, an initPlan, runs anything).
            return (*stmt).subplans.is_null()
                && plan_tree::calls_only_monitoring_functions((*stmt).planTree);
        }
        let Some(functions) = plan_tree::from_functions(stmt) else {
            return false;
        };
        // Functions of pg_stride's schema may be called in the plan too; any other
        // user-defined function may not.
        let mut own_functions = Vec::new();
        for f in functions {
            if in_own_schema(pg_sys::get_func_namespace(f)) {
                own_functions.push(f);
            } else if !plan_tree::is_monitoring_built_in(f) {
                return false;
            }
        }
        plan_tree::calls_no_function_but(stmt, &own_functions)
            && plan_tree::calls_no_scheduled_built_in(stmt)
    }
}

/// The OID of schema `pg_stride` in this database (InvalidOid without the extension),
/// kept until a change of any schema invalidates it.
static OWN_SCHEMA: BackendLocal<Cell<Option<pg_sys::Oid>>> = BackendLocal::new(Cell::new(None));

/// The schemas of the relations the monitoring check looked up last, as (relation,
/// schema); InvalidOid pairs are empty. A statement that reads a user table needs its
/// schema to be told from a monitoring query, and a syscache lookup for every statement
/// would cost more than the rest of the check. Cleared whenever a pg_class row changes
/// (ALTER TABLE … SET SCHEMA among them).
static RELATION_SCHEMAS: BackendLocal<RefCell<RelationSchemas>> =
    BackendLocal::new(RefCell::new(RelationSchemas::EMPTY));

struct RelationSchemas {
    entries: [(pg_sys::Oid, pg_sys::Oid); 8],
    /// The entry the next lookup replaces (round robin).
    next: usize,
}

impl RelationSchemas {
    const EMPTY: RelationSchemas = RelationSchemas {
        entries: [(pg_sys::InvalidOid, pg_sys::InvalidOid); 8],
        next: 0,
    };
}

/// Registers the callbacks that clear the caches of this module. Called once, from
/// `_PG_init`, in the postmaster, whose processes inherit them: PostgreSQL keeps a fixed
/// number of callbacks, and running out of them is FATAL, which must happen at start-up
/// rather than in the middle of a client's statement.
pub fn install() {
    // SAFETY: registers callbacks that only clear process-local caches.
    unsafe {
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
            Some(forget_own_schema),
            pg_sys::Datum::from(0),
        );
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::RELOID as i32,
            Some(forget_relation_schemas),
            pg_sys::Datum::from(0),
        );
    }
}

/// The OID of schema `pg_stride`, looked up once and then again only after a schema
/// changed (the extension dropped and created again gives it a new one). Call inside a
/// guarded function.
fn own_schema() -> pg_sys::Oid {
    if let Some(oid) = OWN_SCHEMA.get() {
        return oid;
    }
    // SAFETY: a catalog lookup by name, in a guarded function (the caller's promise).
    let oid = unsafe { pg_sys::get_namespace_oid(c"pg_stride".as_ptr(), true) };
    OWN_SCHEMA.set(Some(oid));
    oid
}

/// The schema of relation `relid` (InvalidOid if it is gone), from the cache above or
/// the syscache. Call inside a guarded function.
fn relation_schema(relid: pg_sys::Oid) -> pg_sys::Oid {
    let cached = RELATION_SCHEMAS.with_borrow(|c| {
        c.entries
            .iter()
            .find(|&&(rel, _)| rel == relid && rel != pg_sys::InvalidOid)
            .map(|&(_, schema)| schema)
    });
    if let Some(schema) = cached {
        return schema;
    }
    // SAFETY: a syscache lookup, in a guarded function (the caller's promise).
    let schema = unsafe { pg_sys::get_rel_namespace(relid) };
    if schema != pg_sys::InvalidOid {
        RELATION_SCHEMAS.with_borrow_mut(|c| {
            let next = c.next;
            c.entries[next] = (relid, schema);
            c.next = (next + 1) % c.entries.len();
        });
    }
    schema
}

/// A schema changed: look `pg_stride`'s OID up again when next needed.
unsafe extern "C-unwind" fn forget_own_schema(
    _arg: pg_sys::Datum,
    _cache: std::ffi::c_int,
    _hash: u32,
) {
    OWN_SCHEMA.set(None);
}

/// A relation changed (or the whole cache was reset): look schemas up again. Runs while
/// PostgreSQL processes invalidations, which may happen inside `relation_schema`'s own
/// lookup, so it only tries to borrow; a lookup in progress stores nothing stale, as it
/// stores what the syscache returned after the invalidation.
unsafe extern "C-unwind" fn forget_relation_schemas(
    _arg: pg_sys::Datum,
    _cache: std::ffi::c_int,
    _hash: u32,
) {
    RELATION_SCHEMAS.try_with_borrow_mut(|c| *c = RelationSchemas::EMPTY);
}

/// `pg_stride.bypass_monitoring`: monitoring queries are never queued nor paused.
static BYPASS_MONITORING: Setting<bool> = Setting::new(GucSetting::<bool>::new(true));

/// Registers `pg_stride.bypass_monitoring`. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_bool_guc(
        c"pg_stride.bypass_monitoring",
        c"Monitoring queries (reading only the system catalogs, statistics views and pg_stride's views) are never queued nor paused.",
        c"So that a DBA can look at a saturated server. Such a query may still be expensive: turn this off if roles abuse it.",
        BYPASS_MONITORING.inner(),
        GucContext::Suset,
        GucFlags::default(),
    );
}
