//! Which settings a pool worker has in force: its own baseline, or the settings of the
//! leader it last served.
//!
//! `RestoreGUCState` resets every setting a leader may ship before it applies the
//! leader's, so the settings it leaves depend on the serialized state alone. A worker
//! therefore keeps a leader's settings after a fragment that ended well, with a copy of
//! the state they came from, and the next fragment whose leader ships the same bytes
//! (the same session settings: the usual case for an application's connections) starts
//! without restoring them: a restore is a large part of a fragment's set-up (it reads the
//! time zone abbreviations file again), and so was going back to the baseline after
//! every fragment (docs/design.md §6).
//!
//! The baseline comes back before anything that reads this process's own settings: a
//! configuration reload, loading a library a leader has, and whenever a fragment that
//! began a restore did not end well (the state is then not known). A leader's settings
//! that are not in force are restored from the baseline, as a fresh parallel worker
//! restores them (worker.rs says why, for `role`).

use super::ffi::*;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int, c_void};

/// The leader's users a restore records besides the settings: while a parallel worker
/// initializes, the check hooks of `session_authorization` and `role` copy the session
/// user and the current role, with their superuser flags, into what they keep for the
/// setting (used again when a function's SET clause of either ends). Two leaders can
/// ship the same bytes with other users behind the names (a role renamed, or made
/// superuser, between their logins).
#[derive(Clone, Copy, PartialEq)]
pub(super) struct Users {
    pub session_user: pg_sys::Oid,
    pub session_user_is_superuser: bool,
    pub outer_user: pg_sys::Oid,
    pub role_is_superuser: bool,
}

/// Users of no leader, before a fragment has any.
pub(super) const NO_USERS: Users = Users {
    session_user: pg_sys::InvalidOid,
    session_user_is_superuser: false,
    outer_user: pg_sys::InvalidOid,
    role_is_superuser: false,
};

/// What is in force, besides the settings every worker has.
#[derive(Clone, Copy, PartialEq)]
enum InForce {
    Baseline,
    /// A leader's settings, with a copy (in TopMemoryContext) of the serialized state
    /// they were restored from and the users they were restored for.
    Leader(*mut c_char, Users),
    /// A restore began and its fragment has not yet ended well.
    Unknown,
}

// Process-local state of the worker (one thread; statics because a longjmp skips Rust
// frames).
static mut IN_FORCE: InForce = InForce::Baseline;
static mut BASELINE_GUC: *mut c_char = std::ptr::null_mut();
static mut OWN_LIBRARIES: *mut c_char = std::ptr::null_mut();
/// Settings and placeholders this process had at its baseline (GetNumConfigOptions):
/// a fragment whose leader's settings added a placeholder leaves it behind.
static mut BASELINE_OPTIONS: c_int = 0;

/// Bytes of a state `SerializeGUCState` wrote: its length word and what follows.
///
/// # Safety
/// `state` is such a state.
unsafe fn serialized_len(state: *const c_char) -> usize {
    // SAFETY: the caller's promise; the length word may be unaligned.
    let len = unsafe { std::ptr::read_unaligned(state.cast::<usize>()) };
    std::mem::size_of::<usize>() + len
}

/// Whether the settings `state` would restore for `users` are the ones in force.
///
/// # Safety
/// `state` is a leader's serialized settings.
pub(super) unsafe fn in_force(state: *const c_char, users: Users) -> bool {
    // SAFETY: the caller's promise; the kept copy is a whole serialized state.
    unsafe {
        let InForce::Leader(kept, kept_users) = IN_FORCE else {
            return false;
        };
        if kept_users != users {
            return false;
        }
        let len = serialized_len(state);
        len == serialized_len(kept) && libc::memcmp(state.cast(), kept.cast(), len) == 0
    }
}

/// Restores a leader's settings (`RestoreGUCState`; the caller provides the transaction
/// and `InitializingParallelWorker`). Until [`keep`], what is in force is unknown.
///
/// # Safety
/// `state` is the leader's serialized settings; the caller's sigsetjmp catches ERRORs.
pub(super) unsafe fn restore_leader(state: *mut c_char) {
    // SAFETY: the caller's promise.
    unsafe {
        forget_leader();
        RestoreGUCState(state.cast::<c_void>());
    }
}

/// After a fragment that ended well and restored `state` for `users`: its settings stay
/// in force.
///
/// # Safety
/// `state` is the fragment's serialized settings, still mapped.
pub(super) unsafe fn keep(state: *const c_char, users: Users) {
    // SAFETY: the caller's promise; the copy lives in TopMemoryContext until replaced.
    unsafe {
        let len = serialized_len(state);
        let copy = MemoryContextAlloc(pg_sys::TopMemoryContext, len).cast::<c_char>();
        std::ptr::copy_nonoverlapping(state, copy, len);
        IN_FORCE = InForce::Leader(copy, users);
    }
}

/// Frees the copy of a leader's settings, if there is one; what is in force is then
/// unknown until the caller says.
unsafe fn forget_leader() {
    // SAFETY: the copy was allocated by `keep` and nothing else points to it.
    unsafe {
        if let InForce::Leader(kept, _) = IN_FORCE {
            pfree(kept.cast());
        }
        IN_FORCE = InForce::Unknown;
    }
}

/// Puts this process's own settings back in force, unless they are. Until it returns,
/// what is in force is unknown (an ERROR in a fragment's sigsetjmp leaves it so).
///
/// # Safety
/// In a pool worker outside any transaction; the caller catches an ERROR, or it ends
/// the process.
pub(super) unsafe fn back_to_baseline() {
    // SAFETY: the caller's promise; as in ParallelWorkerMain, the restore runs in a
    // transaction with InitializingParallelWorker set, so that the identity settings are
    // taken as they are.
    unsafe {
        if IN_FORCE == InForce::Baseline {
            return;
        }
        forget_leader();
        let initializing = pg_sys::InitializingParallelWorker;
        pg_sys::InitializingParallelWorker = true;
        StartTransactionCommand();
        RestoreGUCState(BASELINE_GUC.cast());
        CommitTransactionCommand();
        pg_sys::InitializingParallelWorker = initializing;
        keep_database_encoding();
        IN_FORCE = InForce::Baseline;
    }
}

/// Sends this process's messages to leaders in the database's encoding again, as a
/// parallel worker does (ParallelWorkerMain), which is what a leader reads them in.
/// Between fragments this process is no parallel worker, so a `client_encoding` that
/// its own settings restore (`ALTER DATABASE … SET`, postgresql.conf) takes effect:
/// the notices and errors of its next fragments would reach the leader converted to
/// that encoding, garbled, or fail in the worker for a character it lacks.
///
/// # Safety
/// In a pool worker.
pub(super) unsafe fn keep_database_encoding() {
    // SAFETY: the caller's promise; the database's encoding is always a valid one.
    unsafe {
        SetClientEncoding(GetDatabaseEncoding());
    }
}

/// After a fragment: back to the baseline if what is in force is not known.
///
/// # Safety
/// As [`back_to_baseline`].
pub(super) unsafe fn settle() {
    // SAFETY: the caller's promise.
    unsafe {
        if IN_FORCE == InForce::Unknown {
            back_to_baseline();
        }
    }
}

/// Serialises this process's own settings and loaded libraries, with its own settings in
/// force: the state [`back_to_baseline`] goes back to, and the libraries it has (a
/// leader's others are loaded before its fragment runs).
///
/// # Safety
/// In a pool worker outside any transaction, with the baseline in force.
pub(super) unsafe fn take_baseline() {
    // SAFETY: the caller's promise; the buffers live in TopMemoryContext until replaced.
    unsafe {
        // The new buffers are filled before the old ones are freed: an ERROR in between
        // leaves the old baseline whole.
        StartTransactionCommand();
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = pg_sys::TopMemoryContext;
        let size = EstimateGUCStateSpace();
        let settings = MemoryContextAllocZero(pg_sys::TopMemoryContext, size).cast();
        SerializeGUCState(size, settings);
        let size = EstimateLibraryStateSpace();
        let libraries = MemoryContextAllocZero(pg_sys::TopMemoryContext, size).cast();
        SerializeLibraryState(size, libraries);
        for old in [BASELINE_GUC, OWN_LIBRARIES] {
            if !old.is_null() {
                pfree(old.cast());
            }
        }
        BASELINE_GUC = settings;
        OWN_LIBRARIES = libraries;
        BASELINE_OPTIONS = config_option_count();
        pg_sys::CurrentMemoryContext = previous;
        CommitTransactionCommand();
    }
}

/// Loads for good the libraries of the leader's list that this process lacks, as
/// ParallelWorkerMain's RestoreLibraryState would, and takes a new baseline that includes
/// the settings they define. Returns whether anything was loaded.
///
/// # Safety
/// In a pool worker outside any transaction; `leader` is the leader's list in
/// SerializeLibraryState's format; the caller's sigsetjmp catches ERRORs.
pub(super) unsafe fn load_libraries(leader: *mut c_char) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        if libraries_loaded(leader) {
            return false;
        }
        // A library takes the values in force for the settings it defines.
        back_to_baseline();
        StartTransactionCommand();
        RestoreLibraryState(leader);
        CommitTransactionCommand();
        take_baseline();
        true
    }
}

/// Whether a leader's settings left a placeholder this process did not have.
pub(super) fn added_placeholders() -> bool {
    // SAFETY: a plain read of a process-local count.
    config_option_count() != unsafe { BASELINE_OPTIONS }
}

/// How many settings (placeholders included) this process knows.
fn config_option_count() -> c_int {
    #[cfg(feature = "pg15")]
    // SAFETY: a plain read of guc.c's count of its variables.
    unsafe {
        pg_sys::GetNumConfigOptions()
    }
    #[cfg(not(feature = "pg15"))]
    // SAFETY: guc.c's array of its variables and their count; only the count is read.
    unsafe {
        let mut n: c_int = 0;
        pg_sys::get_guc_variables(&mut n);
        n
    }
}

/// Whether every library of the leader's list (SerializeLibraryState's format: names
/// each ended by NUL, then an empty name) is loaded here.
unsafe fn libraries_loaded(leader: *const c_char) -> bool {
    // SAFETY: both lists are in SerializeLibraryState's format.
    unsafe {
        let mut p = leader;
        while *p != 0 {
            let mut q = OWN_LIBRARIES.cast_const();
            let mut found = false;
            while *q != 0 {
                if libc::strcmp(p, q) == 0 {
                    found = true;
                    break;
                }
                q = q.add(libc::strlen(q) + 1);
            }
            if !found {
                return false;
            }
            p = p.add(libc::strlen(p) + 1);
        }
        true
    }
}
