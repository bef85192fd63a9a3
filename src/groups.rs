//! Resource groups (DESIGN.md §1, §5).
//!
//! The DBA defines groups with `pg_stride.create_group` and friends; they persist in the
//! table `pg_stride.resource_groups` of the database named by `pg_stride.database` and
//! are mirrored into the shared [`GroupDirectory`], which is what every backend reads.
//!
//! Keeping the mirror right: any change to the table fires a statement trigger that
//! re-reads the table in the changing transaction and publishes it at once (so the
//! session that created a group can use it in its next statement), and asks the
//! scheduler worker to reload when the transaction ends, committed or aborted. The
//! worker reads the committed table, so whatever order concurrent changes commit in,
//! the mirror ends equal to the table. The worker also loads it at start.

use crate::backend_local::BackendLocal;
use crate::shmem;
use pgrx::pg_sys;
use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Most groups the directory holds, `default` included.
pub const MAX_GROUPS: usize = 64;
/// Name of the group every session belongs to unless `pg_stride.group` says otherwise;
/// it always exists.
pub const DEFAULT_GROUP: &str = "default";
/// Longest group name, in bytes (a PostgreSQL name).
pub const MAX_NAME_LEN: usize = pg_sys::NAMEDATALEN as usize - 1;

/// A group's settings, as in `pg_stride.resource_groups`. Values that fall back to the
/// server-wide GUC are `None`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupSettings {
    /// CPU share against other groups.
    pub weight: i32,
    /// Statements of the group admitted at once; 0 = no limit beyond the global one.
    pub max_concurrency: i32,
    /// Parallel workers the group's statements may hold at once; `None` = no cap.
    pub max_parallel_workers: Option<i32>,
    pub priority_initial: Option<i32>,
    pub priority_min: Option<i32>,
    pub decay_lambda: Option<f64>,
    pub decay_start: Option<i32>,
    /// Statements keep `priority_initial` instead of decaying.
    pub pinned: bool,
}

impl GroupSettings {
    /// A new group's settings, and `default`'s until altered.
    pub const DEFAULT: GroupSettings = GroupSettings {
        weight: 100,
        max_concurrency: 0,
        max_parallel_workers: None,
        priority_initial: None,
        priority_min: None,
        decay_lambda: None,
        decay_start: None,
        pinned: false,
    };
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings::DEFAULT
    }
}

/// One group of the directory. `name_len == 0` marks a free slot.
#[derive(Clone, Copy)]
#[repr(C)]
struct GroupSlot {
    name: [u8; MAX_NAME_LEN],
    name_len: u8,
    settings: GroupSettings,
}

impl GroupSlot {
    const FREE: GroupSlot = GroupSlot {
        name: [0; MAX_NAME_LEN],
        name_len: 0,
        settings: GroupSettings::DEFAULT,
    };

    fn name(&self) -> &str {
        // Names are copied in from `&str` and cut at a character boundary.
        std::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or("")
    }

    fn is_free(&self) -> bool {
        self.name_len == 0
    }

    fn new(name: &str, settings: GroupSettings) -> GroupSlot {
        let mut slot = GroupSlot {
            settings,
            ..GroupSlot::FREE
        };
        let mut len = name.len().min(MAX_NAME_LEN);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        slot.name[..len].copy_from_slice(&name.as_bytes()[..len]);
        slot.name_len = len as u8;
        slot
    }
}

/// Buckets of the queue-time histogram: bucket `i > 0` counts waits of
/// `[2^(i-1), 2^i)` µs, bucket 0 waits under 1 µs. Statements admitted at once are not
/// counted in bucket 0 but derived (admitted minus the other buckets), which spares
/// every uncontended statement an atomic add on a line all backends share.
pub const HISTOGRAM_BUCKETS: usize = 40;

/// Bucket of a wait of `us` microseconds.
pub fn histogram_bucket(us: u64) -> usize {
    ((u64::BITS - us.leading_zeros()) as usize).min(HISTOGRAM_BUCKETS - 1)
}

/// Cumulative counters of one group slot, updated without the lock. They count from
/// the group's creation or the last `pg_stride.reset_stats()`.
#[repr(C)]
pub struct GroupCounters {
    /// Statements admitted.
    pub admitted: AtomicU64,
    /// CPU time charged to the group's finished queries, ns.
    pub cpu_ns: AtomicU64,
    /// Statements that gave up waiting at `pg_stride.queue_timeout`.
    pub timed_out: AtomicU64,
    /// Sum of the admitted statements' waits, µs.
    pub queue_time_us: AtomicU64,
    /// Admitted statements by wait, see [`histogram_bucket`].
    pub queue_histogram: [AtomicU64; HISTOGRAM_BUCKETS],
    /// Raised when a new group takes the slot: admissions that processes counted for
    /// the slot's previous group (`ProcEntry::admitted_pending`) are not the new one's.
    pub incarnation: AtomicU32,
}

impl GroupCounters {
    fn new() -> GroupCounters {
        GroupCounters {
            admitted: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            queue_time_us: AtomicU64::new(0),
            queue_histogram: std::array::from_fn(|_| AtomicU64::new(0)),
            incarnation: AtomicU32::new(0),
        }
    }

    pub fn reset(&self) {
        self.admitted.store(0, Ordering::Relaxed);
        self.cpu_ns.store(0, Ordering::Relaxed);
        self.timed_out.store(0, Ordering::Relaxed);
        self.queue_time_us.store(0, Ordering::Relaxed);
        for bucket in &self.queue_histogram {
            bucket.store(0, Ordering::Relaxed);
        }
    }

    /// The `q`-quantile of the waits of `admitted` statements (this counter's and those
    /// the processes have not added to it yet), in µs: the upper bound of the histogram
    /// bucket it falls in (so within a factor of 2), `None` without data.
    pub fn queue_time_quantile_us(&self, admitted: u64, q: f64) -> Option<u64> {
        let mut counts: Vec<u64> = self
            .queue_histogram
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let waited: u64 = counts[1..].iter().sum();
        counts[0] += admitted.saturating_sub(waited);
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(if i == 0 { 0 } else { 1u64 << i });
            }
        }
        None
    }
}

/// The shared mirror of `pg_stride.resource_groups`. Slot 0 is always `default`.
/// Names and settings are read and written under the directory's LWLock; counters are
/// atomics.
#[repr(C)]
pub struct GroupDirectory {
    slots: UnsafeCell<[GroupSlot; MAX_GROUPS]>,
    counters: [GroupCounters; MAX_GROUPS],
    /// Set once the table has been read since the server started; until then group
    /// names cannot be checked.
    loaded: AtomicBool,
    /// Bumped by every publish, so that backends know when a cached lookup is stale.
    generation: AtomicU64,
    /// Reloads requested and reloads done; the worker reloads while they differ.
    reloads_requested: AtomicU64,
    reloads_done: AtomicU64,
    /// Procno of the scheduler worker, whose latch a reload request sets.
    worker_procno: AtomicU32,
}

/// A group as read from the table or from the directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub name: String,
    pub settings: GroupSettings,
}

impl GroupDirectory {
    /// Writes an empty directory holding only `default` at `at`.
    ///
    /// # Safety
    /// `at` points to writable, suitably aligned memory for a `GroupDirectory`.
    pub unsafe fn init(at: *mut GroupDirectory) {
        let mut slots = [GroupSlot::FREE; MAX_GROUPS];
        slots[0] = GroupSlot::new(DEFAULT_GROUP, GroupSettings::default());
        // SAFETY: per the contract above.
        unsafe {
            at.write(GroupDirectory {
                slots: UnsafeCell::new(slots),
                counters: std::array::from_fn(|_| GroupCounters::new()),
                loaded: AtomicBool::new(false),
                generation: AtomicU64::new(0),
                reloads_requested: AtomicU64::new(0),
                reloads_done: AtomicU64::new(0),
                worker_procno: AtomicU32::new(u32::MAX),
            })
        };
    }

    fn read<R>(&self, f: impl FnOnce(&[GroupSlot; MAX_GROUPS]) -> R) -> R {
        let _guard = shmem::ShmemLock::shared(shmem::LockId::Directory);
        // SAFETY: the shared lock keeps writers out while we read.
        f(unsafe { &*self.slots.get() })
    }

    fn write<R>(&self, f: impl FnOnce(&mut [GroupSlot; MAX_GROUPS]) -> R) -> R {
        let _guard = shmem::ShmemLock::exclusive(shmem::LockId::Directory);
        // SAFETY: the exclusive lock makes us the only reader or writer.
        f(unsafe { &mut *self.slots.get() })
    }

    /// Index of the group called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.read(|slots| slots.iter().position(|s| !s.is_free() && s.name() == name))
    }

    /// Settings of the group in slot `slot`, if the slot is in use.
    pub fn settings_of(&self, slot: usize) -> Option<GroupSettings> {
        self.read(|slots| slots.get(slot).filter(|s| !s.is_free()).map(|s| s.settings))
    }

    /// Adds the CPU time of a finished query to group slot `slot`.
    pub fn add_cpu(&self, slot: usize, ns: u64) {
        if let Some(c) = self.counters.get(slot) {
            c.cpu_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Name of the group in slot `slot` (empty for a free slot).
    pub fn name_of(&self, slot: usize) -> String {
        self.read(|slots| slots[slot].name().to_string())
    }

    /// Whether the table has been loaded since start, so that unknown names are known
    /// to be unknown.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Every group, with its slot index.
    pub fn groups(&self) -> Vec<(usize, Group)> {
        self.read(|slots| {
            slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_free())
                .map(|(i, s)| {
                    (
                        i,
                        Group {
                            name: s.name().to_string(),
                            settings: s.settings,
                        },
                    )
                })
                .collect()
        })
    }

    pub fn counters(&self, slot: usize) -> &GroupCounters {
        &self.counters[slot]
    }

    /// Replaces the directory's groups by `groups`. A group keeps its slot (and its
    /// counters) across reloads; a new group takes a free slot that no running
    /// statement still refers to; `default` stays in slot 0 even if the table lost it.
    /// Groups beyond the directory's room are left out with a WARNING.
    ///
    /// With `read_at` (the generation when `groups` were read), nothing changes if the
    /// directory was published since: that publication came from a later reading.
    pub fn publish(
        &self,
        groups: &[Group],
        read_at: Option<u64>,
        slot_in_use: impl Fn(usize) -> bool,
    ) {
        let dropped = self.write(|slots| {
            if read_at.is_some_and(|g| g != self.generation.load(Ordering::Acquire)) {
                return Vec::new();
            }
            let mut next = [GroupSlot::FREE; MAX_GROUPS];
            next[0] = GroupSlot::new(DEFAULT_GROUP, GroupSettings::default());
            let mut pending = Vec::new();
            for g in groups {
                match slots
                    .iter()
                    .position(|s| !s.is_free() && s.name() == g.name)
                {
                    Some(i) => next[i] = GroupSlot::new(&g.name, g.settings),
                    None => pending.push(g),
                }
            }
            let mut dropped = Vec::new();
            for g in pending {
                let free = (1..MAX_GROUPS)
                    .find(|&i| next[i].is_free() && slots[i].is_free() && !slot_in_use(i));
                match free {
                    Some(i) => {
                        next[i] = GroupSlot::new(&g.name, g.settings);
                        self.counters[i].reset();
                        self.counters[i].incarnation.fetch_add(1, Ordering::AcqRel);
                    }
                    None => dropped.push(g.name.clone()),
                }
            }
            *slots = next;
            self.generation.fetch_add(1, Ordering::AcqRel);
            dropped
        });
        self.loaded.store(true, Ordering::Release);
        for name in dropped {
            pgrx::warning!(
                "pg_stride: resource group \"{name}\" is not in effect: at most {MAX_GROUPS} groups fit in shared memory"
            );
        }
    }

    /// Asks the scheduler worker to reload the directory from the table.
    pub fn request_reload(&self) {
        self.reloads_requested.fetch_add(1, Ordering::AcqRel);
        let procno = self.worker_procno.load(Ordering::Acquire);
        if procno != u32::MAX {
            // SAFETY: the worker's PGPROC exists as long as the server runs; setting
            // another process's latch is how PostgreSQL wakes it.
            unsafe {
                pg_sys::SetLatch(
                    &raw mut (*(*pg_sys::ProcGlobal).allProcs.add(procno as usize)).procLatch,
                )
            };
        }
    }

    /// Called by the worker: registers it for reload requests.
    pub fn set_worker(&self, procno: Option<usize>) {
        self.worker_procno
            .store(procno.map_or(u32::MAX, |p| p as u32), Ordering::Release);
    }

    /// Called by the worker: the number of the newest request, if one is not done yet.
    pub fn pending_reload(&self) -> Option<u64> {
        let requested = self.reloads_requested.load(Ordering::Acquire);
        (requested != self.reloads_done.load(Ordering::Acquire)).then_some(requested)
    }

    /// Called by the worker after a reload that started once `request` was pending.
    pub fn reload_done(&self, request: u64) {
        self.reloads_done.store(request, Ordering::Release);
    }
}

/// Whether this backend's transaction changed the groups table.
static CHANGED_IN_XACT: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// Registers the transaction callback. Called once from `_PG_init`.
pub fn install() {
    // SAFETY: called single-threaded from _PG_init; the callback is guarded.
    unsafe { pg_sys::RegisterXactCallback(Some(on_xact_end), std::ptr::null_mut()) };
}

/// Remembers that the current transaction changed the groups table, so that the worker
/// reloads it when the transaction ends.
pub fn mark_changed() {
    CHANGED_IN_XACT.set(true);
}

/// Called at every transaction event; only the end of a transaction that changed the
/// groups has work, the others return before pgrx's error boundary.
unsafe extern "C-unwind" fn on_xact_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT) && CHANGED_IN_XACT.replace(false) {
        // SAFETY: a guarded function, called as PostgreSQL would call it.
        unsafe { request_reload() };
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request_reload() {
    if let Some(shared) = shmem::shared() {
        shared.groups.request_reload();
    }
}

/// The last group this backend resolved: the count of `pg_stride.group` assignments and
/// the directory generation it was looked up at, and its slot. Statements mostly run in
/// the same group as the one before, so the common case costs two comparisons instead
/// of the directory lock.
static LAST_GROUP: BackendLocal<Cell<(u64, u64, usize)>> =
    BackendLocal::new(Cell::new((u64::MAX, u64::MAX, 0)));

/// The group whose slot the current statement runs in: the session's
/// `pg_stride.group`, or `default` with a WARNING when that group no longer exists.
pub fn resolve_session_group(directory: &GroupDirectory) -> usize {
    let key = (
        crate::gucs::group_assignments(),
        directory.generation.load(Ordering::Acquire),
    );
    let (assignments, generation, slot) = LAST_GROUP.get();
    if (assignments, generation) == key {
        return slot;
    }
    let name = crate::gucs::group_name();
    match directory.find(&name) {
        Some(slot) => {
            LAST_GROUP.set((key.0, key.1, slot));
            slot
        }
        None => {
            pgrx::warning!(
                "resource group \"{name}\" does not exist; using group \"{DEFAULT_GROUP}\""
            );
            0
        }
    }
}

/// Reads `pg_stride.resource_groups` of the current database through SPI; no rows when
/// the extension is not created here. Runs inside a transaction.
pub fn read_table() -> Vec<Group> {
    use pgrx::spi::Spi;
    Spi::connect(|client| {
        let exists = client
            .select(
                "SELECT to_regclass('pg_stride.resource_groups') IS NOT NULL",
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
                    priority_min, decay_lambda, decay_start, pinned \
               FROM pg_stride.resource_groups ORDER BY name",
            None,
            &[],
        )?;
        let mut groups = Vec::new();
        for row in rows {
            groups.push(Group {
                name: row.get::<String>(1)?.unwrap_or_default(),
                settings: GroupSettings {
                    weight: row.get::<i32>(2)?.unwrap_or(100),
                    max_concurrency: row.get::<i32>(3)?.unwrap_or(0),
                    max_parallel_workers: row.get::<i32>(4)?,
                    priority_initial: row.get::<i32>(5)?,
                    priority_min: row.get::<i32>(6)?,
                    decay_lambda: row.get::<f64>(7)?,
                    decay_start: row.get::<i32>(8)?,
                    pinned: row.get::<bool>(9)?.unwrap_or(false),
                },
            });
        }
        Ok::<_, pgrx::spi::SpiError>(groups)
    })
    .unwrap_or_else(|e| pgrx::error!("pg_stride: cannot read pg_stride.resource_groups: {e}"))
}

/// Reloads the directory from the table; `slot_in_use` as in [`GroupDirectory::publish`].
///
/// The scheduler worker reads the committed table (`committed`), while a session that
/// changes the table publishes it at once as its transaction sees it; the worker's
/// reading is then older and is dropped. The session's commit or rollback asks the
/// worker for another reload, which settles the directory on the committed table.
pub fn reload(directory: &GroupDirectory, shared: &shmem::Shared, committed: bool) {
    let read_at = committed.then(|| directory.generation.load(Ordering::Acquire));
    let groups = read_table();
    directory.publish(&groups, read_at, |slot| shared.slot_has_statements(slot));
    crate::admission::apply_limits(shared);
}
