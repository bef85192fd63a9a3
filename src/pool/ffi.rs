//! What the pool needs from PostgreSQL that pgrx does not give it (docs/design.md §6).
//!
//! * The private definitions of `src/backend/access/transam/parallel.c` (the TOC magic,
//!   its keys, the error-queue size and `FixedParallelState`), copied per major (15,
//!   17 and 18, checked against 15.18, 17.11 and 18.1): they change between majors.
//!   16 is not reachable from these machines, so it is not checked, and the pool is
//!   compiled for 15, 17 and 18 only.
//! * Structs of headers pgrx does not bind (`executor/execParallel.h`,
//!   `libpq/libpq.h`, `access/session.h`, the registry of typcache.c).
//! * Functions called **without** pgrx's error boundary: the pool worker runs a
//!   fragment inside its own `sigsetjmp` (like `PostgresMain`), so that an ERROR arrives
//!   there with PostgreSQL's error state intact (EmitErrorReport sends it to the leader
//!   whole). Every Rust frame between that `sigsetjmp` and these calls holds nothing
//!   with a destructor.
#![allow(non_snake_case, non_upper_case_globals, dead_code)]

use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_long, c_void};

// ---- parallel.c (identical in 15, 17 and 18, apart from FixedParallelState). ----
pub const PARALLEL_ERROR_QUEUE_SIZE: usize = 16384;
pub const PARALLEL_MAGIC: u64 = 0x5047_7c7c;
pub const PARALLEL_KEY_FIXED: u64 = 0xFFFF_FFFF_FFFF_0001;
pub const PARALLEL_KEY_ERROR_QUEUE: u64 = 0xFFFF_FFFF_FFFF_0002;
pub const PARALLEL_KEY_LIBRARY: u64 = 0xFFFF_FFFF_FFFF_0003;
pub const PARALLEL_KEY_GUC: u64 = 0xFFFF_FFFF_FFFF_0004;
pub const PARALLEL_KEY_COMBO_CID: u64 = 0xFFFF_FFFF_FFFF_0005;
pub const PARALLEL_KEY_TRANSACTION_SNAPSHOT: u64 = 0xFFFF_FFFF_FFFF_0006;
pub const PARALLEL_KEY_ACTIVE_SNAPSHOT: u64 = 0xFFFF_FFFF_FFFF_0007;
pub const PARALLEL_KEY_TRANSACTION_STATE: u64 = 0xFFFF_FFFF_FFFF_0008;
pub const PARALLEL_KEY_ENTRYPOINT: u64 = 0xFFFF_FFFF_FFFF_0009;
pub const PARALLEL_KEY_SESSION_DSM: u64 = 0xFFFF_FFFF_FFFF_000A;
pub const PARALLEL_KEY_PENDING_SYNCS: u64 = 0xFFFF_FFFF_FFFF_000B;
pub const PARALLEL_KEY_REINDEX_STATE: u64 = 0xFFFF_FFFF_FFFF_000C;
pub const PARALLEL_KEY_RELMAPPER_STATE: u64 = 0xFFFF_FFFF_FFFF_000D;
pub const PARALLEL_KEY_UNCOMMITTEDENUMS: u64 = 0xFFFF_FFFF_FFFF_000E;
/// From 16 on.
#[cfg(not(feature = "pg15"))]
pub const PARALLEL_KEY_CLIENTCONNINFO: u64 = 0xFFFF_FFFF_FFFF_000F;

/// parallel.c's `FixedParallelState`. 15 (from 15.10) has one more flag, which fits in
/// the padding before the pointer, and names the leader by its BackendId; 17 and 18 by
/// its ProcNumber.
#[repr(C)]
pub struct FixedParallelState {
    pub database_id: pg_sys::Oid,
    pub authenticated_user_id: pg_sys::Oid,
    pub session_user_id: pg_sys::Oid,
    pub outer_user_id: pg_sys::Oid,
    pub current_user_id: pg_sys::Oid,
    pub temp_namespace_id: pg_sys::Oid,
    pub temp_toast_namespace_id: pg_sys::Oid,
    pub sec_context: c_int,
    #[cfg(feature = "pg15")]
    pub authenticated_user_is_superuser: bool,
    pub session_user_is_superuser: bool,
    pub role_is_superuser: bool,
    pub parallel_leader_pgproc: *mut pg_sys::PGPROC,
    pub parallel_leader_pid: i32,
    /// `parallel_leader_backend_id` in 15, `parallel_leader_proc_number` from 17 on.
    pub parallel_leader_number: i32,
    pub xact_ts: pg_sys::TimestampTz,
    pub stmt_ts: pg_sys::TimestampTz,
    pub serializable_xact_handle: *mut c_void,
    pub mutex: u8,
    pub last_xlog_end: u64,
}
// The layout on x86_64 / aarch64 (checked by hand against parallel.c): 96 bytes in
// every major.
const _: () = assert!(std::mem::size_of::<FixedParallelState>() == 96);

// ---- executor/execParallel.h (pgrx binds it as an opaque struct) ----
#[repr(C)]
pub struct ParallelExecutorInfo {
    pub planstate: *mut pg_sys::PlanState,
    pub pcxt: *mut pg_sys::ParallelContext,
    pub buffer_usage: *mut pg_sys::BufferUsage,
    pub wal_usage: *mut pg_sys::WalUsage,
    pub instrumentation: *mut c_void,
    pub jit_instrumentation: *mut c_void,
    pub area: *mut pg_sys::dsa_area,
    pub param_exec: pg_sys::dsa_pointer,
    pub finished: bool,
    pub tqueue: *mut *mut pg_sys::shm_mq_handle,
    pub reader: *mut *mut c_void,
}

// ---- libpq/libpq.h ----
#[repr(C)]
pub struct PQcommMethods {
    pub comm_reset: Option<unsafe extern "C-unwind" fn()>,
    pub flush: Option<unsafe extern "C-unwind" fn() -> c_int>,
    pub flush_if_writable: Option<unsafe extern "C-unwind" fn() -> c_int>,
    pub is_send_pending: Option<unsafe extern "C-unwind" fn() -> bool>,
    pub putmessage: Option<unsafe extern "C-unwind" fn(c_char, *const c_char, usize) -> c_int>,
    pub putmessage_noblock: Option<unsafe extern "C-unwind" fn(c_char, *const c_char, usize)>,
}

// ---- access/session.h, and typcache.c's private registry header ----
#[repr(C)]
pub struct Session {
    pub segment: *mut pg_sys::dsm_segment,
    pub area: *mut pg_sys::dsa_area,
    pub shared_typmod_registry: *mut SharedRecordTypmodRegistry,
    pub shared_record_table: *mut c_void,
    pub shared_typmod_table: *mut c_void,
}

/// typcache.c's `struct SharedRecordTypmodRegistry` (PostgreSQL 11-18): only
/// `next_typmod` is read, to know whether any RECORD typmod exists in the session.
#[repr(C)]
pub struct SharedRecordTypmodRegistry {
    pub record_table_handle: pg_sys::dsa_pointer,
    pub typmod_table_handle: pg_sys::dsa_pointer,
    pub next_typmod: u32,
}

pub const PG_PROTOCOL_LATEST: u32 = 3 << 16;
pub const TTS_FLAG_EMPTY: u16 = 1 << 1;

// ---- libpq/libpq-be.h (16 on): what the client authenticated as ----
#[cfg(not(feature = "pg15"))]
#[repr(C)]
pub struct ClientConnectionInfo {
    pub authn_id: *const c_char,
    /// `UserAuth`, an enum.
    pub auth_method: c_int,
}

#[cfg(not(feature = "pg15"))]
extern "C" {
    pub static mut MyClientConnectionInfo: ClientConnectionInfo;
    pub fn RestoreClientConnectionInfo(conninfo: *mut c_char);
    pub fn InitializeSystemUser(authn_id: *const c_char, auth_method: *const c_char);
    pub fn GetSystemUser() -> *const c_char;
    pub fn hba_authname(auth_method: c_int) -> *const c_char;
    pub fn SetAuthenticatedUserId(userid: pg_sys::Oid);
}
#[cfg(feature = "pg15")]
extern "C" {
    pub fn SetAuthenticatedUserId(userid: pg_sys::Oid, is_superuser: bool);
}

extern "C" {
    pub static mut PqCommMethods: *const PQcommMethods;
    pub static mut FrontendProtocol: u32;
    pub static mut CurrentSession: *mut Session;
}

// The backend's pqsignal: a function of that name up to 17, `pqsignal_be` (returning
// nothing) behind a macro from 18 on.
#[cfg(not(feature = "pg18"))]
extern "C" {
    pub fn pqsignal(signo: c_int, func: unsafe extern "C" fn(c_int)) -> *mut c_void;
}
#[cfg(feature = "pg18")]
extern "C" {
    #[link_name = "pqsignal_be"]
    pub fn pqsignal(signo: c_int, func: unsafe extern "C" fn(c_int));
}

extern "C" {
    pub fn die(signo: c_int);
    pub fn StatementCancelHandler(signo: c_int);
    pub fn SignalHandlerForConfigReload(signo: c_int);
}

// Called without pgrx's error boundary: an ERROR longjmps to the caller's sigsetjmp.
extern "C-unwind" {
    pub fn dsm_attach(h: pg_sys::dsm_handle) -> *mut pg_sys::dsm_segment;
    pub fn dsm_detach(seg: *mut pg_sys::dsm_segment);
    pub fn dsm_segment_address(seg: *mut pg_sys::dsm_segment) -> *mut c_void;
    pub fn dsm_segment_handle(seg: *mut pg_sys::dsm_segment) -> pg_sys::dsm_handle;
    pub fn on_dsm_detach(
        seg: *mut pg_sys::dsm_segment,
        function: Option<unsafe extern "C-unwind" fn(*mut pg_sys::dsm_segment, pg_sys::Datum)>,
        arg: pg_sys::Datum,
    );
    pub fn shm_toc_attach(magic: u64, address: *mut c_void) -> *mut pg_sys::shm_toc;
    pub fn shm_toc_lookup(toc: *mut pg_sys::shm_toc, key: u64, no_error: bool) -> *mut c_void;
    pub fn shm_mq_set_sender(mq: *mut pg_sys::shm_mq, proc_: *mut pg_sys::PGPROC);
    pub fn shm_mq_attach(
        mq: *mut pg_sys::shm_mq,
        seg: *mut pg_sys::dsm_segment,
        handle: *mut pg_sys::BackgroundWorkerHandle,
    ) -> *mut pg_sys::shm_mq_handle;
    pub fn shm_mq_detach(mqh: *mut pg_sys::shm_mq_handle);
    pub fn shm_mq_sendv(
        mqh: *mut pg_sys::shm_mq_handle,
        iov: *mut pg_sys::shm_mq_iovec,
        iovcnt: c_int,
        nowait: bool,
        force_flush: bool,
    ) -> pg_sys::shm_mq_result::Type;
    pub fn shm_mq_receive(
        mqh: *mut pg_sys::shm_mq_handle,
        nbytesp: *mut usize,
        datap: *mut *mut c_void,
        nowait: bool,
    ) -> pg_sys::shm_mq_result::Type;

    pub fn BecomeLockGroupLeader();
    pub fn BecomeLockGroupMember(leader: *mut pg_sys::PGPROC, pid: c_int) -> bool;
    pub fn SetParallelStartTimestamps(xact_ts: pg_sys::TimestampTz, stmt_ts: pg_sys::TimestampTz);
    pub fn SetSessionAuthorization(userid: pg_sys::Oid, is_superuser: bool);
    pub fn SetCurrentRoleId(roleid: pg_sys::Oid, is_superuser: bool);
    pub fn SetUserIdAndSecContext(userid: pg_sys::Oid, sec_context: c_int);
    pub fn GetUserIdAndSecContext(userid: *mut pg_sys::Oid, sec_context: *mut c_int);
    pub fn StartTransactionCommand();
    pub fn CommitTransactionCommand();
    pub fn AbortOutOfAnyTransaction();
    pub fn RestoreGUCState(gucstate: *mut c_void);
    pub fn EstimateGUCStateSpace() -> usize;
    pub fn SerializeGUCState(maxsize: usize, start_address: *mut c_char);
    pub fn EstimateLibraryStateSpace() -> usize;
    pub fn RestoreLibraryState(start: *mut c_char);
    pub fn SerializeLibraryState(maxsize: usize, start_address: *mut c_char);
    pub fn StartParallelWorkerTransaction(tstatespace: *mut c_char);
    pub fn RestoreComboCIDState(space: *mut c_char);
    pub fn AttachSession(handle: pg_sys::dsm_handle);
    pub fn DetachSession();
    pub fn RestoreSnapshot(start_address: *mut c_char) -> pg_sys::Snapshot;
    pub fn RestoreTransactionSnapshot(snapshot: pg_sys::Snapshot, source_pgproc: *mut c_void);
    pub fn PushActiveSnapshot(snapshot: pg_sys::Snapshot);
    pub fn PopActiveSnapshot();
    pub fn InvalidateSystemCaches();
    pub fn SetTempNamespaceState(temp: pg_sys::Oid, temp_toast: pg_sys::Oid);
    pub fn RestorePendingSyncs(start_address: *mut c_char);
    pub fn RestoreReindexState(state: *const c_void);
    pub fn RestoreRelationMap(start_address: *mut c_char);
    pub fn RestoreUncommittedEnums(space: *mut c_void);
    pub fn EnterParallelMode();
    pub fn ExitParallelMode();
    pub fn ParallelQueryMain(seg: *mut pg_sys::dsm_segment, toc: *mut pg_sys::shm_toc);
    pub fn EmitErrorReport();
    pub fn FlushErrorState();
    pub fn LWLockAcquire(lock: *mut pg_sys::LWLock, mode: pg_sys::LWLockMode::Type) -> bool;
    pub fn LWLockRelease(lock: *mut pg_sys::LWLock);
    pub fn LockReleaseAll(lockmethodid: u16, all_locks: bool);
    pub fn ProcessInterrupts();
    pub fn WaitLatch(
        latch: *mut pg_sys::Latch,
        events: c_int,
        timeout: c_long,
        wait_event: u32,
    ) -> c_int;
    pub fn ResetLatch(latch: *mut pg_sys::Latch);
    pub fn SetLatch(latch: *mut pg_sys::Latch);
    pub fn pgstat_report_activity(state: pg_sys::BackendState::Type, cmd: *const c_char);
    pub fn MemoryContextReset(context: pg_sys::MemoryContext);
    pub fn MemoryContextAllocZero(context: pg_sys::MemoryContext, size: usize) -> *mut c_void;
    pub fn MemoryContextAlloc(context: pg_sys::MemoryContext, size: usize) -> *mut c_void;
    #[cfg(feature = "pg18")]
    pub fn AtEOXact_GUC(is_commit: bool, nest_level: c_int);
    pub fn pfree(pointer: *mut c_void);
    pub fn SetClientEncoding(encoding: c_int) -> c_int;
    pub fn GetDatabaseEncoding() -> c_int;
    pub fn ProcessConfigFile(context: pg_sys::GucContext::Type);
    pub fn proc_exit(code: c_int) -> !;

    // Leader side.
    pub fn ExecInitParallelPlan(
        planstate: *mut pg_sys::PlanState,
        estate: *mut pg_sys::EState,
        send_params: *mut pg_sys::Bitmapset,
        nworkers: c_int,
        tuples_needed: i64,
    ) -> *mut ParallelExecutorInfo;
    pub fn ExecParallelReinitialize(
        planstate: *mut pg_sys::PlanState,
        pei: *mut ParallelExecutorInfo,
        send_params: *mut pg_sys::Bitmapset,
    );
    pub fn ExecParallelFinish(pei: *mut ParallelExecutorInfo);
    pub fn ExecSetParamPlanMulti(
        params: *const pg_sys::Bitmapset,
        econtext: *mut pg_sys::ExprContext,
    );
    pub fn MakePerTupleExprContext(estate: *mut pg_sys::EState) -> *mut pg_sys::ExprContext;
    pub fn CreateTupleQueueReader(handle: *mut pg_sys::shm_mq_handle) -> *mut c_void;
    pub fn DestroyTupleQueueReader(reader: *mut c_void);
    pub fn TupleQueueReaderNext(
        reader: *mut c_void,
        nowait: bool,
        done: *mut bool,
    ) -> pg_sys::MinimalTuple;
    pub fn ExecStoreMinimalTuple(
        mtup: pg_sys::MinimalTuple,
        slot: *mut pg_sys::TupleTableSlot,
        should_free: bool,
    ) -> *mut pg_sys::TupleTableSlot;
    pub fn ExecReScan(node: *mut pg_sys::PlanState);
    pub fn pq_parse_errornotice(msg: *mut pg_sys::StringInfoData, edata: *mut pg_sys::ErrorData);
    pub fn ThrowErrorData(edata: *mut pg_sys::ErrorData);
    pub fn InstrAccumParallelQuery(
        bufusage: *mut pg_sys::BufferUsage,
        walusage: *mut pg_sys::WalUsage,
    );
    pub fn psprintf(fmt: *const c_char, ...) -> *mut c_char;
    pub fn palloc0(size: usize) -> *mut c_void;
    pub fn lappend(list: *mut pg_sys::List, datum: *mut c_void) -> *mut pg_sys::List;
    pub fn bms_next_member(a: *const pg_sys::Bitmapset, prevbit: c_int) -> c_int;

    // The Stride Gather's callbacks.
    pub fn ExecInitNode(
        node: *mut pg_sys::Plan,
        estate: *mut pg_sys::EState,
        eflags: c_int,
    ) -> *mut pg_sys::PlanState;
    pub fn ExecEndNode(node: *mut pg_sys::PlanState);
    pub fn ExecShutdownGather(node: *mut pg_sys::GatherState);
    pub fn ExecShutdownGatherMerge(node: *mut pg_sys::GatherMergeState);
    // lib/binaryheap.h (a Gather Merge's heap; its struct changes between majors, so it
    // is only passed through).
    pub fn binaryheap_reset(heap: *mut c_void);
    pub fn binaryheap_add_unordered(heap: *mut c_void, d: pg_sys::Datum);
    pub fn binaryheap_build(heap: *mut c_void);
    pub fn binaryheap_first(heap: *mut c_void) -> pg_sys::Datum;
    pub fn binaryheap_remove_first(heap: *mut c_void) -> pg_sys::Datum;
    pub fn binaryheap_replace_first(heap: *mut c_void, d: pg_sys::Datum);
    pub fn ExplainPropertyInteger(
        qlabel: *const c_char,
        unit: *const c_char,
        value: i64,
        es: *mut pg_sys::ExplainState,
    );
    pub fn ExplainPropertyBool(qlabel: *const c_char, value: bool, es: *mut pg_sys::ExplainState);
    pub fn ExplainPropertyText(
        qlabel: *const c_char,
        value: *const c_char,
        es: *mut pg_sys::ExplainState,
    );
    pub fn ExplainPropertyList(
        qlabel: *const c_char,
        data: *mut pg_sys::List,
        es: *mut pg_sys::ExplainState,
    );
    pub fn pstrdup(s: *const c_char) -> *mut c_char;
}

/// The wait events the pool reports (renamed in 17).
#[cfg(feature = "pg15")]
pub mod wait_event {
    use pgrx::pg_sys::WaitEventIPC::*;
    pub const MQ_PUT_MESSAGE: u32 = WAIT_EVENT_MQ_PUT_MESSAGE;
    pub const EXECUTE_GATHER: u32 = WAIT_EVENT_EXECUTE_GATHER;
    pub const PARALLEL_FINISH: u32 = WAIT_EVENT_PARALLEL_FINISH;
}
#[cfg(any(feature = "pg17", feature = "pg18"))]
pub mod wait_event {
    use pgrx::pg_sys::WaitEventIPC::*;
    pub const MQ_PUT_MESSAGE: u32 = WAIT_EVENT_MESSAGE_QUEUE_PUT_MESSAGE;
    pub const EXECUTE_GATHER: u32 = WAIT_EVENT_EXECUTE_GATHER;
    pub const PARALLEL_FINISH: u32 = WAIT_EVENT_PARALLEL_FINISH;
}
