//! The statement histories that predict a statement's CPU (`pg_stride_sched::predict`):
//! `predict::CAPACITY` fingerprints with their cost model and quality counts, read under the
//! `Histories` lock in shared mode when a serial read above the tiny bound arrives and
//! when a statement joins CPU scheduling, and written in exclusive mode when it ends.
//! Each happens at most once per statement, never per slice.

use super::locks::{LockId, ShmemLock};
use crate::pg;
use pg_stride_sched::predict::{self, CostModel, History, Prediction, Quality, Table, View};
use std::cell::UnsafeCell;

/// Slots of the table: `predict::CAPACITY` fingerprints in whole sets.
const SLOTS: usize = predict::CAPACITY.div_ceil(predict::WAYS) * predict::WAYS;

#[repr(C)]
struct Parts {
    slots: [History; SLOTS],
    model: CostModel,
    quality: Quality,
}

/// The table, in shared memory.
#[repr(C)]
pub struct Histories {
    parts: UnsafeCell<Parts>,
}

impl Histories {
    /// Initialises an empty table in place. Caller: shared-memory initialisation.
    ///
    /// # Safety
    /// `at` points to writable, unused memory for a `Histories`.
    pub unsafe fn init(at: *mut Histories) {
        // SAFETY: the caller's promise; every field is plain data, all zero when empty
        // (`History::default()` is key 0, an empty slot).
        unsafe { at.write_bytes(0, 1) };
    }

    /// `f` over a reading of the table, under the shared lock. `f` must not raise an
    /// error (it would unwind past the lock's guard into LWLockReleaseAll, harmless, but
    /// past a reference into the table).
    pub fn read<R>(&self, f: impl FnOnce(View<'_>) -> R) -> R {
        let _guard = ShmemLock::shared(LockId::Histories);
        // SAFETY: the shared lock keeps writers out while `f` reads.
        let parts = unsafe { &*self.parts.get() };
        f(View::new(&parts.slots, &parts.model, &parts.quality))
    }

    /// A copy of fingerprint `key`'s history in this process's scope ([`scope`]), if
    /// it has one.
    pub fn history(&self, key: u64) -> Option<History> {
        self.read(|table| table.history_in(key, scope()).copied())
    }

    /// The CPU predicted for fingerprint `key` (0: none) in this process's scope with
    /// plan cost `cost`.
    pub fn predict(&self, key: u64, cost: f64) -> Option<Prediction> {
        self.read(|table| table.predict_in(key, scope(), cost))
    }

    /// The table to record into, under the exclusive lock for as long as the guard
    /// lives. Nothing that can raise an ERROR runs while it is held (see
    /// [`Histories::read`]).
    #[must_use = "the lock is released when the guard is dropped"]
    pub fn locked(&self) -> LockedTable<'_> {
        let lock = ShmemLock::exclusive(LockId::Histories);
        // SAFETY: the exclusive lock, held by the guard as long as the table it returns,
        // makes this process the only one touching the table.
        let parts = unsafe { &mut *self.parts.get() };
        LockedTable {
            table: Table::new(&mut parts.slots, &mut parts.model, &mut parts.quality),
            _lock: lock,
        }
    }

    /// Zeroes the quality counts (`pg_stride.reset_stats()`); the histories and the cost
    /// model are what the predictions are made of, and stay.
    pub fn reset_quality(&self) {
        let _guard = ShmemLock::exclusive(LockId::Histories);
        // SAFETY: the exclusive lock makes this process the only one touching the table.
        unsafe { (*self.parts.get()).quality = Quality::default() };
    }
}

/// Whose statement histories this process reads and records (`History::scope`): its
/// database's (high 32 bits) and its session role's (`pg::outer_role`), as
/// pg_stat_statements keeps one entry per database, role and query identifier.
pub fn scope() -> u64 {
    (u64::from(pg::database_oid()) << 32) | u64::from(pg::outer_role().to_u32())
}

/// The database of histories of `scope`.
pub fn database_of(scope: u64) -> u32 {
    (scope >> 32) as u32
}

/// The statement histories, writable while the exclusive lock that the guard holds lasts
/// ([`Histories::locked`]).
pub struct LockedTable<'a> {
    table: Table<'a>,
    _lock: ShmemLock,
}

impl<'a> std::ops::Deref for LockedTable<'a> {
    type Target = Table<'a>;
    fn deref(&self) -> &Table<'a> {
        &self.table
    }
}

impl<'a> std::ops::DerefMut for LockedTable<'a> {
    fn deref_mut(&mut self) -> &mut Table<'a> {
        &mut self.table
    }
}
