//! The shared-memory form of the scheduler: one fixed-size region that every process maps.
//!
//! # Layout
//!
//! The region starts with the [`SchedShared`] header, followed by trailing arrays that
//! are addressed by index through offsets stored in the header:
//!
//! ```text
//! SchedShared | GroupEntry × max_groups | group query masks | QueryEntry × max_queries | ProcEntry × max_procs
//! ```
//!
//! There are no pointers in the region (only integers and atomics), so it may be mapped
//! at different addresses, and no heap or `std::sync::Mutex`: the only synchronisation
//! is atomic operations, which work between processes.
//!
//! # Who waits
//!
//! Waiting is recorded in three levels of bits, so that finding the next process to run
//! never scans idle entries, and "nobody waits" is one load:
//!
//! * a query's `waiting` word has one bit per member process that waits — the truth;
//! * each group has a bitmap over the query table marking queries with waiters;
//! * the header's `waiting_groups` word marks groups with waiters (hence ≤ 64 groups).
//!
//! The upper two levels are hints: they may be set while nothing waits below (a scan
//! that meets such a bit clears it), but a bit is never missing where something waits
//! once the operations touching it have returned (set bottom-up; cleared by
//! clear-then-recheck). This mirrors the change masks of wagner2021 §2.3.
//!
//! # Modules
//!
//! `registry` adds and removes groups, queries and processes (rare path), `waitset`
//! keeps the bits above, `slots` holds the per-slice operations, `preempt` the early
//! end of a lower-priority holder's slice, `charge` the stride and decay accounting,
//! `workers` the concurrency hint and worker grants.

mod chaos;
mod charge;
mod entries;
mod nodes;
mod preempt;
mod registry;
mod slots;
mod waitset;
mod workers;

use std::alloc::{self, Layout};
use std::mem::size_of;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

pub use entries::MAX_QUERY_MEMBERS;
pub use nodes::MAX_SLOT_NODES;
pub use registry::{GroupConfig, ProcSnapshot, QueryOptions, QuerySnapshot};
pub use slots::{Outcome, Turn};
pub use workers::Demand;

use crate::decay::DecayParams;
use crate::ids::{GroupId, ProcId, QueryId, NONE};
use entries::*;

/// Most groups a region can hold: the group level of the wait bits is one word.
pub const MAX_GROUPS: u32 = 64;

const MAGIC: u64 = 0x7067_5f73_7472_6964; // "pg_strid"
const REGION_ALIGN: usize = 64;

/// How many of each thing the region has room for; fixed at startup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Processes, addressed by `ProcId` (PostgreSQL: `MaxBackends` + auxiliary).
    pub max_procs: u32,
    /// Query entries, addressed by `QueryId`.
    pub max_queries: u32,
    /// Resource groups, addressed by `GroupId`; at most [`MAX_GROUPS`].
    pub max_groups: u32,
}

/// Which decision rule the region applies. The extension runs `DecayingStride`; the
/// other two are the simulator's baselines (wagner2021 §5.2), run by the same code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Policy {
    /// First come, first served: a query's pass is its arrival ticket and is never
    /// charged, so slots go to the oldest waiting query and nobody is preempted by a
    /// later arrival.
    Fifo = 0,
    /// Stride scheduling with fixed priorities (no decay).
    FairStride = 1,
    /// Stride scheduling with decaying priorities (wagner2021 §3.2).
    DecayingStride = 2,
}

impl Policy {
    fn from_u32(v: u32) -> Policy {
        match v {
            0 => Policy::Fifo,
            1 => Policy::FairStride,
            _ => Policy::DecayingStride,
        }
    }
}

/// Settings given at initialisation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedConfig {
    /// Processes that may hold a CPU slot at once (`pg_stride.cpu_slots`).
    pub cpu_slots: u32,
    /// Decision rule.
    pub policy: Policy,
    /// Priority decay parameters (`pg_stride.decay_lambda`, `decay_start`, `slice`).
    pub decay: DecayParams,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            cpu_slots: 1,
            policy: Policy::DecayingStride,
            decay: DecayParams::default(),
        }
    }
}

/// Errors of the registration path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedError {
    /// The query table is full.
    NoFreeQueryEntry,
    /// The query already has [`MAX_QUERY_MEMBERS`] processes.
    QueryFull,
    /// The query still has processes joined.
    QueryInUse,
    /// `attach` found no initialised region at the pointer.
    NotInitialized,
    /// The capacity is out of range (zero, or more than [`MAX_GROUPS`] groups).
    BadCapacity,
}

impl std::fmt::Display for SchedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            SchedError::NoFreeQueryEntry => "no free query entry",
            SchedError::QueryFull => "query has the maximum number of processes",
            SchedError::QueryInUse => "query still has processes",
            SchedError::NotInitialized => "scheduler region not initialised",
            SchedError::BadCapacity => "scheduler capacity out of range",
        };
        f.write_str(s)
    }
}

impl std::error::Error for SchedError {}

/// Byte offsets of the trailing arrays, from the start of the header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Offsets {
    groups: u64,
    group_masks: u64,
    queries: u64,
    procs: u64,
    end: u64,
}

impl Offsets {
    fn of(cap: &Capacity) -> Offsets {
        let round = |n: usize| n.div_ceil(REGION_ALIGN) * REGION_ALIGN;
        let groups = size_of::<SchedShared>();
        let group_masks = groups + cap.max_groups as usize * size_of::<GroupEntry>();
        let queries = group_masks
            + round(cap.max_groups as usize * words(cap.max_queries) * size_of::<u64>());
        let procs = queries + cap.max_queries as usize * size_of::<QueryEntry>();
        let end = procs + cap.max_procs as usize * size_of::<ProcEntry>();
        Offsets {
            groups: groups as u64,
            group_masks: group_masks as u64,
            queries: queries as u64,
            procs: procs as u64,
            end: end as u64,
        }
    }
}

/// Words of a bitmap with `n` bits.
fn words(n: u32) -> usize {
    (n as usize).div_ceil(64)
}

/// The header of the shared region. Obtain one with [`SchedShared::init_in`] (the first
/// process), [`SchedShared::attach`] (the others) or [`OwnedRegion::new`] (tests, the
/// simulator, benchmarks).
#[repr(C, align(64))]
pub struct SchedShared {
    magic: AtomicU64,
    cap: Capacity,
    query_words: u32,
    offsets: Offsets,
    // Settings: written rarely.
    policy: AtomicU32,
    decay_start: AtomicU32,
    decay_lambda_bits: AtomicU64,
    quantum_ns: AtomicU64,
    hint_bits: AtomicU64,
    /// Sum of the weights of the groups with registered queries.
    weight_sum: AtomicU64,
    /// FIFO arrival tickets.
    fifo_ticket: AtomicU64,
    /// Global pass of the stride over groups: where a group that gets work starts.
    group_vtime: Padded<AtomicU64>,
    /// Nodes the CPU slots are split over (1 when they are not split).
    node_count: Padded<AtomicU32>,
    /// Slot accounting per node: target and held.
    nodes: [NodeEntry; MAX_SLOT_NODES],
    /// One bit per group with waiting processes.
    waiting_groups: Padded<AtomicU64>,
}

impl SchedShared {
    /// Bytes of raw memory to reserve for a region of capacity `cap` (alignment slack
    /// included: the region may start at any address).
    pub fn region_size(cap: &Capacity) -> usize {
        Offsets::of(cap).end as usize + REGION_ALIGN - 1
    }

    /// Initialises a region in `ptr` and returns it. Call once, in one process, before
    /// any other process attaches (PostgreSQL: in the `shmem_startup_hook`, when
    /// `ShmemInitStruct` reports the struct as new).
    ///
    /// # Safety
    /// `ptr` must point to at least [`SchedShared::region_size`]`(&cap)` writable bytes
    /// that stay mapped for the rest of the process's life and that nothing else uses.
    pub unsafe fn init_in(
        ptr: *mut u8,
        cap: Capacity,
        config: &SchedConfig,
    ) -> Result<&'static SchedShared, SchedError> {
        if cap.max_procs == 0
            || cap.max_queries == 0
            || cap.max_groups == 0
            || cap.max_groups > MAX_GROUPS
        {
            return Err(SchedError::BadCapacity);
        }
        let base = align_up(ptr);
        let offsets = Offsets::of(&cap);
        let header = base as *mut SchedShared;
        // SAFETY: the caller gives `region_size(&cap)` bytes, which cover the aligned
        // header and `offsets.end` bytes after it; nothing else uses them yet. All-zero
        // bytes are a valid state for every atomic in the region.
        let shared: &'static SchedShared = unsafe {
            std::ptr::write_bytes(base, 0, offsets.end as usize);
            (*header).cap = cap;
            (*header).query_words = words(cap.max_queries) as u32;
            (*header).offsets = offsets;
            &*header
        };
        shared.init_contents(config);
        shared.magic.store(MAGIC, Release);
        Ok(shared)
    }

    /// Attaches to a region that [`SchedShared::init_in`] initialised at `ptr` (in this
    /// or a parent process).
    ///
    /// # Safety
    /// `ptr` must be the pointer given to `init_in` (or the same memory mapped again) and
    /// stay mapped for the rest of the process's life.
    pub unsafe fn attach(ptr: *mut u8) -> Result<&'static SchedShared, SchedError> {
        let header = align_up(ptr) as *const SchedShared;
        // SAFETY: the caller's promise: `init_in` placed a region here that stays mapped.
        let shared: &'static SchedShared = unsafe { &*header };
        if shared.magic.load(Acquire) != MAGIC {
            return Err(SchedError::NotInitialized);
        }
        Ok(shared)
    }

    fn init_contents(&self, config: &SchedConfig) {
        self.policy.store(config.policy as u32, Relaxed);
        self.set_decay(config.decay);
        self.set_node_slots(&[config.cpu_slots]);
        self.hint_bits
            .store((config.cpu_slots as f64).to_bits(), Relaxed);
        for g in 0..self.cap.max_groups {
            self.configure_group(GroupId(g), GroupConfig::default());
        }
        for p in self.procs() {
            p.query.store(NONE, Relaxed);
        }
    }

    /// The capacity the region was sized for.
    pub fn capacity(&self) -> Capacity {
        self.cap
    }

    /// The decision rule in force.
    pub fn policy(&self) -> Policy {
        Policy::from_u32(self.policy.load(Relaxed))
    }

    /// The decay parameters in force.
    pub fn decay(&self) -> DecayParams {
        DecayParams {
            lambda: f64::from_bits(self.decay_lambda_bits.load(Relaxed)),
            d_start: self.decay_start.load(Relaxed),
            quantum_ns: self.quantum_ns.load(Relaxed),
        }
    }

    /// Installs new decay parameters (the tuner, or a GUC reload). Queries keep their
    /// current priority; later quanta follow the new parameters.
    pub fn set_decay(&self, decay: DecayParams) {
        self.decay_lambda_bits
            .store(decay.lambda.clamp(0.0, 1.0).to_bits(), Relaxed);
        self.decay_start.store(decay.d_start, Relaxed);
        self.quantum_ns.store(decay.quantum_ns.max(1), Relaxed);
    }

    /// The target number of CPU slots, over all nodes.
    pub fn cpu_slots(&self) -> u32 {
        self.slot_nodes().iter().map(|n| n.slots.load(SeqCst)).sum()
    }

    /// Slots held right now, over all nodes.
    pub fn running(&self) -> u32 {
        self.slot_nodes()
            .iter()
            .map(|n| n.running.load(SeqCst))
            .sum()
    }

    /// True when no process waits for a slot: one atomic load.
    #[inline]
    pub fn nobody_waits(&self) -> bool {
        self.waiting_groups.0.load(SeqCst) == 0
    }

    // ---- trailing arrays ----

    #[inline]
    fn array<T>(&self, offset: u64, len: u32) -> &[T] {
        // SAFETY: the offsets were computed for this capacity at init, the memory was
        // reserved by the caller of init_in and zero-initialised, and T is made of atomics.
        unsafe {
            let base = (self as *const SchedShared as *const u8).add(offset as usize) as *const T;
            std::slice::from_raw_parts(base, len as usize)
        }
    }

    #[inline]
    fn groups(&self) -> &[GroupEntry] {
        self.array(self.offsets.groups, self.cap.max_groups)
    }

    #[inline]
    fn queries(&self) -> &[QueryEntry] {
        self.array(self.offsets.queries, self.cap.max_queries)
    }

    #[inline]
    fn procs(&self) -> &[ProcEntry] {
        self.array(self.offsets.procs, self.cap.max_procs)
    }

    /// Group `g`'s bitmap of queries with waiting members.
    #[inline]
    fn group_query_mask(&self, g: usize) -> &[AtomicU64] {
        let all: &[AtomicU64] = self.array(
            self.offsets.group_masks,
            self.cap.max_groups * self.query_words,
        );
        let w = self.query_words as usize;
        &all[g * w..(g + 1) * w]
    }

    #[inline]
    fn group(&self, g: GroupId) -> &GroupEntry {
        &self.groups()[g.index()]
    }

    #[inline]
    fn query(&self, q: QueryId) -> &QueryEntry {
        &self.queries()[q.index()]
    }

    #[inline]
    fn proc(&self, p: ProcId) -> &ProcEntry {
        &self.procs()[p.index()]
    }
}

fn align_up(ptr: *mut u8) -> *mut u8 {
    let misalign = ptr as usize % REGION_ALIGN;
    if misalign == 0 {
        ptr
    } else {
        ptr.wrapping_add(REGION_ALIGN - misalign)
    }
}

/// A region on the heap of this process, for tests, benchmarks and the simulator: the
/// same [`SchedShared`], shared between threads instead of processes.
pub struct OwnedRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the region holds only atomics and integers written before it is shared.
unsafe impl Send for OwnedRegion {}
// SAFETY: as above; every shared mutation goes through atomics.
unsafe impl Sync for OwnedRegion {}

impl OwnedRegion {
    /// Allocates and initialises a region.
    pub fn new(cap: Capacity, config: &SchedConfig) -> Result<OwnedRegion, SchedError> {
        let layout = Layout::from_size_align(SchedShared::region_size(&cap), REGION_ALIGN)
            .map_err(|_| SchedError::BadCapacity)?;
        // SAFETY: the layout has a non-zero size (the header alone is non-empty).
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        // SAFETY: `raw` has region_size(&cap) bytes owned by this value.
        if let Err(e) = unsafe { SchedShared::init_in(raw, cap, config) } {
            // SAFETY: allocated above with this layout.
            unsafe { alloc::dealloc(raw, layout) };
            return Err(e);
        }
        Ok(OwnedRegion { ptr, layout })
    }
}

impl Deref for OwnedRegion {
    type Target = SchedShared;

    fn deref(&self) -> &SchedShared {
        // SAFETY: initialised in `new`; lives as long as self.
        unsafe { &*(align_up(self.ptr.as_ptr()) as *const SchedShared) }
    }
}

impl Drop for OwnedRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod stress;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod region_tests {
    use super::*;

    fn cap() -> Capacity {
        Capacity {
            max_procs: 100,
            max_queries: 70,
            max_groups: 3,
        }
    }

    #[test]
    fn region_fits_and_attach_finds_it() {
        let cap = cap();
        let size = SchedShared::region_size(&cap);
        let mut buf = vec![0xAAu8; size + 1];
        // A deliberately misaligned start.
        // SAFETY: the buffer has one byte more than the region needs.
        let ptr = unsafe { buf.as_mut_ptr().add(1) };
        // SAFETY: `ptr` has region_size bytes that the test owns and keeps alive.
        let a = unsafe {
            SchedShared::init_in(
                ptr,
                cap,
                &SchedConfig {
                    cpu_slots: 5,
                    ..Default::default()
                },
            )
        }
        .unwrap();
        // SAFETY: the region initialised just above.
        let b = unsafe { SchedShared::attach(ptr) }.unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(b.capacity(), cap);
        assert_eq!(b.cpu_slots(), 5);
        let end = b as *const SchedShared as usize + b.offsets.end as usize;
        assert!(end <= buf.as_ptr() as usize + buf.len());
        assert!(b.nobody_waits());
    }

    #[test]
    fn attach_rejects_uninitialised_memory() {
        let mut buf = vec![0u8; SchedShared::region_size(&cap())];
        // SAFETY: a live buffer of the region's size; attach only reads its header.
        let attached = unsafe { SchedShared::attach(buf.as_mut_ptr()) };
        assert_eq!(attached.err(), Some(SchedError::NotInitialized));
    }

    #[test]
    fn capacity_is_checked() {
        let bad = Capacity {
            max_groups: 65,
            ..cap()
        };
        assert_eq!(
            OwnedRegion::new(bad, &SchedConfig::default()).err(),
            Some(SchedError::BadCapacity)
        );
        let none = Capacity {
            max_procs: 0,
            ..cap()
        };
        assert_eq!(
            OwnedRegion::new(none, &SchedConfig::default()).err(),
            Some(SchedError::BadCapacity)
        );
    }

    #[test]
    fn entries_are_whole_cache_lines() {
        assert_eq!(size_of::<GroupEntry>() % 64, 0);
        assert_eq!(size_of::<QueryEntry>() % 64, 0);
        assert_eq!(size_of::<ProcEntry>() % 64, 0);
        assert_eq!(size_of::<SchedShared>() % 64, 0);
    }
}
