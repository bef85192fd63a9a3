//! pg_stride's configuration parameters (GUCs), registered from `_PG_init`.
//!
//! Names, units and ranges follow docs/design.md §5 and PostgreSQL's own conventions: times
//! carry a unit, `0` means "automatic" where PostgreSQL uses that idiom, and settings
//! that let a session take more than its share are superuser-only (`PGC_SUSET`), so a
//! role's values come from `ALTER ROLE … SET` / `ALTER DATABASE … SET`.

use crate::backend_local::BackendLocal;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, GucValue};
use pgrx::pg_sys;
use pgrx::PostgresGucEnum;
use std::cell::Cell;
use std::ffi::CString;

/// `pg_stride.parallel_mode`: who decides how many parallel workers a Gather launches.
#[derive(PostgresGucEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParallelMode {
    /// PostgreSQL alone, as planned.
    #[name = c"off"]
    Off,
    /// PostgreSQL's own parallel workers, as many as the concurrency hint and the
    /// group's `max_parallel_workers` grant.
    #[name = c"native"]
    Native,
    /// As `native`, with the parallel part of each Gather run by pg_stride's pool
    /// workers where it can (src/pool, docs/design.md §6); native workers otherwise.
    #[name = c"pool"]
    Pool,
}

/// `pg_stride.numa`: what pg_stride does about NUMA (docs/design.md §10).
#[derive(PostgresGucEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// Nothing: no per-node accounting.
    #[name = c"off"]
    Off,
    /// Per-node accounting of the CPU charged to queries (psaroudakis2016 §4.2's
    /// per-socket utilisation); the view `pg_stride.numa`.
    #[name = c"stats"]
    Stats,
    /// `stats`, and the CPU slots split by node: each query gets a home node, its
    /// processes take that node's slots and run bound to its CPUs (psaroudakis2016 §4).
    #[name = c"bind"]
    Bind,
}

/// A setting's variable, read without pgrx's thread check: pgrx's `GucSetting::get`
/// checks on every read that it runs on the thread that loaded the library, which cost
/// about a tenth of what pg_stride added to a primary-key SELECT (callgrind,
/// bench/results/INSTRUCTIONS.md), read a dozen times per statement. A backend runs its
/// hooks on its one thread (see `backend_local`), as C extensions read their GUC
/// variables; registration takes the inner `GucSetting`.
pub struct Setting<T: GucValue>(GucSetting<T>);

impl<T: GucValue> Setting<T> {
    /// The setting's value.
    pub fn get(&self) -> T {
        // SAFETY: the raw value PostgreSQL's GUC machinery stores (a valid one of `T`,
        // as pgrx's own `get` converts it), read on the process's one thread.
        unsafe { T::from_raw(self.raw()) }
    }

    /// The variable as PostgreSQL stores it (an enum's ordinal, a string's pointer).
    fn raw(&self) -> T::Raw {
        // SAFETY: the variable lives as long as the library; read on the process's one
        // thread, as every GUC variable in C.
        unsafe { *self.0.as_ptr() }
    }
}

/// Largest accepted `pg_stride.cpu_slots`; far above any core count PostgreSQL runs on.
pub const MAX_CPU_SLOTS: i32 = 4096;
/// Largest accepted priority (`priority_initial`, `priority_min`): the groups' limit.
const MAX_PRIORITY: i32 = pg_stride_sched::groups::PRIORITY_INITIAL.max as i32;

pub static ENABLED: Setting<bool> = Setting(GucSetting::<bool>::new(true));
pub static CPU_SLOTS: Setting<i32> = Setting(GucSetting::<i32>::new(0));
pub static MAX_ACTIVE_QUERIES: Setting<i32> = Setting(GucSetting::<i32>::new(128));
pub static SLICE_MS: Setting<f64> = Setting(GucSetting::<f64>::new(2.0));
pub static RESOURCE_GROUP: Setting<Option<CString>> =
    Setting(GucSetting::<Option<CString>>::new(Some(c"default")));
pub static QUEUE_TIMEOUT_MS: Setting<i32> = Setting(GucSetting::<i32>::new(0));
/// `pg_stride.max_queued`: statements waiting for admission at once, server-wide (0 =
/// no bound).
pub static MAX_QUEUED: Setting<i32> = Setting(GucSetting::<i32>::new(0));
/// `pg_stride.memory_budget`: working memory admitted statements may reserve at once,
/// kB (0 = no budget; `pg_stride_sched::memory`).
pub static MEMORY_BUDGET_KB: Setting<i32> = Setting(GucSetting::<i32>::new(0));
pub static EXEMPT_SUPERUSER: Setting<bool> = Setting(GucSetting::<bool>::new(true));
/// `pg_stride.bypass_monitoring`: monitoring queries are never queued nor paused.
pub static BYPASS_MONITORING: Setting<bool> = Setting(GucSetting::<bool>::new(true));
pub static DECAY_LAMBDA: Setting<f64> = Setting(GucSetting::<f64>::new(0.9));
pub static DECAY_START: Setting<i32> = Setting(GucSetting::<i32>::new(8));
pub static PRIORITY_INITIAL: Setting<i32> = Setting(GucSetting::<i32>::new(10_000));
pub static PRIORITY_MIN: Setting<i32> = Setting(GucSetting::<i32>::new(100));
pub static TUNER: Setting<bool> = Setting(GucSetting::<bool>::new(false));
/// `pg_stride.predict`: statements start at a priority predicted from their
/// fingerprint's history (`pg_stride_sched::predict`). Off by default: behind a client
/// connection pool it made short statements wait longer (docs/internals/scheduling.md,
/// "How statements are classified").
pub static PREDICT: Setting<bool> = Setting(GucSetting::<bool>::new(false));
pub static TRACE: Setting<bool> = Setting(GucSetting::<bool>::new(false));
pub static TUNER_WINDOW_S: Setting<i32> = Setting(GucSetting::<i32>::new(20));
pub static TUNER_INTERVAL_S: Setting<i32> = Setting(GucSetting::<i32>::new(60));
pub static PARALLEL_MODE: Setting<ParallelMode> =
    Setting(GucSetting::<ParallelMode>::new(ParallelMode::Native));
pub static NUMA: Setting<NumaMode> = Setting(GucSetting::<NumaMode>::new(NumaMode::Stats));
pub static NUMA_STEAL_AFTER: Setting<i32> = Setting(GucSetting::<i32>::new(4));
/// Largest accepted `pg_stride.pool_size`: the pool's slots in shared memory, shared by
/// every database.
pub const MAX_POOL_SIZE: i32 = 32;
pub static POOL_SIZE: Setting<i32> = Setting(GucSetting::<i32>::new(-1));
pub static POOL_IDLE_TIMEOUT_MS: Setting<i32> = Setting(GucSetting::<i32>::new(300_000));
pub static PIN_SLOTS: Setting<bool> = Setting(GucSetting::<bool>::new(false));
pub static NUMA_TOPOLOGY: Setting<Option<CString>> =
    Setting(GucSetting::<Option<CString>>::new(Some(c"")));
pub static DATABASE: Setting<Option<CString>> =
    Setting(GucSetting::<Option<CString>>::new(Some(c"postgres")));

/// `pg_stride.enabled`: the executor hooks ask it for every statement, outside pgrx's
/// error boundary, where nothing may panic (reading a bool cannot).
pub fn enabled() -> bool {
    ENABLED.get()
}

/// The ordinal of `pg_stride.numa`, read without converting it (which panics on an
/// unknown one): asked at every slice end.
fn numa_ordinal() -> i32 {
    NUMA.raw()
}

/// Whether CPU time is counted per node: `pg_stride.numa` is `stats` or `bind`.
pub fn numa_stats() -> bool {
    numa_ordinal() >= NumaMode::Stats as i32
}

/// Whether `pg_stride.numa` is `bind`.
pub fn numa_bind() -> bool {
    numa_ordinal() == NumaMode::Bind as i32
}

/// `pg_stride.numa_steal_after` in slices, `None` for -1 (never).
pub fn numa_steal_after() -> Option<u32> {
    u32::try_from(NUMA_STEAL_AFTER.get()).ok()
}

/// `pg_stride.numa_topology`: a spec of fake nodes (`0|1`), or `None` for the kernel's
/// topology.
pub fn numa_topology_spec() -> Option<String> {
    NUMA_TOPOLOGY
        .get()
        .map(|s| s.to_string_lossy().trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Whether a resource group of a name exists: `None` while that cannot be told (see
/// [`check_resource_group`]).
pub type GroupExists = fn(&str) -> Option<bool>;

/// The lookup `pg_stride.resource_group`'s check hook uses; given by `_PG_init`, since
/// the group directory lives in a layer above the settings.
static GROUP_EXISTS: std::sync::OnceLock<GroupExists> = std::sync::OnceLock::new();

/// Registers every GUC. Called once, from `_PG_init` while
/// `shared_preload_libraries` is being processed (some are `PGC_POSTMASTER`-like in
/// spirit and must exist before the shared-memory size is computed). `group_exists`
/// checks the names given to `pg_stride.resource_group`.
pub fn register(group_exists: GroupExists) {
    let _ = GROUP_EXISTS.set(group_exists);
    GucRegistry::define_bool_guc(
        c"pg_stride.enabled",
        c"Enables pg_stride's admission control and CPU scheduling.",
        c"When off, every pg_stride hook passes straight through to the previous one.",
        &ENABLED.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.cpu_slots",
        c"Number of processes that may execute scheduled query work at once.",
        c"0 means the number of CPUs this server may use.",
        &CPU_SLOTS.0,
        0,
        MAX_CPU_SLOTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.max_active_queries",
        c"Maximum number of admitted top-level statements; further ones wait.",
        c"",
        &MAX_ACTIVE_QUERIES.0,
        1,
        pgrx::pg_sys::MAX_BACKENDS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.queue_timeout",
        c"Longest time a statement waits for admission; 0 waits as long as it takes.",
        c"A statement still queued then fails with SQLSTATE 53000.",
        &QUEUE_TIMEOUT_MS.0,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_stride.max_queued",
        c"Most statements waiting for admission at once, server-wide; 0 sets no bound.",
        c"A statement that would wait beyond it fails at once with SQLSTATE 53000.",
        &MAX_QUEUED.0,
        0,
        262_143,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.memory_budget",
        c"Working memory that admitted statements may reserve at once, server-wide; 0 sets no budget.",
        c"A statement reserves work_mem for each sort, hash (times hash_mem_multiplier) and tuple store of its plan, in each process that runs it; one that does not fit waits for admission.",
        &MEMORY_BUDGET_KB.0,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.exempt_superuser",
        c"Superusers' statements are admitted at once, without counting against the limits.",
        c"",
        &EXEMPT_SUPERUSER.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.bypass_monitoring",
        c"Monitoring queries (reading only the system catalogs, statistics views and pg_stride's views) are never queued nor paused.",
        c"So that a DBA can look at a saturated server. Such a query may still be expensive: turn this off if roles abuse it.",
        &BYPASS_MONITORING.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"pg_stride.decay_lambda",
        c"Factor by which a query's priority decays per slice of CPU once decay started.",
        c"1 keeps priorities fixed (fair sharing); lower values favour short queries more.",
        &DECAY_LAMBDA.0,
        0.0,
        1.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.decay_start",
        c"Slices of CPU a query receives before its priority starts to decay.",
        c"",
        &DECAY_START.0,
        0,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.priority_initial",
        c"Priority a query starts with, unless its resource group sets its own.",
        c"Higher priorities get more CPU; see pg_stride.decay_lambda.",
        &PRIORITY_INITIAL.0,
        1,
        MAX_PRIORITY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.priority_min",
        c"Lowest priority a query decays to, unless its resource group sets its own.",
        c"Keeps long queries from starving; a value above pg_stride.priority_initial acts as priority_initial (no decay).",
        &PRIORITY_MIN.0,
        1,
        MAX_PRIORITY,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.tuner",
        c"Lets the tuner worker choose decay_lambda and decay_start from the traced workload.",
        c"Groups with their own decay settings keep them. A reload that changes pg_stride.decay_lambda, decay_start or slice installs the new values; see the view pg_stride.tuner.",
        &TUNER.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.predict",
        c"Starts each CPU-scheduled statement at a priority predicted from the CPU its query identifier used before.",
        c"A statement predicted short keeps its group's initial priority for about twice its prediction; one predicted long starts lower and decays at once. Needs compute_query_id (on or auto); see the view pg_stride.statements.",
        &PREDICT.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.trace",
        c"Records every CPU-scheduled statement in the trace that the view pg_stride.trace shows.",
        c"The tuner records them too while it is on. A record holds the statement's arrival, admission and finish times, its CPU in and outside CPU slots, and its waits for slots.",
        &TRACE.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.tuner_window",
        c"Span of the most recent statements the tuner replays at each refresh.",
        c"",
        &TUNER_WINDOW_S.0,
        1,
        3_600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_stride.tuner_interval",
        c"How often the tuner searches decay parameters for the traced workload.",
        c"It also checks every second whether the sizes of the newest statements have shifted.",
        &TUNER_INTERVAL_S.0,
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_enum_guc(
        c"pg_stride.parallel_mode",
        c"Who decides how many parallel workers each Gather launches.",
        c"off: PostgreSQL, as planned; native: no more than the concurrency hint and the group's max_parallel_workers grant; pool: as native, run by pg_stride's pool workers where possible.",
        &PARALLEL_MODE.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.pool_size",
        c"Pool workers per database for parallel_mode = pool; -1 for the CPU slots plus 2.",
        c"The extra workers let fragments wait at yield points while others run. The pool stays within caps derived from max_worker_processes and max_parallel_workers.",
        &POOL_SIZE.0,
        -1,
        MAX_POOL_SIZE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.pool_idle_timeout",
        c"A pool worker that served no fragment for this long exits; 0 keeps it.",
        c"",
        &POOL_IDLE_TIMEOUT_MS.0,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_float_guc(
        c"pg_stride.slice",
        c"Target CPU time a process runs between two scheduling checks.",
        c"Yield points are placed so that the work between two checks takes about this long.",
        &SLICE_MS.0,
        0.1,
        1000.0,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    // SAFETY: the check hook is guarded and only reads shared memory; the assign hook
    // cannot fail.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_stride.resource_group",
            c"Resource group whose share and limits this session's statements get.",
            c"Settable by superusers and through ALTER ROLE/DATABASE ... SET.",
            &RESOURCE_GROUP.0,
            GucContext::Suset,
            GucFlags::IS_NAME,
            Some(check_resource_group),
            Some(assign_resource_group),
            None,
        )
    };
    GucRegistry::define_enum_guc(
        c"pg_stride.numa",
        c"What pg_stride does about NUMA nodes.",
        c"off: nothing; stats: CPU time charged to queries is counted per node (view pg_stride.numa); bind: stats, and each query gets a home node whose CPU slots and CPUs its processes use.",
        &NUMA.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_stride.pin_slots",
        c"Runs each CPU-slot holder on a CPU of its own, which travels with the slot when it is handed over.",
        c"Not with pg_stride.numa = bind, where processes follow their node's CPUs. A holder that finds no CPU free runs unpinned.",
        &PIN_SLOTS.0,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.numa_steal_after",
        c"Slices a process of a query waits at a stretch for a slot on its home node before it may take one on another node.",
        c"Only with pg_stride.numa = bind; -1: never.",
        &NUMA_STEAL_AFTER.0,
        -1,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: the check hook is guarded and only parses the value.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_stride.numa_topology",
            c"For tests: CPU lists of fake NUMA nodes, such as 0|1; empty means the kernel's nodes.",
            c"Each |-separated CPU list in the kernel's format (0-3,8) is one node, numbered from 0.",
            &NUMA_TOPOLOGY.0,
            GucContext::Postmaster,
            GucFlags::default(),
            Some(check_numa_topology),
            None,
            None,
        )
    };
    GucRegistry::define_string_guc(
        c"pg_stride.database",
        c"Database whose pg_stride.resource_groups table defines the resource groups.",
        c"The pg_stride groups worker connects to it (and, with parallel_mode = pool, starts that database's pool workers).",
        &DATABASE.0,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    // Any other pg_stride.* name is a typo: warn about it, as PostgreSQL does for its
    // own prefixes, and refuse it from now on.
    // SAFETY: called from _PG_init after pg_stride's GUCs are defined.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"pg_stride".as_ptr()) };
}

/// How often this process's `pg_stride.resource_group` took a new value: SET, RESET, the end of
/// a function with a SET clause, a rolled-back SET. A statement whose count is the same
/// as the previous statement's runs in the same group, without a look at the name.
static GROUP_ASSIGNMENTS: BackendLocal<Cell<u64>> = BackendLocal::new(Cell::new(0));

pub fn group_assignments() -> u64 {
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
pub fn group_name() -> String {
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
    if restoring {
        return true;
    }
    // SAFETY: PostgreSQL passes the check hook a valid pointer to the proposed value.
    let name = unsafe { proposed_string(newval) };
    match GROUP_EXISTS.get().and_then(|exists| exists(&name)) {
        Some(false) => {}
        Some(true) | None => return true,
    }
    if source == pg_sys::GucSource::PGC_S_TEST {
        // As PostgreSQL does for an unknown tablespace in ALTER ROLE … SET
        // default_tablespace: the value may name a group created later.
        crate::pg::report(
            pgrx::PgLogLevel::NOTICE,
            pgrx::PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("resource group \"{name}\" does not exist"),
            NO_SUCH_GROUP_HINT.to_str().ok(),
        );
        return true;
    }
    if source < pg_sys::GucSource::PGC_S_INTERACTIVE {
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
pub const NO_SUCH_GROUP_HINT: &std::ffi::CStr =
    c"Create it with pg_stride.create_group(), or list groups in pg_stride.groups.";

/// The value a string GUC's check hook is asked about; empty for none.
///
/// # Safety
/// `newval` is the hook's argument: null, or a pointer to null or to a C string.
unsafe fn proposed_string(newval: *mut *mut std::ffi::c_char) -> String {
    // SAFETY: the caller's promise.
    unsafe {
        newval
            .as_ref()
            .filter(|p| !p.is_null())
            .map(|&p| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
    }
    .unwrap_or_default()
}

/// Refuses a `pg_stride.numa_topology` that does not parse as node CPU lists (or that
/// puts a CPU in two nodes), with the parser's reason.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_numa_topology(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes the check hook a valid pointer to the proposed value.
    let spec = unsafe { proposed_string(newval) };
    let spec = spec.trim();
    let Err(e) = (match spec {
        "" => Ok(()),
        _ => pg_stride_sched::numa::Topology::from_spec(spec).map(|_| ()),
    }) else {
        return true;
    };
    let detail = CString::new(e.to_string()).unwrap_or_default();
    // SAFETY: the documented way for a check hook to give its error's code, detail and
    // hint: palloc'd strings in the GUC_check_* globals.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as i32);
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(
            c"Give one CPU list per node, separated by |, such as 0|1 or 0-3|4-7, each CPU in one node; or empty for the kernel's nodes."
                .as_ptr(),
        );
    }
    false
}

/// CPU slots in effect: `pg_stride.cpu_slots`, or the CPUs available to this server
/// when it is 0 (docs/design.md §1: one slot per core, wagner2021 §2).
pub fn effective_cpu_slots() -> u32 {
    // Counting the CPUs reads the affinity mask and cgroup files: once per process, not
    // at every watchdog round.
    static AVAILABLE_CPUS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    match CPU_SLOTS.get() {
        0 => *AVAILABLE_CPUS
            .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
        n => n as u32,
    }
}

/// Pool workers a database gets: `pg_stride.pool_size`, or the CPU slots plus 2 when it
/// is -1 (docs/design.md §6), never more than the pool has.
pub fn pool_size() -> usize {
    let size = match POOL_SIZE.get() {
        -1 => effective_cpu_slots().saturating_add(2),
        n => n.max(0) as u32,
    };
    size.min(MAX_POOL_SIZE as u32) as usize
}

/// Whether `pg_stride.parallel_mode` is `pool`, read without converting the ordinal:
/// asked by the executor hook for every statement, outside pgrx's error boundary.
pub fn pool_mode() -> bool {
    PARALLEL_MODE.raw() == ParallelMode::Pool as i32
}

/// `pg_stride.slice` in ns.
pub fn slice_ns() -> u64 {
    (SLICE_MS.get() * 1_000_000.0) as u64
}

/// The decay settings as the scheduling core takes them; one quantum is one slice
/// (wagner2021 §3.2: the update quantum equals t_max).
pub fn decay_params() -> pg_stride_sched::DecayParams {
    pg_stride_sched::DecayParams {
        lambda: DECAY_LAMBDA.get(),
        d_start: DECAY_START.get() as u32,
        quantum_ns: slice_ns(),
    }
}
