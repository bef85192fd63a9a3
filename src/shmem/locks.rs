//! pg_stride's LWLocks: one tranche named "pg_stride" of LOCK_COUNT locks, requested and
//! found by mod.rs at start-up, and the guard that holds one.

use pgrx::pg_sys;
use std::sync::atomic::{AtomicPtr, Ordering};

pub(super) static LOCKS: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(std::ptr::null_mut());

/// pg_stride's LWLocks, one tranche named "pg_stride".
#[derive(Clone, Copy)]
pub enum LockId {
    /// Names and settings of the group directory.
    Directory = 0,
    /// The admission state and waiters.
    Admission = 1,
    /// The decay parameters' owner and the tuner's history.
    Tuner = 2,
    /// The ring of recent runaway-query rule hits.
    RuleHits = 3,
    /// The statement histories that predict a statement's CPU.
    Histories = 4,
}
pub(super) const LOCK_COUNT: i32 = 5;

/// One of pg_stride's LWLocks, held for as long as the guard lives. They are taken on
/// the registration and admission paths and by group changes, never per slice
/// (docs/design.md §3), and never around anything that can raise an error (an error would
/// release them anyway, through LWLockReleaseAll).
pub struct ShmemLock(*mut pg_sys::LWLock);

impl ShmemLock {
    pub fn shared(id: LockId) -> ShmemLock {
        ShmemLock::acquire(id, pg_sys::LWLockMode::LW_SHARED)
    }

    pub fn exclusive(id: LockId) -> ShmemLock {
        ShmemLock::acquire(id, pg_sys::LWLockMode::LW_EXCLUSIVE)
    }

    fn acquire(id: LockId, mode: pg_sys::LWLockMode::Type) -> ShmemLock {
        let locks = LOCKS.load(Ordering::Acquire);
        assert!(
            !locks.is_null(),
            "pg_stride's shared memory is not initialised"
        );
        // SAFETY: the tranche has LOCK_COUNT locks in shared memory for the life of the
        // server.
        unsafe {
            let lock = &raw mut (*locks.add(id as usize)).lock;
            pg_sys::LWLockAcquire(lock, mode);
            ShmemLock(lock)
        }
    }
}

impl Drop for ShmemLock {
    fn drop(&mut self) {
        // SAFETY: acquired in `acquire` by this process and not yet released.
        unsafe { pg_sys::LWLockRelease(self.0) };
    }
}
