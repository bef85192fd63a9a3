//! Thin wrappers around the PostgreSQL state and calls pg_stride uses, so that the rest
//! of the extension is safe Rust (layer 1 of docs/design.md §7: no pg_stride state here).
//!
//! Some functions are declared here instead of taken from `pg_sys`, to be called
//! without pgrx's error boundary: pgrx wraps every `pg_sys` function in a `sigsetjmp`
//! so that an ERROR becomes a Rust panic, and for plain reads and stores of
//! process-local state that costs more than the call itself, on paths every statement
//! takes. Each of them is a function that cannot raise an ERROR.

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::time::{Duration, Instant};

mod ffi {
    use pgrx::pg_sys;

    // Declared here, not called through pgrx's bindings, which enter its guarded FFI
    // boundary (a sigsetjmp and a thread check) on every call: functions that cannot
    // raise an ERROR, called from hooks for many statements.
    extern "C" {
        pub fn GetTopTransactionIdIfAny() -> pg_sys::TransactionId;
        pub fn GetCurrentSubTransactionId() -> pg_sys::SubTransactionId;
        #[cfg(not(feature = "pg13"))]
        pub fn EnableQueryId();
        pub fn ExecSetExecProcNode(node: *mut pg_sys::PlanState, function: pg_sys::ExecProcNodeMtd);
    }

    extern "C" {
        /// The SQL function `pg_trigger_depth() RETURNS int4`: a read of trigger.c's
        /// depth of trigger calls in progress, which ignores its argument and cannot
        /// raise an ERROR.
        pub fn pg_trigger_depth(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    }

    extern "C-unwind" {
        /// The SQL function `pg_blocking_pids(int4) RETURNS int4[]`; may raise an ERROR.
        pub fn pg_blocking_pids(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum;
    }
}

mod statement;
pub use statement::{
    blocks_touched, call_at_reset, query_id_and_cost, saved_plan_context, statement_fingerprint,
    statement_relation, StatementText,
};

/// Sends a report with its SQLSTATE, and a HINT where the user can act (every report
/// pg_stride sends has a code of its own; docs/errors.md lists them, and `scripts/lint`
/// checks that list against the calls). At ERROR it does not return. The location
/// reported is the caller's.
#[track_caller]
pub fn report(level: PgLogLevel, code: PgSqlErrorCode, message: String, hint: Option<&str>) {
    let mut report = ErrorReport::new(code, message, "pg_stride");
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(level);
}

/// Rolls back the current transaction after an ERROR raised in it was caught, as
/// PostgreSQL's own error recovery does in a process that goes on afterwards: its
/// locks, snapshots, SPI connections and memory are released, and no transaction is
/// in progress. The caught error's state is already flushed (pgrx does it).
pub fn abort_transaction_after_error() {
    // SAFETY: called outside any critical section, from the process's main code path;
    // AbortCurrentTransaction copes with every transaction state, none included.
    unsafe { pg_sys::AbortCurrentTransaction() }
}

/// Raises an ERROR with a SQLSTATE and an optional HINT.
#[track_caller]
pub fn raise(code: PgSqlErrorCode, message: String, hint: Option<&str>) -> ! {
    report(PgLogLevel::ERROR, code, message, hint);
    unreachable!("an ERROR report does not return")
}

/// The top-level transaction's ID, or InvalidTransactionId when it has none yet (it has
/// written nothing and locked no rows).
pub fn top_transaction_id_if_any() -> pg_sys::TransactionId {
    // SAFETY: returns a field of the backend's transaction state (xact.c); no ERROR.
    unsafe { ffi::GetTopTransactionIdIfAny() }
}

/// Asks PostgreSQL to compute query identifiers while `compute_query_id` is `auto` (the
/// default), as pg_stat_statements does. The request is a process-local flag: made in
/// `_PG_init`, it holds in every process the postmaster forks; made in a backend, for
/// the statements that backend parses from then on. PostgreSQL 13 has no query
/// identifiers in core: statements are predicted from their plan's cost.
pub fn enable_query_id() {
    // SAFETY: sets a process-local flag that parse analysis reads; no ERROR.
    #[cfg(not(feature = "pg13"))]
    unsafe {
        ffi::EnableQueryId()
    };
}

/// Whether parse analysis computes query identifiers in this backend now:
/// `compute_query_id` is `on`, or not `off` and they were asked for ([`enable_query_id`],
/// pg_stat_statements). Mirrors queryjumble.h's IsQueryIdEnabled, an inline function.
/// Never on PostgreSQL 13.
pub fn query_ids_computed() -> bool {
    #[cfg(not(feature = "pg13"))]
    // SAFETY: reads two variables of this process that parse analysis reads; no ERROR.
    let computed = unsafe {
        use pg_sys::ComputeQueryIdType::{COMPUTE_QUERY_ID_OFF, COMPUTE_QUERY_ID_ON};
        let mode = pg_sys::compute_query_id;
        mode == COMPUTE_QUERY_ID_ON as std::ffi::c_int
            || (mode != COMPUTE_QUERY_ID_OFF as std::ffi::c_int && pg_sys::query_id_enabled)
    };
    #[cfg(feature = "pg13")]
    let computed = false;
    computed
}

/// Marks every cached plan of this backend for re-analysis and re-planning at its next
/// use, as a flood of invalidation messages does (plancache.c's ResetPlanCache).
pub fn reset_plan_cache() {
    // SAFETY: walks the backend's own list of cached plans and clears their validity
    // flags; a plan in use stays valid for its current execution. No ERROR.
    unsafe { pg_sys::ResetPlanCache() }
}

/// The current time as a TimestampTz.
pub fn now_timestamp() -> pg_sys::TimestampTz {
    // SAFETY: reads the clock; no ERROR.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// The session's `work_mem` and `hash_mem_multiplier`.
pub fn memory_settings() -> pg_stride_sched::memory::MemorySettings {
    // SAFETY: plain GUC variables of this process.
    unsafe {
        pg_stride_sched::memory::MemorySettings {
            work_mem_kb: pg_sys::work_mem.max(0) as u64,
            hash_mem_multiplier: pg_sys::hash_mem_multiplier,
        }
    }
}

/// Makes `function` the function PostgreSQL calls to get `node`'s next tuple.
///
/// # Safety
/// `node` is a PlanState of a plan tree being set up or run by this backend.
pub unsafe fn set_exec_proc_node(node: *mut pg_sys::PlanState, function: pg_sys::ExecProcNodeMtd) {
    // SAFETY: the caller's promise; the function only stores two pointers (execProcnode.c).
    unsafe { ffi::ExecSetExecProcNode(node, function) }
}

/// This process's PGPROC number (its `ProcNumber` from PostgreSQL 17 on), if it has a
/// PGPROC.
pub fn my_procno() -> Option<usize> {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    // SAFETY: plain read of a process-local global.
    let procno = unsafe { pg_sys::MyProcNumber };
    #[cfg(not(any(feature = "pg17", feature = "pg18")))]
    // SAFETY: MyProc is this process's PGPROC once it is attached to shared memory;
    // a null check covers the postmaster and processes without one.
    let procno = unsafe { pg_sys::MyProc.as_ref()?.pgprocno };
    usize::try_from(procno).ok()
}

/// This process's pid.
pub fn my_pid() -> i32 {
    // SAFETY: plain read of a process-local global.
    unsafe { pg_sys::MyProcPid }
}

/// Lowers this process's CPU priority to `niceness` (as `nice` does): for a worker
/// whose work may wait while queries run. A failure leaves the priority as it was.
pub fn lower_cpu_priority(niceness: i32) {
    // SAFETY: setpriority on the calling process only changes its scheduling priority.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, niceness) };
}

/// Number of PGPROCs in ProcGlobal->allProcs that processes use: backends, background
/// workers and auxiliary processes (prepared transactions' come after them).
fn all_procs_count() -> usize {
    // SAFETY: ProcGlobal is set up before any process that runs pg_stride code exists.
    unsafe { (*pg_sys::ProcGlobal).allProcCount as usize }
}

/// PGPROC number `procno`, or `None` when there is no such PGPROC.
fn proc_by_number(procno: usize) -> Option<*mut pg_sys::PGPROC> {
    (procno < all_procs_count())
        // SAFETY: bounds-checked above; allProcs lives as long as the server.
        .then(|| unsafe { (*pg_sys::ProcGlobal).allProcs.add(procno) })
}

/// The pid of the process with PGPROC number `procno` (0 when it is free). Read without
/// a lock: the value may be a moment old, which callers tolerate (they look again).
pub fn proc_pid(procno: usize) -> i32 {
    proc_by_number(procno).map_or(0, |proc| {
        // SAFETY: a PGPROC of allProcs; a volatile read of a word its owner writes.
        unsafe { std::ptr::read_volatile(&raw const (*proc).pid) }
    })
}

/// The role process `procno` authenticated as (`PGPROC.roleId`; a parallel or pool
/// worker's is its leader's while it works for it). Read without a lock.
pub fn proc_role(procno: usize) -> pg_sys::Oid {
    proc_by_number(procno).map_or(pg_sys::InvalidOid, |proc| {
        // SAFETY: a PGPROC of allProcs; a volatile read of a word its owner writes.
        unsafe { std::ptr::read_volatile(&raw const (*proc).roleId) }
    })
}

/// Whether the current role may see what a statement of `role` did beyond its
/// existence: PostgreSQL's rule for `pg_stat_activity` and `pg_stat_statements`
/// (the role's own privileges, or those of `pg_read_all_stats`; superusers have both).
/// Looks roles up in the syscache, so it runs inside a transaction.
pub fn may_read_stats_of(role: pg_sys::Oid) -> bool {
    // SAFETY: plain calls into PostgreSQL's role checks.
    unsafe {
        let me = pg_sys::GetUserId();
        pg_sys::has_privs_of_role(me, pg_sys::ROLE_PG_READ_ALL_STATS.into())
            || (role != pg_sys::InvalidOid && pg_sys::has_privs_of_role(me, role))
    }
}

/// The DefElem named `name` among `options` (a List of DefElems, or NIL), or null. Reads
/// the List's array directly, as [`StatementText::of_active_portal`] does.
///
/// # Safety
/// `options` is NIL or a valid List of DefElems.
unsafe fn option_named(
    options: *const pg_sys::List,
    name: &std::ffi::CStr,
) -> *mut pg_sys::DefElem {
    if options.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's promise; each DefElem's defname is a NUL-terminated string.
    unsafe {
        (0..(*options).length as usize)
            .map(|i| {
                (*(*options).elements.add(i))
                    .ptr_value
                    .cast::<pg_sys::DefElem>()
            })
            .find(|&option| {
                !(*option).defname.is_null() && std::ffi::CStr::from_ptr((*option).defname) == name
            })
            .unwrap_or(std::ptr::null_mut())
    }
}

/// The database that utility `stmt` (of type `tag`, run at top level or not) needs
/// without other backends: the one an `ALTER DATABASE … RENAME` or `SET TABLESPACE`
/// changes, or a `CREATE DATABASE`'s template. Only one for which `wanted` is true,
/// that the current user owns (or any, for a superuser), and only where PostgreSQL
/// would go on to lock it: not in recovery or a read-only transaction, nor, for the two
/// commands that cannot run in a transaction block, in one. It is locked first as the
/// command itself locks it (so that a caller of this waits for that lock here), and
/// looked up again by name under the lock (a rename meanwhile: None, unlocked).
///
/// # Safety
/// `stmt` is a valid node of type `tag`; inside a transaction (it reads catalogs and
/// takes a lock until the transaction ends).
pub unsafe fn database_emptied_by(
    stmt: *mut pg_sys::Node,
    tag: pg_sys::NodeTag,
    top_level: bool,
    wanted: impl Fn(pg_sys::Oid) -> bool,
) -> Option<pg_sys::Oid> {
    // SAFETY: the caller's promise.
    unsafe {
        // PreventInTransactionBlock's own test (a block, a function, a pipeline).
        let in_block = pg_sys::IsInTransactionBlock(top_level);
        if pg_sys::RecoveryInProgress() || pg_sys::XactReadOnly {
            return None;
        }
        let (name, lock): (*const std::ffi::c_char, u32) = match tag {
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = stmt.cast::<pg_sys::RenameStmt>();
                if (*rename).renameType != pg_sys::ObjectType::OBJECT_DATABASE {
                    return None;
                }
                ((*rename).subname, pg_sys::AccessExclusiveLock)
            }
            pg_sys::NodeTag::T_AlterDatabaseStmt => {
                let alter = stmt.cast::<pg_sys::AlterDatabaseStmt>();
                if in_block || option_named((*alter).options, c"tablespace").is_null() {
                    return None;
                }
                ((*alter).dbname, pg_sys::AccessExclusiveLock)
            }
            pg_sys::NodeTag::T_CreatedbStmt if !in_block => {
                let options = (*stmt.cast::<pg_sys::CreatedbStmt>()).options;
                let template = option_named(options, c"template");
                let name = if template.is_null() || (*template).arg.is_null() {
                    c"template1".as_ptr()
                } else {
                    pg_sys::defGetString(template)
                };
                (name, pg_sys::ShareLock)
            }
            _ => return None,
        };
        if name.is_null() {
            return None;
        }
        let database = pg_sys::get_database_oid(name, true);
        if database == pg_sys::InvalidOid || !wanted(database) {
            return None;
        }
        let me = pg_sys::GetUserId();
        #[cfg(feature = "pg15")]
        let owns = pg_sys::pg_database_ownercheck(database, me);
        #[cfg(not(feature = "pg15"))]
        let owns = pg_sys::object_ownercheck(pg_sys::DatabaseRelationId, database, me);
        if !owns {
            return None;
        }
        pg_sys::LockSharedObject(pg_sys::DatabaseRelationId, database, 0, lock as _);
        if pg_sys::get_database_oid(name, true) != database {
            pg_sys::UnlockSharedObject(pg_sys::DatabaseRelationId, database, 0, lock as _);
            return None;
        }
        Some(database)
    }
}

/// Whether `stmt`, a DropdbStmt, asks `WITH (FORCE)`.
///
/// # Safety
/// `stmt` is a valid DropdbStmt, whose options are a List of DefElems or NIL.
pub unsafe fn drop_database_forces(stmt: *const pg_sys::DropdbStmt) -> bool {
    // SAFETY: the caller's promise.
    unsafe { !option_named((*stmt).options, c"force").is_null() }
}

/// Whether the current role may terminate a backend of `role`: PostgreSQL's rule for
/// `pg_terminate_backend` and `DROP DATABASE … WITH (FORCE)` (a superuser's backend
/// only by a superuser; otherwise the role's own privileges, or those of
/// `pg_signal_backend`). Looks roles up in the syscache, so it runs inside a
/// transaction.
pub fn may_terminate_backend_of(role: pg_sys::Oid) -> bool {
    // SAFETY: plain calls into PostgreSQL's role checks.
    unsafe {
        let me = pg_sys::GetUserId();
        (pg_sys::superuser() || !pg_sys::superuser_arg(role))
            && (pg_sys::has_privs_of_role(me, role)
                || pg_sys::has_privs_of_role(me, pg_sys::ROLE_PG_SIGNAL_BACKEND.into()))
    }
}

/// The wait event of process `procno` (`wait_event_info`: 0 while it runs). Read
/// without a lock, like `pg_stat_activity` reads it.
pub fn proc_wait_event(procno: usize) -> u32 {
    proc_by_number(procno).map_or(0, |proc| {
        // SAFETY: a PGPROC of allProcs; a volatile read of a word its owner writes.
        unsafe { std::ptr::read_volatile(&raw const (*proc).wait_event_info) }
    })
}

/// Whether process `procno` runs, or waits on an extension's event: where a paused CPU
/// slot holder waits for its slot (`wait_until`), woken when it is handed one.
pub fn proc_runs_or_waits_for_slot(procno: usize) -> bool {
    matches!(proc_wait_event(procno), 0 | pg_sys::PG_WAIT_EXTENSION)
}

/// What a process waits for, by the class of its wait event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// It runs (or waits on something short: an LWLock, I/O, IPC, a timeout).
    No,
    /// A heavyweight lock (PG_WAIT_LOCK).
    Lock,
    /// Its client, or a peer (PG_WAIT_CLIENT). `reading` (ClientRead): idle between
    /// statements or between the FETCHes of a cursor, or reading COPY data. Otherwise
    /// in the middle of a statement: sending rows to a client that does not read them
    /// (ClientWrite), or waiting for a standby or a replication peer.
    Client { reading: bool },
    /// Anything else (LWLock, I/O, IPC, timeout, extension).
    Other,
}

/// What process `procno` waits for now.
pub fn proc_waiting(procno: usize) -> Waiting {
    match proc_wait_event(procno) {
        0 => Waiting::No,
        event => match event & 0xFF00_0000 {
            pg_sys::PG_WAIT_LOCK => Waiting::Lock,
            pg_sys::PG_WAIT_CLIENT => Waiting::Client {
                reading: event == pg_sys::WaitEventClient::WAIT_EVENT_CLIENT_READ,
            },
            _ => Waiting::Other,
        },
    }
}

/// The PGPROC number of the lock-group leader of process `procno` (itself when it leads
/// its group or has none): a parallel worker's leader. Read without a lock.
pub fn proc_lock_group_leader(procno: usize) -> usize {
    let Some(proc) = proc_by_number(procno) else {
        return procno;
    };
    // SAFETY: a PGPROC of allProcs; lockGroupLeader is null or a PGPROC of allProcs,
    // read as a word its owner writes.
    unsafe {
        let leader = std::ptr::read_volatile(&raw const (*proc).lockGroupLeader);
        if leader.is_null() {
            return procno;
        }
        usize::try_from(leader.offset_from((*pg_sys::ProcGlobal).allProcs)).unwrap_or(procno)
    }
}

/// For every PGPROC number below `n`, whether its process or a member of the lock group
/// it leads (its parallel workers) waits on a heavyweight lock: a leader waiting for its
/// workers waits, through them, for the lock.
pub fn lock_waits_by_group(n: usize) -> Vec<bool> {
    let mut waits = vec![false; n];
    for procno in 0..n {
        if proc_waiting(procno) == Waiting::Lock {
            let leader = proc_lock_group_leader(procno);
            if let Some(w) = waits.get_mut(leader) {
                *w = true;
            }
            waits[procno] = true;
        }
    }
    waits
}

/// The PGPROC number of this process's lock-group leader, if it is another process: in
/// a parallel worker, its leader's (docs/design.md §8).
pub fn lock_group_leader() -> Option<usize> {
    let me = my_procno()?;
    let leader = proc_lock_group_leader(me);
    (leader != me).then_some(leader)
}

/// Sets the latch of process `procno`, to wake it from a latch wait. The one way
/// pg_stride wakes another process.
pub fn set_latch(procno: usize) {
    if let Some(proc) = proc_by_number(procno) {
        // SAFETY: a PGPROC of allProcs; SetLatch may be called on another process's latch
        // and does not raise errors.
        unsafe { pg_sys::SetLatch(&raw mut (*proc).procLatch) };
    }
}

/// Cancels the statement of backend `pid` as `pg_cancel_backend` does (SIGINT: the
/// backend raises "canceling statement due to user request" at its next
/// CHECK_FOR_INTERRUPTS).
pub fn cancel_backend(pid: i32) {
    if pid > 0 {
        // SAFETY: kill has no memory effects; a pid that is gone gives ESRCH.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
}

/// Longest single sleep of a latch wait: the condition is looked at again after it, in
/// case a wake-up was missed.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Sleeps on this process's latch until `done()` holds, or until `deadline` (then
/// returns `false`). The one latch-wait loop of pg_stride (docs/design.md §4 rule 3): it
/// serves cancel, `statement_timeout` and `pg_terminate_backend` (CHECK_FOR_INTERRUPTS
/// raises their errors, which end the wait) and exits on postmaster death. `done` is
/// looked at before every sleep and after every wake-up.
pub fn wait_until(mut done: impl FnMut() -> bool, deadline: Option<Instant>) -> bool {
    loop {
        if done() {
            return true;
        }
        let sleep = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => left.min(MAX_SLEEP),
                _ => return false,
            },
            None => MAX_SLEEP,
        };
        // SAFETY: the standard latch wait of a backend on its own latch.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                sleep.as_millis().max(1) as std::ffi::c_long,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    }
}

/// Whether interrupts can be processed here: INTERRUPTS_CAN_BE_PROCESSED(). LWLockAcquire
/// holds interrupts until release, so this excludes every LWLock (docs/design.md §8).
pub fn interrupts_can_be_processed() -> bool {
    // SAFETY: plain reads of process-local counters.
    unsafe {
        pg_sys::InterruptHoldoffCount == 0
            && pg_sys::CritSectionCount == 0
            && pg_sys::QueryCancelHoldoffCount == 0
    }
}

/// IsParallelWorker(): this process is one of PostgreSQL's parallel workers.
pub fn is_parallel_worker() -> bool {
    // SAFETY: plain read of a process-local global.
    unsafe { pg_sys::ParallelWorkerNumber >= 0 }
}

/// Whether this process is a client backend.
pub fn is_client_backend() -> bool {
    // SAFETY: plain read of a process-local global.
    unsafe { pg_sys::MyBackendType == pg_sys::BackendType::B_BACKEND }
}

/// Whether a portal is running: a statement the client sent is being executed. Queries
/// PostgreSQL runs by itself when a transaction commits (deferred triggers, foreign-key
/// checks) run with none.
pub fn portal_active() -> bool {
    // SAFETY: plain read of a process-local global.
    unsafe { !pg_sys::ActivePortal.is_null() }
}

/// Whether the active portal is one listed in pg_cursors (a DECLARE's, SPI's for
/// PL/pgSQL's OPEN and FOR over a query, and also the extended protocol's Bind) and
/// runs `desc`, its query; the portals of a simple query and of EXECUTE are not listed.
pub fn cursor_portal_runs(desc: *const pg_sys::QueryDesc) -> bool {
    // SAFETY: ActivePortal is null or a valid portal of this backend.
    unsafe {
        let portal = pg_sys::ActivePortal;
        !portal.is_null() && (*portal).visible && std::ptr::eq((*portal).queryDesc, desc)
    }
}

/// Whether the active portal stores its rows for after its transaction: COMMIT runs a
/// holdable cursor's query to its end into that store (`PersistHoldablePortal`), and
/// no FETCH runs the query once the store exists.
pub fn portal_stores_held_rows() -> bool {
    // SAFETY: ActivePortal is null or a valid portal of this backend.
    unsafe {
        let portal = pg_sys::ActivePortal;
        !portal.is_null() && !(*portal).holdStore.is_null()
    }
}

/// Whether the active portal is running: true while a procedure or DO block commits or
/// rolls back the transaction it runs in (its portal stays active across), false when
/// an ERROR aborts it, since PortalRun marks its portal failed and restores the portal
/// that was active before (none, at the top level) on its way out.
pub fn portal_running() -> bool {
    // SAFETY: ActivePortal is null or a valid portal of this backend.
    unsafe {
        let portal = pg_sys::ActivePortal;
        !portal.is_null() && (*portal).status == pg_sys::PortalStatus::PORTAL_ACTIVE
    }
}

/// Whether a trigger function is running in this backend (`pg_trigger_depth() > 0`):
/// a query that starts now is one of its own, or of a foreign-key check, wherever
/// PostgreSQL fired it from — inside a statement's ExecutorRun, a COPY … FROM, or the
/// deferred triggers of a COMMIT that a procedure or DO block runs.
pub fn in_trigger() -> bool {
    // SAFETY: pg_trigger_depth reads a process-local counter and returns it; it does not
    // look at its call info, given one with no arguments as SQL would call it.
    unsafe {
        let mut call: pg_sys::FunctionCallInfoBaseData = std::mem::zeroed();
        ffi::pg_trigger_depth(&mut call).value() as i32 > 0
    }
}

/// Whether the current role is a superuser.
pub fn is_superuser() -> bool {
    // SAFETY: plain call into PostgreSQL's role check (a syscache lookup of the current
    // role, which exists while it is current).
    unsafe { pg_sys::superuser() }
}

/// The name of the database this process is connected to (`current_database()`, read
/// without SQL, so that no function a schema on the search path holds can stand in for
/// it); empty where the database has gone. Looks it up in the syscache, so it runs inside
/// a transaction.
pub fn current_database() -> String {
    // SAFETY: MyDatabaseId is set once the process connected; get_database_name returns
    // a palloc'd copy, or NULL for a database dropped meanwhile.
    unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        if name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// The current role (GetUserId): inside a SECURITY DEFINER function or procedure, its
/// owner. A plain read of process-local state, which cannot fail.
pub fn current_role() -> pg_sys::Oid {
    // SAFETY: plain read of the current user id, set from the session's start on.
    unsafe { pg_sys::GetUserId() }
}

/// The role the session runs as (GetOuterUserId): SET ROLE's, not a SECURITY DEFINER
/// function's owner. A plain read of process-local state, which cannot fail.
pub fn outer_role() -> pg_sys::Oid {
    // SAFETY: plain read of the outer user id, set from the session's start on.
    unsafe { pg_sys::GetOuterUserId() }
}

/// Whether `role` is a superuser (a role dropped since counts as none). Looks the role
/// up in the syscache, so it runs inside a transaction.
pub fn is_superuser_role(role: pg_sys::Oid) -> bool {
    // SAFETY: plain call into PostgreSQL's role check, which answers false for a role
    // that does not exist.
    unsafe { pg_sys::superuser_arg(role) }
}

/// Whether `role` may `SET` the parameter `name`: a superuser, or a role granted SET on
/// it (`GRANT SET ON PARAMETER`). Looks the grant up in the syscache, so it runs inside
/// a transaction.
pub fn may_set_parameter(name: &std::ffi::CStr, role: pg_sys::Oid) -> bool {
    // SAFETY: plain calls into PostgreSQL's privilege check; the name is a valid C
    // string, and a role that does not exist has no privilege.
    unsafe {
        pg_sys::pg_parameter_aclcheck(name.as_ptr(), role, pg_sys::ACL_SET as pg_sys::AclMode)
            == pg_sys::AclResult::ACLCHECK_OK
    }
}

/// Gives a server setting a default computed at start-up, as PostgreSQL does for
/// `wal_buffers` (source `PGC_S_DYNAMIC_DEFAULT`): a value from the configuration file,
/// the command line or `ALTER SYSTEM` wins over it. Call from `_PG_init` in the
/// postmaster, before shared memory is sized.
pub fn set_dynamic_default(name: &std::ffi::CStr, value: &std::ffi::CStr) {
    // SAFETY: SetConfigOption copies both strings; an invalid value raises an ERROR
    // through pgrx's boundary.
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_POSTMASTER,
            pg_sys::GucSource::PGC_S_DYNAMIC_DEFAULT,
        );
    }
}

/// The current subtransaction's id (1 for the top-level transaction). A plain read of
/// the transaction state, which cannot fail.
pub fn current_subtransaction() -> u32 {
    // SAFETY: plain read of process-local transaction state.
    unsafe { ffi::GetCurrentSubTransactionId() }
}

/// The pids of the processes that block process `pid`'s lock wait, as
/// `pg_blocking_pids` computes them from the lock manager's shared state: no database
/// connection, no transaction. Allocates in the current memory context.
pub fn blocking_pids(pid: i32) -> Vec<i32> {
    // SAFETY: pg_blocking_pids is a strict built-in function of one int4 returning a
    // one-dimensional int4[] without NULLs, called through fmgr as SQL would call it
    // (pgrx's wrapper turns an ERROR into a Rust panic). The array is taken apart with
    // int4's known length, pass-by-value and alignment: a catalog lookup of the type
    // would need a database, which the scheduler worker does not connect to.
    unsafe {
        let datum = pg_sys::DirectFunctionCall1Coll(
            Some(ffi::pg_blocking_pids),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(pid),
        );
        let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nelems: std::ffi::c_int = 0;
        pg_sys::deconstruct_array(
            datum.cast_mut_ptr(),
            pg_sys::INT4OID,
            4,
            true,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
            &mut elems,
            std::ptr::null_mut(),
            &mut nelems,
        );
        (0..nelems.max(0) as usize)
            .map(|i| (*elems.add(i)).value() as i32)
            .collect()
    }
}

/// Registers `callback` to run when this process exits (`before_shmem_exit`).
pub fn on_exit(callback: unsafe extern "C-unwind" fn(i32, pg_sys::Datum)) {
    // SAFETY: adds to this process's own exit list; PostgreSQL calls it with the
    // arguments it documents.
    unsafe { pg_sys::before_shmem_exit(Some(callback), pg_sys::Datum::from(0)) };
}

/// The OID of the database this process is connected to (0 before it connected).
pub fn database_oid() -> u32 {
    // SAFETY: a plain read of a global set when the process connected.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The pid of the postmaster.
pub fn postmaster_pid() -> i32 {
    // SAFETY: plain read of a global set before any child process starts.
    unsafe { pg_sys::PostmasterPid }
}

/// Whether the fault `name` is switched on for tests: in a debug build (what the test
/// suites install), the comma-separated names in the server's environment variable
/// PG_STRIDE_TEST_FAULTS; never in a release build. Read once per process.
pub fn test_fault(name: &str) -> bool {
    #[cfg(debug_assertions)]
    {
        thread_local! {
            static FAULTS: Vec<String> = std::env::var("PG_STRIDE_TEST_FAULTS")
                .map(|v| v.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
        }
        FAULTS.with(|faults| faults.iter().any(|f| f == name))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = name;
        false
    }
}

/// PROC_IS_AUTOVACUUM of storage/proc.h.
const PROC_IS_AUTOVACUUM: u8 = 0x01;
/// ProcArrayLock's place in MainLWLockArray (lwlocknames.txt, 15 to 18).
const PROC_ARRAY_LOCK: usize = 4;

/// Marks this background worker's PGPROC as an autovacuum worker while it is idle
/// (`idle`), and unmarks it before it works in its database again. Commands that need
/// a database nobody is connected to (DROP, RENAME, SET TABLESPACE, CREATE DATABASE …
/// TEMPLATE) wait up to 5 s for its other backends to leave, and send SIGTERM to its
/// autovacuum workers (`CountOtherDBBackends`): a worker marked so ends (and its
/// restart time, over 5 s, lets the command through) rather than make the command
/// fail. It must hold no lock while marked: the flag's other meaning (a lock waiter
/// cancels an autovacuum worker that blocks it) must never apply to it.
///
/// # Safety
/// In a background worker connected to a database, holding no LWLock, outside a
/// transaction when `idle`.
pub unsafe fn show_as_autovacuum(idle: bool) {
    // SAFETY: the caller's promise; statusFlags and its mirror in ProcGlobal are
    // written under ProcArrayLock held exclusively, as vacuum does.
    unsafe {
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(PROC_ARRAY_LOCK)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let me = pg_sys::MyProc;
        if idle {
            (*me).statusFlags |= PROC_IS_AUTOVACUUM;
        } else {
            (*me).statusFlags &= !PROC_IS_AUTOVACUUM;
        }
        *(*pg_sys::ProcGlobal)
            .statusFlags
            .add((*me).pgxactoff as usize) = (*me).statusFlags;
        pg_sys::LWLockRelease(lock);
    }
}
