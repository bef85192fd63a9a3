//! Who a pool worker is while it runs a fragment, and again afterwards.
//!
//! A pool worker connects as the bootstrap superuser (it serves every role of its
//! database). For a fragment it must be exactly what a parallel worker of the same
//! leader is (docs/design.md, safety rule 11): PostgreSQL decides whether
//! `session_authorization` may change from the *authenticated* user, so taking on the
//! leader's session and current user alone would leave every `SET session_authorization`
//! of a function's SET clause to the superuser's rights. So, in `ParallelWorkerMain`'s
//! order:
//!
//! 1. the authenticated user (and, in 15, whether it is a superuser), which also marks
//!    the PGPROC with that role, as a parallel worker's is;
//! 2. the session and outer user (`SetSessionAuthorization`, `SetCurrentRoleId`);
//! 3. from 16 on, the client connection's authenticated identity, which `system_user`
//!    shows.
//!
//! It also shows the leader's session user as its own in `pg_stat_activity`, as a
//! parallel worker does. [`restore_own`] undoes all of it. PostgreSQL's
//! `SetAuthenticatedUserId` and `InitializeSystemUser` assert that they run once per
//! process; a server built with assertions therefore gets no pool (the leader falls
//! back, `leader.rs`).
//!
//! `system_user` cannot be unset once set (PostgreSQL keeps it in a private static): a
//! worker that served a leader with an authenticated identity is marked
//! (`Slot::system_user_set`), and leaders without one do not post to it.
//!
//! A parallel worker exits after its one fragment; a pool worker lives on, and keeps
//! what the fragment left in the process beyond identity and settings, which nothing
//! can reset: PL/pgSQL functions compiled under the leader's search_path (a temporary
//! type or function of the leader's session among the names they resolved), PL/Python's
//! and PL/Perl's session data, `setseed`'s state. So a worker serves the leaders of one
//! identity only — authenticated, session and outer user — the first it served
//! (`Slot::served`, [`may_serve`]): what one role's fragment leaves there reaches no
//! other role's. Leaders of another identity do not post to it, and a fragment that
//! reaches it all the same is declined and the worker retires.

use super::ffi::*;
use pgrx::pg_sys;
use std::ffi::c_int;
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// The worker's own identity, taken once at its start.
#[derive(Clone, Copy)]
pub(super) struct Own {
    user: pg_sys::Oid,
    sec_context: c_int,
    /// `MyProc->roleId`: what `SetAuthenticatedUserId` overwrites (InvalidOid for a
    /// background worker connected without a role).
    proc_role: pg_sys::Oid,
    /// The user `pg_stat_activity` shows for it ([`show_as`]).
    shown_user: pg_sys::Oid,
}

/// The identity the worker has now; call once, after connecting.
///
/// # Safety
/// In a pool worker with its PGPROC.
pub(super) unsafe fn own() -> Own {
    let mut own = Own {
        user: pg_sys::InvalidOid,
        sec_context: 0,
        proc_role: pg_sys::InvalidOid,
        shown_user: pg_sys::InvalidOid,
    };
    // SAFETY: the caller's promise; process-local globals, and this process's own
    // status entry, when it has one.
    unsafe {
        GetUserIdAndSecContext(&raw mut own.user, &raw mut own.sec_context);
        own.proc_role = (*pg_sys::MyProc).roleId;
        if let Some(entry) = pg_sys::MyBEEntry.as_ref() {
            own.shown_user = entry.st_userid;
        }
    }
    own
}

/// Shows `user` as this process's user in `pg_stat_activity` (`st_userid`, which
/// PostgreSQL sets once, when a backend connects; a parallel worker connects as its
/// leader's session user, and so shows it, to whom PostgreSQL then shows its query as
/// it shows the leader's). Written under the status entry's change count, as
/// pgstat_report_activity writes (PGSTAT_BEGIN_WRITE_ACTIVITY, a macro): a reader copies
/// the entry again while the count is odd or has changed.
///
/// # Safety
/// In a pool worker, holding no spinlock.
unsafe fn show_as(user: pg_sys::Oid) {
    // SAFETY: the caller's promise; this process's own entry, which only it writes.
    unsafe {
        let entry = pg_sys::MyBEEntry;
        if entry.is_null() {
            return;
        }
        pg_sys::CritSectionCount += 1;
        let count = &raw mut (*entry).st_changecount;
        count.write_volatile(count.read_volatile().wrapping_add(1));
        fence(Ordering::Release);
        (&raw mut (*entry).st_userid).write_volatile(user);
        fence(Ordering::Release);
        count.write_volatile(count.read_volatile().wrapping_add(1));
        pg_sys::CritSectionCount -= 1;
    }
}

/// Takes the leader's authenticated, session and outer user (steps 1 and 2).
///
/// # Safety
/// `fps` is the leader's FixedParallelState; the caller's sigsetjmp catches ERRORs.
pub(super) unsafe fn adopt_users(fps: *const FixedParallelState) {
    // SAFETY: the caller's promise.
    unsafe {
        #[cfg(feature = "pg15")]
        SetAuthenticatedUserId(
            (*fps).authenticated_user_id,
            (*fps).authenticated_user_is_superuser,
        );
        #[cfg(not(feature = "pg15"))]
        SetAuthenticatedUserId((*fps).authenticated_user_id);
        SetSessionAuthorization((*fps).session_user_id, (*fps).session_user_is_superuser);
        SetCurrentRoleId((*fps).outer_user_id, (*fps).role_is_superuser);
        show_as((*fps).session_user_id);
    }
}

/// Takes the leader's client connection identity (step 3). Returns false when it cannot
/// be taken: the leader has none and this worker's `system_user` is already set.
///
/// # Safety
/// `toc` is the table of contents of the leader's parallel segment.
#[cfg(not(feature = "pg15"))]
pub(super) unsafe fn adopt_connection(toc: *mut pg_sys::shm_toc) -> bool {
    // SAFETY: the caller's promise; the key every parallel context has from 16 on.
    unsafe {
        let previous = GetSystemUser();
        RestoreClientConnectionInfo(shm_toc_lookup(toc, PARALLEL_KEY_CLIENTCONNINFO, false).cast());
        let authn_id = MyClientConnectionInfo.authn_id;
        if authn_id.is_null() {
            return previous.is_null();
        }
        InitializeSystemUser(authn_id, hba_authname(MyClientConnectionInfo.auth_method));
        if !previous.is_null() {
            pfree(previous.cast_mut().cast());
        }
        true
    }
}

/// A leader's identity as its parallel segment carries it: authenticated, session and
/// outer user.
pub(super) type Users = [pg_sys::Oid; 3];

/// This backend's identity as a leader: what `InitializeParallelDSM` writes into its
/// segment's FixedParallelState.
pub(super) fn leader_users() -> Users {
    // SAFETY: plain reads of the backend's process-local identity, set at connection.
    unsafe {
        [
            pg_sys::GetAuthenticatedUserId(),
            pg_sys::GetSessionUserId(),
            pg_sys::GetCurrentRoleId(),
        ]
    }
}

/// The identity carried by a leader's FixedParallelState.
///
/// # Safety
/// `fps` is a leader's FixedParallelState.
pub(super) unsafe fn users_of(fps: *const FixedParallelState) -> Users {
    // SAFETY: the caller's promise.
    unsafe {
        [
            (*fps).authenticated_user_id,
            (*fps).session_user_id,
            (*fps).outer_user_id,
        ]
    }
}

/// Whether a worker that served `served` (InvalidOid: nobody yet) may serve `users`.
pub(super) fn may_serve(served: &[AtomicU32; 3], users: Users) -> bool {
    !has_served(served)
        || served
            .iter()
            .zip(users)
            .all(|(s, u)| s.load(Ordering::Acquire) == u32::from(u))
}

/// Whether a worker serves some identity already (it ran a fragment since it started).
pub(super) fn has_served(served: &[AtomicU32; 3]) -> bool {
    served[0].load(Ordering::Acquire) != u32::from(pg_sys::InvalidOid)
}

/// Records that the worker serves `users` from now on.
pub(super) fn mark_served(served: &[AtomicU32; 3], users: Users) {
    for (s, u) in served.iter().zip(users) {
        s.store(u.into(), Ordering::Release);
    }
}

/// Whether this process's `system_user` is set (it stays set: see the module comment).
pub(super) fn system_user_set() -> bool {
    #[cfg(feature = "pg15")]
    return false;
    // SAFETY: a plain read of PostgreSQL's process-local value.
    #[cfg(not(feature = "pg15"))]
    unsafe {
        !GetSystemUser().is_null()
    }
}

/// Whether this backend, a leader, has a client identity that `system_user` shows.
pub(super) fn leader_has_system_user() -> bool {
    #[cfg(feature = "pg15")]
    return false;
    // SAFETY: a plain read of PostgreSQL's process-local value.
    #[cfg(not(feature = "pg15"))]
    unsafe {
        !MyClientConnectionInfo.authn_id.is_null()
    }
}

/// Back to the worker's own identity, whatever point the fragment reached.
///
/// # Safety
/// In a pool worker, after the fragment's transaction was aborted.
pub(super) unsafe fn restore_own(own: &Own) {
    // SAFETY: the caller's promise; each call undoes one of the adopt steps.
    unsafe {
        #[cfg(not(feature = "pg15"))]
        {
            if !MyClientConnectionInfo.authn_id.is_null() {
                pfree(MyClientConnectionInfo.authn_id.cast_mut().cast());
            }
            MyClientConnectionInfo.authn_id = std::ptr::null();
            MyClientConnectionInfo.auth_method = 0;
        }
        let bootstrap = pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID);
        #[cfg(feature = "pg15")]
        SetAuthenticatedUserId(bootstrap, true);
        #[cfg(not(feature = "pg15"))]
        SetAuthenticatedUserId(bootstrap);
        (*pg_sys::MyProc).roleId = own.proc_role;
        SetSessionAuthorization(bootstrap, true);
        SetCurrentRoleId(pg_sys::InvalidOid, false);
        SetUserIdAndSecContext(own.user, own.sec_context);
        show_as(own.shown_user);
    }
}
