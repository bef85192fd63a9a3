//! The group directory: the shared mirror of `pg_stride.resource_groups` that every
//! backend reads (names and settings under the directory's LWLock, counters as
//! atomics), and the requests that make the groups loader re-read the table.

use super::locks::{LockId, ShmemLock};
use crate::pg;
use pg_stride_sched::groups::{self, GroupSettings, DEFAULT_GROUP, MAX_NAME_LEN};
use pg_stride_sched::histogram;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Slots of the directory, `default` included: the scheduling core's group count.
pub const MAX_GROUPS: usize = pg_stride_sched::MAX_GROUPS as usize;

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

    fn name(&self) -> Option<&str> {
        // Names are copied in from `&str` and cut at a character boundary.
        (self.name_len > 0)
            .then(|| std::str::from_utf8(&self.name[..self.name_len as usize]).unwrap_or(""))
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

/// Cumulative counters of one group slot, updated without the lock. They count from
/// the group's creation or the last `pg_stride.reset_stats()`.
#[repr(C)]
pub struct GroupCounters {
    /// Statements admitted.
    pub admitted: AtomicU64,
    /// CPU time charged to the group's queries, ns, slice by slice: it only grows.
    pub cpu_ns: AtomicU64,
    /// Statements that gave up waiting at `pg_stride.queue_timeout`.
    pub timed_out: AtomicU64,
    /// Statements turned away at once because the queue was full (`max_queued`).
    pub rejected: AtomicU64,
    /// Admissions beyond the limits, to break a cycle of waits (docs/design.md §4
    /// rule 12).
    pub over_limit: AtomicU64,
    /// Sum of the admitted statements' waits, µs.
    pub queue_time_us: AtomicU64,
    /// Runaway-query rules its statements met (written by the scheduler worker).
    pub rule_hits: AtomicU64,
    /// Admitted statements by wait (`pg_stride_sched::histogram`).
    pub queue_histogram: [AtomicU64; histogram::BUCKETS],
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
            rejected: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
            queue_time_us: AtomicU64::new(0),
            rule_hits: AtomicU64::new(0),
            queue_histogram: std::array::from_fn(|_| AtomicU64::new(0)),
            incarnation: AtomicU32::new(0),
        }
    }

    pub fn reset(&self) {
        self.admitted.store(0, Ordering::Relaxed);
        self.cpu_ns.store(0, Ordering::Relaxed);
        self.timed_out.store(0, Ordering::Relaxed);
        self.rejected.store(0, Ordering::Relaxed);
        self.over_limit.store(0, Ordering::Relaxed);
        self.queue_time_us.store(0, Ordering::Relaxed);
        self.rule_hits.store(0, Ordering::Relaxed);
        for bucket in &self.queue_histogram {
            bucket.store(0, Ordering::Relaxed);
        }
    }

    /// Counts one admission after a wait of `waited_us` (statements admitted at once
    /// are counted by their processes, see `histogram`).
    pub fn record_admission(&self, waited_us: u64) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        if waited_us > 0 {
            self.queue_time_us.fetch_add(waited_us, Ordering::Relaxed);
            self.queue_histogram[histogram::bucket(waited_us)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `q`-quantile of the waits of `admitted` statements, in µs (see
    /// `histogram::quantile_us`).
    pub fn queue_time_quantile_us(&self, admitted: u64, q: f64) -> Option<u64> {
        let counts = std::array::from_fn(|i| self.queue_histogram[i].load(Ordering::Relaxed));
        histogram::quantile_us(&counts, admitted, q)
    }
}

/// The shared mirror of `pg_stride.resource_groups`. Slot 0 is always `default`.
#[repr(C)]
pub struct GroupDirectory {
    slots: UnsafeCell<[GroupSlot; MAX_GROUPS]>,
    counters: [GroupCounters; MAX_GROUPS],
    /// Set once the table has been read since the server started; until then group
    /// names cannot be checked.
    loaded: AtomicBool,
    /// Bumped by every publish, so that backends know when a cached lookup is stale.
    generation: AtomicU64,
    /// Reloads requested and reloads done; the loader reloads while they differ.
    reloads_requested: AtomicU64,
    reloads_done: AtomicU64,
    /// Procno of the groups loader, whose latch a reload request sets.
    loader_procno: AtomicU32,
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
                loader_procno: AtomicU32::new(u32::MAX),
            })
        };
    }

    fn read<R>(&self, f: impl FnOnce(&[GroupSlot; MAX_GROUPS]) -> R) -> R {
        let _guard = ShmemLock::shared(LockId::Directory);
        // SAFETY: the shared lock keeps writers out while we read.
        f(unsafe { &*self.slots.get() })
    }

    fn write<R>(&self, f: impl FnOnce(&mut [GroupSlot; MAX_GROUPS]) -> R) -> R {
        let _guard = ShmemLock::exclusive(LockId::Directory);
        // SAFETY: the exclusive lock makes us the only reader or writer.
        f(unsafe { &mut *self.slots.get() })
    }

    /// Index of the group called `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.read(|slots| slots.iter().position(|s| s.name() == Some(name)))
    }

    /// Settings of the group in slot `slot`, if the slot is in use.
    pub fn settings_of(&self, slot: usize) -> Option<GroupSettings> {
        self.read(|slots| {
            slots
                .get(slot)
                .filter(|s| s.name().is_some())
                .map(|s| s.settings)
        })
    }

    /// Adds CPU time just charged to a query of group slot `slot`.
    pub fn add_cpu(&self, slot: usize, ns: u64) {
        if let Some(c) = self.counters.get(slot) {
            c.cpu_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }

    /// Name of the group in slot `slot` (empty for a free slot).
    pub fn name_of(&self, slot: usize) -> String {
        self.read(|slots| {
            slots
                .get(slot)
                .and_then(GroupSlot::name)
                .unwrap_or_default()
                .to_string()
        })
    }

    /// Whether the table has been loaded since start, so that unknown names are known
    /// to be unknown.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Bumped by every publication.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every group, with its slot index.
    pub fn groups(&self) -> Vec<(usize, Group)> {
        self.read(|slots| {
            slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let name = s.name()?.to_string();
                    Some((
                        i,
                        Group {
                            name,
                            settings: s.settings,
                        },
                    ))
                })
                .collect()
        })
    }

    /// The counters of group slot `slot` (slots beyond the directory share the last).
    pub fn counters(&self, slot: usize) -> &GroupCounters {
        &self.counters[slot.min(MAX_GROUPS - 1)]
    }

    /// Replaces the directory's groups by `groups`, slots assigned by
    /// `pg_stride_sched::groups::assign_slots`; `default` stays in slot 0 even if the
    /// table lost it. Returns the names of the groups left out (no room).
    ///
    /// With `read_at` (the generation when `groups` were read), nothing changes if the
    /// directory was published since: that publication came from a later reading.
    pub fn publish(
        &self,
        groups: &[Group],
        read_at: Option<u64>,
        slot_in_use: impl Fn(usize) -> bool,
    ) -> Vec<String> {
        let dropped = self.write(|slots| {
            if read_at.is_some_and(|g| g != self.generation.load(Ordering::Acquire)) {
                return Vec::new();
            }
            let current: Vec<Option<&str>> = slots.iter().map(GroupSlot::name).collect();
            let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
            let assignment = groups::assign_slots(&current, &names, slot_in_use);
            let mut next = [GroupSlot::FREE; MAX_GROUPS];
            next[0] = GroupSlot::new(DEFAULT_GROUP, GroupSettings::default());
            for (slot, group) in assignment.slots.iter().enumerate() {
                if let Some(&i) = group.as_ref() {
                    next[slot] = GroupSlot::new(&groups[i].name, groups[i].settings);
                }
            }
            for &slot in &assignment.fresh {
                self.counters[slot].reset();
                self.counters[slot]
                    .incarnation
                    .fetch_add(1, Ordering::AcqRel);
            }
            *slots = next;
            self.generation.fetch_add(1, Ordering::AcqRel);
            assignment
                .dropped
                .iter()
                .map(|&i| groups[i].name.clone())
                .collect()
        });
        self.loaded.store(true, Ordering::Release);
        dropped
    }

    /// Asks the groups loader to reload the directory from the table.
    pub fn request_reload(&self) {
        self.reloads_requested.fetch_add(1, Ordering::AcqRel);
        let procno = self.loader_procno.load(Ordering::Acquire);
        if procno != u32::MAX {
            pg::set_latch(procno as usize);
        }
    }

    /// Called by the loader: registers it for reload requests.
    pub fn set_loader(&self, procno: usize) {
        self.loader_procno.store(procno as u32, Ordering::Release);
    }

    /// Called by the loader as it exits: unregisters it, unless a newer loader already
    /// registered.
    pub fn forget_loader(&self, procno: usize) {
        let _ = self.loader_procno.compare_exchange(
            procno as u32,
            u32::MAX,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Called by the loader: the number of the newest request, if one is not done yet.
    pub fn pending_reload(&self) -> Option<u64> {
        let requested = self.reloads_requested.load(Ordering::Acquire);
        (requested != self.reloads_done.load(Ordering::Acquire)).then_some(requested)
    }

    /// Called by the loader after a reload that started once `request` was pending.
    pub fn reload_done(&self, request: u64) {
        self.reloads_done.store(request, Ordering::Release);
    }
}
