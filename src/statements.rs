//! Which top-level statements of this backend are registered with pg_stride.
//!
//! A statement is registered when the executor starts it and unregistered when the
//! executor ends it. When a statement fails, is cancelled or times out, ExecutorEnd never
//! runs; its portal's resource owner is released instead, and the release callback
//! below unregisters every statement started under that owner (DESIGN.md §2, §4 rule 8).
//! When the process exits, its shared entry is cleared by a `before_shmem_exit` callback;
//! a process that dies without running it (SIGKILL) makes the postmaster reinitialise
//! shared memory, and the scheduler worker clears entries of processes that are gone.

use crate::groups;
use crate::shmem::{self, ProcEntry};
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;

/// A statement this backend registered, and the resource owner that was current when
/// the executor started it (the portal's owner).
struct Registration {
    desc: *const pg_sys::QueryDesc,
    owner: pg_sys::ResourceOwner,
}

thread_local! {
    static REGISTERED: RefCell<Vec<Registration>> = const { RefCell::new(Vec::new()) };
    static EXIT_CALLBACK_SET: Cell<bool> = const { Cell::new(false) };
}

/// Registers the resource-release callback. Called once from `_PG_init`; the callback
/// list lives in process memory and is inherited by every backend the postmaster forks.
pub fn install() {
    // SAFETY: called single-threaded from _PG_init; the callback is guarded.
    unsafe {
        pg_sys::RegisterResourceReleaseCallback(Some(on_resource_release), std::ptr::null_mut())
    };
}

/// Records that `desc` is a running top-level statement of this backend, in the
/// session's resource group.
pub fn register(desc: *const pg_sys::QueryDesc) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let Some(entry) = shared.my_entry() else {
        return;
    };
    claim(entry);
    let group = groups::resolve_session_group(&shared.groups);
    entry.group.store(group as u32, Ordering::Release);
    shared
        .groups
        .counters(group)
        .admitted
        .fetch_add(1, Ordering::Relaxed);
    // SAFETY: CurrentResourceOwner is a plain process-local global.
    let owner = unsafe { pg_sys::CurrentResourceOwner };
    REGISTERED.with_borrow_mut(|list| list.push(Registration { desc, owner }));
    entry.running.fetch_add(1, Ordering::AcqRel);
}

/// Forgets `desc` if it was registered; returns whether it was.
pub fn unregister(desc: *const pg_sys::QueryDesc) -> bool {
    unregister_where(|r| r.desc == desc) > 0
}

/// Forgets every registration that matches, keeps the shared count in step, and
/// returns how many there were.
fn unregister_where(matches: impl Fn(&Registration) -> bool) -> usize {
    let removed = REGISTERED.with_borrow_mut(|list| {
        let before = list.len();
        list.retain(|r| !matches(r));
        before - list.len()
    });
    if removed > 0 {
        if let Some(entry) = shmem::shared().and_then(|s| s.my_entry()) {
            entry.running.fetch_sub(removed as u32, Ordering::AcqRel);
        }
    }
    removed
}

/// Makes this process the owner of its shared entry. An entry still naming another pid
/// belonged to an earlier process with the same PGPROC; whatever it says is stale.
fn claim(entry: &ProcEntry) {
    // SAFETY: plain read of a process-local global.
    let me = unsafe { pg_sys::MyProcPid };
    if entry.pid.load(Ordering::Acquire) != me {
        entry.reset();
        entry.pid.store(me, Ordering::Release);
    }
    if !EXIT_CALLBACK_SET.replace(true) {
        // SAFETY: registers a guarded callback in this process's own exit list (the
        // postmaster's list is reset in every child, so this must happen here).
        unsafe { pg_sys::before_shmem_exit(Some(on_exit), pg_sys::Datum::from(0)) };
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_resource_release(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    _is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_BEFORE_LOCKS {
        return;
    }
    // SAFETY: while a resource owner is released, PostgreSQL makes it the
    // CurrentResourceOwner (ResourceOwnerReleaseInternal), so this names the owner
    // being released.
    let owner = unsafe { pg_sys::CurrentResourceOwner };
    unregister_where(|r| r.owner == owner);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    REGISTERED.with_borrow_mut(|list| list.clear());
    if let Some(entry) = shmem::shared().and_then(|s| s.my_entry()) {
        entry.reset();
    }
}
