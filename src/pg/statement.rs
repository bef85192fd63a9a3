//! A statement's text, plan and what it did, as the executor hooks read them: its text
//! (its group tag, its fingerprint), relation key, query identifier and cost, the memory
//! context a saved plan lives in, and the blocks the backend touched. Plain reads that
//! cannot raise an ERROR on the plans the executor runs: the hooks call them outside
//! pgrx's error boundary.

use pgrx::pg_sys;

mod ffi {
    use pgrx::pg_sys;

    // Declared here, not called through pgrx's bindings, which enter its guarded FFI
    // boundary: functions called outside it, which raise no ERROR for what they are
    // given (GetMemoryChunkContext would for a pointer palloc did not return).
    extern "C" {
        /// Reads a chunk's header (an inline function before PostgreSQL 16).
        #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
        pub fn GetMemoryChunkContext(pointer: *mut std::ffi::c_void) -> pg_sys::MemoryContext;
        pub fn MemoryContextRegisterResetCallback(
            context: pg_sys::MemoryContext,
            callback: *mut pg_sys::MemoryContextCallback,
        );
    }
}

/// A statement's text: the query string it came in, where in it the statement starts and
/// how long it is (its PlannedStmt's `stmt_location` and `stmt_len`; a length of 0: to
/// the string's end), for reading its group tag and taking its fingerprint.
#[derive(Clone, Copy)]
pub struct StatementText {
    source: *const std::ffi::c_char,
    location: i32,
    len: i32,
}

impl StatementText {
    /// The text of the statement a utility hook is given.
    ///
    /// # Safety
    /// `source` is a NUL-terminated string that stays valid while the value is used:
    /// the query string ProcessUtility receives, while the utility runs.
    pub unsafe fn new(source: *const std::ffi::c_char, location: i32, len: i32) -> Self {
        Self {
            source,
            location,
            len,
        }
    }

    /// The text of the statement `desc` runs. Copied, so that its fingerprint can be
    /// taken once the plan is gone, while the query string is not.
    ///
    /// # Safety
    /// `desc` is a valid QueryDesc with its PlannedStmt, as the executor's hooks
    /// receive it.
    pub unsafe fn of(desc: *const pg_sys::QueryDesc) -> Self {
        // SAFETY: the caller's promise.
        unsafe {
            let stmt = (*desc).plannedstmt;
            Self::new((*desc).sourceText, (*stmt).stmt_location, (*stmt).stmt_len)
        }
    }

    /// The statement's fingerprint in this database for this role, from its text with
    /// its constants left out (`pg_stride_sched::fingerprint`), mixed with the database's
    /// OID (the same text in two databases reads other tables) and the session's role
    /// (SET ROLE's, not a SECURITY DEFINER function's owner: what one role's runs taught
    /// must not change how another's statements are admitted).
    ///
    /// # Safety
    /// The query string is still allocated (it is NUL-terminated).
    pub unsafe fn fingerprint(self) -> u64 {
        let start = usize::try_from(self.location).unwrap_or(0);
        // Read no further than the statement's end: a script's string can be long, and
        // each of its statements would otherwise measure all of it.
        let end = match usize::try_from(self.len) {
            Ok(len) if len > 0 => start.saturating_add(len),
            _ => usize::MAX,
        };
        let text = if self.source.is_null() {
            &[][..]
        } else {
            // SAFETY: a non-null query string is NUL-terminated and allocated (the
            // caller's promise); the bytes read are those before its NUL, up to `end`.
            unsafe {
                let bytes = libc::strnlen(self.source, end);
                std::slice::from_raw_parts(self.source.cast::<u8>(), bytes)
            }
        };
        // SAFETY: a plain read of a global set when the backend connected.
        let database = u64::from(unsafe { pg_sys::MyDatabaseId }.to_u32());
        // SAFETY: a plain read of the session's outer user id (SET ROLE's).
        let role = u64::from(unsafe { pg_sys::GetOuterUserId() }.to_u32());
        // Odd multipliers, so that the mix maps distinct databases, and distinct roles,
        // to distinct values; a 0 (the empty entry of a fingerprint table) becomes 1.
        let mixed = pg_stride_sched::fingerprint::of_text(&text[start.min(text.len())..])
            ^ database.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ role.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        mixed.max(1)
    }

    /// The text of the statement the active portal runs, if a portal is running; to be
    /// read while that portal runs.
    pub fn of_active_portal() -> Option<Self> {
        // SAFETY: the active portal, when there is one, is valid while it runs; its
        // statement list is a list of PlannedStmts that live as long as the portal, and
        // its query string too.
        unsafe {
            let portal = pg_sys::ActivePortal.as_ref()?;
            // The first element read from the List's array: PgList::head() would call
            // list_nth through pgrx's guarded FFI boundary, a sigsetjmp per statement.
            let stmts = portal.stmts;
            let first = (!stmts.is_null() && (*stmts).length > 0)
                .then(|| (*(*stmts).elements).ptr_value.cast::<pg_sys::PlannedStmt>());
            let (location, len) = first
                .and_then(|p| p.as_ref())
                .map_or((0, 0), |p| (p.stmt_location, p.stmt_len));
            Some(Self::new(portal.sourceText, location, len))
        }
    }

    /// The resource group the statement names in a comment before its first word
    /// (`pg_stride_sched::group_tag`), if it names one.
    #[inline]
    pub fn group_tag(self) -> Option<String> {
        if self.source.is_null() {
            return None;
        }
        // A statement whose text starts with its first word carries no tag (the common
        // case): told from its first byte, without measuring the whole query string.
        // SAFETY: a non-null source is NUL-terminated and valid (the constructors'
        // contract), so its first byte can be read.
        if self.location <= 0 && unsafe { *self.source as u8 }.is_ascii_alphabetic() {
            return None;
        }
        self.parse_group_tag()
    }

    /// [`Self::group_tag`] of a text that may carry one, out of line (it allocates).
    #[inline(never)]
    fn parse_group_tag(self) -> Option<String> {
        // SAFETY: a non-null source is NUL-terminated and valid (the constructors'
        // contract).
        let source = unsafe { std::ffi::CStr::from_ptr(self.source) }.to_bytes();
        let location = usize::try_from(self.location).unwrap_or(0);
        pg_stride_sched::group_tag::statement_group(source, location)
            .map(|g| String::from_utf8_lossy(&g).into_owned())
    }
}

/// The fingerprint of the statement `desc` runs ([`StatementText::fingerprint`]).
///
/// # Safety
/// `desc` is a valid QueryDesc with its PlannedStmt and source text, as the executor's
/// hooks receive it.
pub unsafe fn statement_fingerprint(desc: *const pg_sys::QueryDesc) -> u64 {
    // SAFETY: the caller's promise.
    unsafe { StatementText::of(desc).fingerprint() }
}

/// A planned statement's relation key: the first of the relations its plan depends on
/// (`relationOids`, in range-table order: for a write, usually its target; the view a
/// query reads; `regclass` constants folded into a custom plan follow them, so a
/// statement that reads no table can have another key in its generic plan), 0 if it
/// depends on none. With its fingerprint, what a statement that ran long is known by
/// (`cpu::ran_long`).
/// Plain reads, which cannot panic.
///
/// # Safety
/// `stmt` is a valid PlannedStmt, as ExecutorStart's QueryDesc holds one.
pub unsafe fn statement_relation(stmt: *const pg_sys::PlannedStmt) -> u32 {
    // SAFETY: the caller's promise; relationOids is NIL or a list of OIDs.
    let relations = unsafe { (*stmt).relationOids };
    if relations.is_null() {
        return 0;
    }
    // SAFETY: a non-NIL list has at least one element, an OID in an OID list.
    unsafe { (*(*relations).elements).oid_value.to_u32() }
}

/// The memory context holding `stmt` if it is a plan saved in the plan cache, in a
/// context of its own: plancache.c makes each plan's context ("CachedPlan"), moves a
/// saved statement's (a named or unnamed statement prepared at the protocol level, an
/// SPI plan kept) under CacheMemoryContext, and frees the plan only by deleting that
/// context. `None` for any other plan (a query sent as text, a one-shot plan), and for
/// another module's PlannedStmt that happens to live under CacheMemoryContext.
///
/// # Safety
/// `stmt` is a valid PlannedStmt allocated with palloc, as the planner and copyObject
/// make every one: for another pointer, PostgreSQL 16 and later raise an ERROR, and
/// earlier majors read what precedes it.
pub unsafe fn saved_plan_context(
    stmt: *const pg_sys::PlannedStmt,
) -> Option<pg_sys::MemoryContext> {
    // SAFETY: the caller's promise: a palloc'd chunk, which its context's header
    // precedes; before PostgreSQL 16 that header ends with the context's address
    // (memutils.h's GetMemoryChunkContext, an inline function there).
    let context = unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
        {
            *stmt.cast::<pg_sys::MemoryContext>().sub(1)
        }
        #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
        {
            ffi::GetMemoryChunkContext(stmt.cast_mut().cast())
        }
    };
    // SAFETY: a live chunk's context is a valid MemoryContext, whose name is a
    // NUL-terminated string; CacheMemoryContext is a global set once per process.
    let saved = !context.is_null()
        && unsafe {
            (*context).parent == pg_sys::CacheMemoryContext
                && !(*context).name.is_null()
                && std::ffi::CStr::from_ptr((*context).name) == c"CachedPlan"
        };
    saved.then_some(context)
}

/// Has PostgreSQL call `callback` once, when `context` is next reset or deleted, before
/// its memory is freed.
///
/// # Safety
/// `context` is a valid MemoryContext; `callback` stays valid, and is not registered
/// again, until it has been called (the context keeps it in a list).
pub unsafe fn call_at_reset(
    context: pg_sys::MemoryContext,
    callback: *mut pg_sys::MemoryContextCallback,
) {
    // SAFETY: the caller's promise; pushing onto the context's list raises no ERROR.
    unsafe { ffi::MemoryContextRegisterResetCallback(context, callback) }
}

/// Blocks this backend touched so far: in shared buffers and its own temporary tables'
/// (hits and reads), and in temporary files (read and written). The difference between
/// two readings is what the backend touched in between.
pub fn blocks_touched() -> i64 {
    let usage = &raw const pg_sys::pgBufferUsage;
    // SAFETY: plain reads of the backend's own counters, a global PostgreSQL keeps.
    unsafe {
        (*usage).shared_blks_hit
            + (*usage).shared_blks_read
            + (*usage).local_blks_hit
            + (*usage).local_blks_read
            + (*usage).temp_blks_read
            + (*usage).temp_blks_written
    }
}

/// A planned statement's query identifier (0 when none was computed) and its plan's
/// total cost (0 without a plan): what a prediction of its CPU is keyed by.
///
/// # Safety
/// `stmt` is a valid PlannedStmt, as ExecutorStart's QueryDesc holds one.
pub unsafe fn query_id_and_cost(stmt: *const pg_sys::PlannedStmt) -> (u64, f64) {
    // SAFETY: the caller's promise; the plan, when there is one, is part of it. queryId
    // is a uint64 before PostgreSQL 18 and an int64 from 18 on.
    #[allow(clippy::unnecessary_cast)]
    unsafe {
        let plan = (*stmt).planTree;
        (
            (*stmt).queryId as u64,
            if plan.is_null() {
                0.0
            } else {
                (*plan).total_cost
            },
        )
    }
}
