//! The per-group, per-query and per-process records of the shared region. Each is one
//! or more whole cache lines, so that processes working for different queries do not
//! write to the same line. Everything is an atomic: the records are mapped into many
//! processes at once, and all-zero bytes are a valid initial state.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Most processes that may work for one query (leader plus parallel workers): the
/// waiting members of a query fit in one atomic word.
pub const MAX_QUERY_MEMBERS: usize = 64;

/// Query entry state: free.
pub(crate) const QUERY_FREE: u32 = 0;
/// Query entry state: registered.
pub(crate) const QUERY_ACTIVE: u32 = 1;

/// Process state: holds no slot and waits for none.
pub(crate) const PROC_IDLE: u32 = 0;
/// Process state: waits for a slot (its member bit is set in its query's `waiting`).
pub(crate) const PROC_WAITING: u32 = 1;
/// Process state: holds a CPU slot.
pub(crate) const PROC_RUNNING: u32 = 2;

/// `GroupEntry::decay_overrides`: the group sets its own λ.
pub(crate) const OWN_DECAY_LAMBDA: u32 = 1;
/// `GroupEntry::decay_overrides`: the group sets its own `d_start`.
pub(crate) const OWN_DECAY_START: u32 = 2;
/// A query's `d_start` when it has none of its own: its group's applies.
pub(crate) const GROUP_D_START: u32 = u32::MAX;

/// The CPU slots of one node (one entry when slots are not split by node).
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct NodeEntry {
    /// Slots of the node (target).
    pub slots: AtomicU32,
    /// Slots of the node held.
    pub running: AtomicU32,
    /// Registered queries whose home the node is.
    pub homed: AtomicU32,
    /// Moving average of `running` (f64 bits), sampled by the scheduler worker.
    pub util_bits: AtomicU64,
}

/// Wraps a value onto its own cache line.
#[repr(C, align(64))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

/// A resource group (docs/design.md §1).
#[repr(C, align(64))]
pub(crate) struct GroupEntry {
    /// CPU weight: the group's share against other groups with work.
    pub weight: AtomicU32,
    /// Initial priority of the group's queries.
    pub p0: AtomicU32,
    /// Lowest priority of the group's queries.
    pub p_min: AtomicU32,
    /// The group's own `d_start`, if `decay_overrides` has `OWN_DECAY_START`.
    pub decay_start: AtomicU32,
    /// Which decay parameters the group sets itself (`OWN_*` bits; 0 = the global ones).
    pub decay_overrides: AtomicU32,
    /// Cap on parallel workers granted to the group's queries at once.
    pub max_workers: AtomicU32,
    /// Parallel workers currently granted to the group's queries.
    pub workers_in_use: AtomicU32,
    /// Registered queries.
    pub active_queries: AtomicU32,
    /// The group's own λ (f64 bits), if `decay_overrides` has `OWN_DECAY_LAMBDA`.
    pub decay_lambda_bits: AtomicU64,
    /// Pass of the group in the stride over groups.
    pub pass: AtomicU64,
    /// Global pass of the stride over this group's queries: where arrivals start.
    pub vtime: AtomicU64,
    /// Sum of the current priorities of the registered queries (`1/S_G`, §2.1).
    pub prio_sum: AtomicU64,
    /// `stride(weight)`, kept beside the weight so a charge needs no division for it.
    pub stride: AtomicU64,
}

/// A query entry (wagner2021 §2.2: the resource group of one query).
#[repr(C, align(64))]
pub(crate) struct QueryEntry {
    /// `QUERY_FREE` or `QUERY_ACTIVE`.
    pub state: AtomicU32,
    /// Group index.
    pub group: AtomicU32,
    /// Current priority.
    pub priority: AtomicU32,
    /// Non-zero: the priority is static (no decay).
    pub pinned: AtomicU32,
    /// Initial priority (from its group).
    pub p0: AtomicU32,
    /// Lowest priority (from its group).
    pub p_min: AtomicU32,
    /// Quanta before its priority decays, or [`GROUP_D_START`]: its group's.
    pub d_start: AtomicU32,
    /// Member index where the next search for a waiting member starts.
    pub cursor: AtomicU32,
    /// Processes joined.
    pub members: AtomicU32,
    /// Home node: the node whose slots the query's processes take (`numa = bind`,
    /// psaroudakis2016 §4). A home at or beyond the region's node count is read modulo it.
    pub home: AtomicU32,
    /// One bit per member that has waited long enough to take a slot on another node
    /// than the home ([`crate::numa::StealPolicy`]).
    pub may_steal: AtomicU64,
    /// Pass in the stride over the group's queries (FIFO: arrival ticket).
    pub pass: AtomicU64,
    /// CPU time charged so far, ns.
    pub cpu_ns: AtomicU64,
    /// `stride(priority)`. Priorities only fall, so strides only grow: concurrent
    /// updates meet in `fetch_max`.
    pub stride: AtomicU64,
    /// One bit per member waiting for a slot: the source of truth of "who waits".
    pub waiting: AtomicU64,
    /// One bit per member index in use.
    pub members_used: AtomicU64,
    /// Member index → process.
    pub member_proc: [AtomicU32; MAX_QUERY_MEMBERS],
}

/// A process (by `pgprocno`).
#[repr(C, align(64))]
pub(crate) struct ProcEntry {
    /// `PROC_IDLE`, `PROC_WAITING` or `PROC_RUNNING`.
    pub state: AtomicU32,
    /// Query joined, or `ids::NONE`.
    pub query: AtomicU32,
    /// Member index within the query.
    pub member: AtomicU32,
    /// Node of the slot held (valid while `PROC_RUNNING`; written by the granter before
    /// it stores the state).
    pub node: AtomicU32,
    /// Slices charged (written by the owning process only).
    pub slices: AtomicU64,
    /// Times the process gave its slot to another at a slice end.
    pub switches: AtomicU64,
    /// Non-zero: a waiting process of a higher priority asked this holder to end its
    /// slice at its next tuple (`preempt`).
    pub yield_asked: AtomicU32,
}
