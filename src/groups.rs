//! Resource groups (docs/design.md §1, §5): which group a statement runs in, and reading the
//! groups table.
//!
//! The DBA defines groups with `pg_stride.create_group` and friends; they persist in the
//! table `pg_stride.resource_groups` of the database named by `pg_stride.database` and
//! are mirrored into the shared group directory (`shmem::GroupDirectory`), which is what
//! every backend reads.
//!
//! Keeping the mirror right: any change to the table fires a statement trigger that
//! re-reads the table in the changing transaction and publishes it at once (so the
//! session that created a group can use it in its next statement), and asks the groups
//! loader to reload when the transaction ends, committed or aborted. The loader reads
//! the committed table, so whatever order concurrent changes commit in, the mirror ends
//! equal to the table. The loader also reads it when it starts.

use crate::backend_local::BackendLocal;
use crate::gucs::{self, Setting};
use crate::pg;
use crate::shmem::{self, Group, GroupDirectory};
use pg_stride_sched::groups::{GroupSettings, DEFAULT_GROUP};
use pg_stride_sched::rules::Rules;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::cell::Cell;
use std::ffi::CString;

/// Whether this backend's transaction changed the groups table.
static CHANGED_IN_XACT: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Whether [`after_transaction`] is registered in this process.
static RELEASE_CALLBACK_SET: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Remembers that the current transaction changed the groups table, so that the loader
/// reloads it when the transaction ends.
pub fn mark_changed() {
    CHANGED_IN_XACT.set(true);
    if !RELEASE_CALLBACK_SET.replace(true) {
        // SAFETY: registers a callback that cannot panic; PostgreSQL keeps it for the
        // life of the process.
        unsafe {
            pg_sys::RegisterResourceReleaseCallback(Some(after_transaction), std::ptr::null_mut())
        };
    }
}

/// Resource-owner release callback: once the top-level transaction has released its
/// locks, after it sent its catalog invalidations, a transaction that changed the
/// groups table asks the loader to reload it. Not at the transaction callback's COMMIT,
/// which comes before both: after a DROP EXTENSION the loader then found the table
/// through its stale catalog cache, waited for the drop's lock, and failed on the
/// dropped table. Cannot panic.
unsafe extern "C-unwind" fn after_transaction(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if is_top_level && phase == pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_AFTER_LOCKS {
        transaction_ended();
    }
}

/// Whether this backend's transaction changed the groups table.
pub fn changed_in_transaction() -> bool {
    CHANGED_IN_XACT.get()
}

/// The transaction ended (committed, aborted or prepared): if it changed the groups
/// table, the loader reloads it. Cannot panic.
fn transaction_ended() {
    if CHANGED_IN_XACT.replace(false) {
        if let Some(shared) = shmem::shared() {
            shared.groups.request_reload();
        }
    }
}

/// The last group this backend resolved: the count of `pg_stride.resource_group`
/// assignments and the directory generation it was looked up at, and its slot.
/// Statements mostly run in the same group as the one before, so the common case costs
/// two comparisons instead of the directory lock.
static LAST_GROUP: BackendLocal<Cell<(u64, u64, usize)>> =
    BackendLocal::new(Cell::new((u64::MAX, u64::MAX, 0)));

/// The group whose slot a statement runs in: the one its comment's tag names
/// (`pg_stride_sched::group_tag`), if it has one and `role`, the role that sent the
/// statement, may set `pg_stride.resource_group`; otherwise the session's group. A tag
/// that the role may not use or that names no group is passed over with a WARNING, and
/// the statement runs.
pub fn resolve_statement_group(
    directory: &GroupDirectory,
    tag: Option<String>,
    role: pg_sys::Oid,
) -> usize {
    let Some(name) = tag else {
        return resolve_session_group(directory);
    };
    let (code, message, hint) = if !pg::may_set_parameter(c"pg_stride.resource_group", role) {
        (
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied to set parameter \"pg_stride.resource_group\" to \"{name}\""),
            "A superuser can allow the role to choose its group with GRANT SET ON PARAMETER pg_stride.resource_group.",
        )
    } else if let Some(slot) = directory.find(&name) {
        return slot;
    } else {
        (
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("resource group \"{name}\" does not exist"),
            NO_SUCH_GROUP_HINT.to_str().unwrap_or_default(),
        )
    };
    let slot = resolve_session_group(directory);
    ErrorReport::new(code, message, "pg_stride resource groups")
        .set_detail(format!(
            "The group was named in the statement's comment; the statement runs in the session's group \"{}\".",
            directory.name_of(slot)
        ))
        .set_hint(hint)
        .report(PgLogLevel::WARNING);
    slot
}

/// The group of the session's statements: its `pg_stride.resource_group`, or `default`
/// with a WARNING when no such group exists (docs/design.md §4 rule 10: a setting restored
/// before its group is accepted, and falls back when used).
#[inline]
fn resolve_session_group(directory: &GroupDirectory) -> usize {
    let key = (group_assignments(), directory.generation());
    let (assignments, generation, slot) = LAST_GROUP.get();
    if (assignments, generation) == key {
        return slot;
    }
    look_up_session_group(directory, key)
}

/// [`resolve_session_group`] when the setting or the directory changed since the last
/// statement: out of line, so that the common case above stays a few loads.
#[cold]
#[inline(never)]
fn look_up_session_group(directory: &GroupDirectory, key: (u64, u64)) -> usize {
    let name = group_name();
    match directory.find(&name) {
        Some(slot) => {
            LAST_GROUP.set((key.0, key.1, slot));
            slot
        }
        None => {
            pg::report(
                PgLogLevel::WARNING,
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!(
                    "resource group \"{name}\" does not exist; using group \"{DEFAULT_GROUP}\""
                ),
                NO_SUCH_GROUP_HINT.to_str().ok(),
            );
            0
        }
    }
}

/// Reads `pg_stride.resource_groups` of the current database through SPI; no rows when
/// the extension is not created here. Runs inside a transaction.
/// The rules of group `name` from the table's text. The group functions accept only
/// text that parses; a row changed by hand to something else loses its rules, with a
/// WARNING, rather than keep the whole table from loading.
fn rules_of(name: &str, text: &str) -> Rules {
    Rules::parse(text).unwrap_or_else(|e| {
        pg::report(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("pg_stride: resource group \"{name}\" has no rules in effect: {e}"),
            Some("Set its rules again with pg_stride.alter_group(), which accepts only rules that parse."),
        );
        Rules::EMPTY
    })
}

pub fn read_table() -> Vec<Group> {
    use pgrx::spi::Spi;
    Spi::connect(|client| {
        let exists = client
            .select(
                "SELECT pg_catalog.to_regclass('pg_stride.resource_groups') IS NOT NULL",
                None,
                &[],
            )?
            .first()
            .get_one::<bool>()?;
        if exists != Some(true) {
            return Ok(Vec::new());
        }
        let rows = client.select(
            "SELECT name, weight, max_concurrency, max_parallel_workers, priority_initial, \
                    priority_min, decay_lambda, decay_start, pinned, max_queued, queue_timeout, \
                    memory_budget, reject_oversized, rules, rules_dry_run \
               FROM pg_stride.resource_groups ORDER BY name",
            None,
            &[],
        )?;
        let mut groups = Vec::new();
        for row in rows {
            let d = GroupSettings::DEFAULT;
            let name = row.get::<String>(1)?.unwrap_or_default();
            groups.push(Group {
                name: name.clone(),
                settings: GroupSettings {
                    weight: row.get::<i32>(2)?.unwrap_or(d.weight),
                    max_concurrency: row.get::<i32>(3)?.unwrap_or(d.max_concurrency),
                    max_parallel_workers: row.get::<i32>(4)?,
                    priority_initial: row.get::<i32>(5)?,
                    priority_min: row.get::<i32>(6)?,
                    decay_lambda: row.get::<f64>(7)?,
                    decay_start: row.get::<i32>(8)?,
                    pinned: row.get::<bool>(9)?.unwrap_or(d.pinned),
                    max_queued: row.get::<i32>(10)?,
                    queue_timeout: row.get::<i32>(11)?,
                    memory_budget: row.get::<i32>(12)?,
                    reject_oversized: row.get::<bool>(13)?.unwrap_or(d.reject_oversized),
                    rules: rules_of(&name, &row.get::<String>(14)?.unwrap_or_default()),
                    rules_dry_run: row.get::<bool>(15)?.unwrap_or(d.rules_dry_run),
                },
            });
        }
        Ok::<_, pgrx::spi::SpiError>(groups)
    })
    .unwrap_or_else(|e| {
        // An SQL error inside keeps its own SQLSTATE; what comes back here is a column
        // that no longer has the type CREATE EXTENSION gave it, or SPI failing by itself.
        pg::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("pg_stride: cannot read pg_stride.resource_groups: {e}"),
            Some("The table must keep the columns and types that CREATE EXTENSION pg_stride gave it."),
        )
    })
}

// ---- The groups' settings ----

static RESOURCE_GROUP: Setting<Option<CString>> =
    Setting::new(GucSetting::<Option<CString>>::new(Some(c"default")));
static DATABASE: Setting<Option<CString>> =
    Setting::new(GucSetting::<Option<CString>>::new(Some(c"postgres")));

/// How often this process's `pg_stride.resource_group` took a new value: SET, RESET, the end of
/// a function with a SET clause, a rolled-back SET. A statement whose count is the same
/// as the previous statement's runs in the same group, without a look at the name.
static GROUP_ASSIGNMENTS: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));

fn group_assignments() -> u64 {
    GROUP_ASSIGNMENTS.get()
}

/// PostgreSQL calls it whenever `pg_stride.resource_group` changes value, including
/// when it restores an earlier one. An assign hook must not fail; this one cannot (no
/// pgrx boundary is needed for an increment).
unsafe extern "C-unwind" fn assign_resource_group(
    _newval: *const std::ffi::c_char,
    _extra: *mut std::ffi::c_void,
) {
    GROUP_ASSIGNMENTS.set(GROUP_ASSIGNMENTS.get().wrapping_add(1));
}

/// The session's `pg_stride.resource_group`.
fn group_name() -> String {
    RESOURCE_GROUP
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The database named by `pg_stride.database`.
pub fn database_name() -> String {
    DATABASE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Checks a group name against the group directory, the way PostgreSQL checks the
/// names of `default_tablespace` or `search_path` (docs/design.md §4 rule 10): a `SET` in a
/// session of a group that does not exist fails; `ALTER ROLE/DATABASE … SET` of one
/// (source `PGC_S_TEST`) is accepted with a NOTICE, so that a dump restores roles
/// before the database that defines their groups; a value from any other source
/// (configuration file, role and database settings at login, a parallel worker
/// restoring its leader's settings, the postmaster) is accepted as it is and falls
/// back to `default` with a WARNING when a statement runs. Where the directory cannot
/// tell (no shared memory yet, a library that was not preloaded, a groups table not
/// read since the server started), every name is accepted.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_resource_group(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: plain reads of process-local globals.
    let restoring = unsafe {
        pg_sys::InitializingParallelWorker
            || (pg_sys::IsPostmasterEnvironment && !pg_sys::IsUnderPostmaster)
    };
    // A value from the configuration file, a role's or a database's settings, or the
    // client's start-up packet is accepted unseen, and falls back when used (rule 10).
    // Such values are also checked by processes without a PGPROC (the syslogger, at a
    // reload), which must not take the directory's lock.
    if restoring || source < pg_sys::GucSource::PGC_S_INTERACTIVE {
        return true;
    }
    // SAFETY: PostgreSQL passes the check hook a valid pointer to the proposed value.
    let name = unsafe { gucs::proposed_string(newval) };
    let known = shmem::shared()
        .map(|shared| &shared.groups)
        .filter(|directory| directory.is_loaded())
        .map(|directory| directory.find(&name).is_some());
    if known != Some(false) {
        return true;
    }
    if source == pg_sys::GucSource::PGC_S_TEST {
        // As PostgreSQL does for an unknown tablespace in ALTER ROLE … SET
        // default_tablespace: the value may name a group created later.
        pg::report(
            pgrx::PgLogLevel::NOTICE,
            pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("resource group \"{name}\" does not exist"),
            NO_SUCH_GROUP_HINT.to_str().ok(),
        );
        return true;
    }
    let message =
        CString::new(format!("resource group \"{name}\" does not exist")).unwrap_or_default();
    // SAFETY: the documented way for a check hook to give its error's message, code and
    // hint: palloc'd strings in the GUC_check_* globals.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT as i32);
        pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(message.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(NO_SUCH_GROUP_HINT.as_ptr());
    }
    false
}

/// What a DBA does about a group name that names no group.
const NO_SUCH_GROUP_HINT: &std::ffi::CStr =
    c"Create it with pg_stride.create_group(), or list groups in pg_stride.groups.";

/// Registers the settings of groups: the session's group and the database of the groups
/// table. Called once, from `_PG_init`.
pub fn register_settings() {
    // SAFETY: the check hook is guarded and only reads shared memory; the assign hook
    // cannot fail.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_stride.resource_group",
            c"Resource group whose share and limits this session's statements get.",
            c"Settable by superusers and through ALTER ROLE/DATABASE ... SET.",
            RESOURCE_GROUP.inner(),
            GucContext::Suset,
            GucFlags::IS_NAME,
            Some(check_resource_group),
            Some(assign_resource_group),
            None,
        )
    };
    GucRegistry::define_string_guc(
        c"pg_stride.database",
        c"Database whose pg_stride.resource_groups table defines the resource groups.",
        c"The pg_stride groups worker connects to it (and, with parallel_mode = pool, starts that database's pool workers).",
        DATABASE.inner(),
        GucContext::Postmaster,
        GucFlags::default(),
    );
}
