//! Per-node counters of `pg_stride.numa = stats` (psaroudakis2016 §4.2 keeps such
//! utilisation counters per socket; docs/design.md §10): the CPU time
//! charged to queries, by the node of the CPU the charging process was on. A fixed
//! array of atomics in the region's header, indexed by the kernel's node number, so
//! that every process counts into the same place whatever its view of the topology.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Nodes with a counter of their own: node numbers 0 to `MAX_NODES - 2`. Node numbers
/// from `MAX_NODES - 1` up share the last counter (no machine PostgreSQL runs on has
/// that many nodes; the view shows that shared total on the first of them).
pub const MAX_NODES: usize = 64;

/// Plain atomics; no pointers, so valid at any mapping address.
#[repr(C)]
pub struct NodeCounters {
    cpu_ns: [AtomicU64; MAX_NODES],
    /// CPU charged on a CPU of no node of the topology (a `pg_stride.numa_topology`
    /// that leaves CPUs out), where the CPU could not be told, or by a process that
    /// could not read the topology.
    elsewhere_ns: AtomicU64,
    /// Whether a process already logged that it could not read the topology: one LOG
    /// line per server, not one per process.
    probe_failure_logged: AtomicBool,
    /// Set by the first process whose binding to a node's CPUs the kernel refused.
    bind_failure_logged: AtomicBool,
}

impl NodeCounters {
    /// Initialises the counters in place. Caller: shared-memory initialisation.
    ///
    /// # Safety
    /// `at` points to writable, unused memory for a `NodeCounters`.
    pub unsafe fn init(at: *mut NodeCounters) {
        // SAFETY: the caller's promise; all-zero atomics are valid.
        unsafe { at.write(NodeCounters::default()) };
    }

    /// The counter index of kernel node `node`.
    pub fn slot(node: u32) -> usize {
        (node as usize).min(MAX_NODES - 1)
    }

    /// Adds `ns` of CPU to node `node`'s counter, or to the one of no node.
    #[inline]
    pub fn charge(&self, node: Option<u32>, ns: u64) {
        let counter = match node {
            Some(n) => &self.cpu_ns[Self::slot(n)],
            None => &self.elsewhere_ns,
        };
        counter.fetch_add(ns, Ordering::Relaxed);
    }

    /// CPU charged on node `node` (on nodes from `MAX_NODES - 1` up together), ns.
    pub fn cpu_ns(&self, node: u32) -> u64 {
        self.cpu_ns[Self::slot(node)].load(Ordering::Relaxed)
    }

    /// CPU charged on no node of the topology, ns.
    pub fn elsewhere_ns(&self) -> u64 {
        self.elsewhere_ns.load(Ordering::Relaxed)
    }

    /// Zeroes the CPU counters (`pg_stride.reset_stats()`).
    pub fn reset(&self) {
        for c in &self.cpu_ns {
            c.store(0, Ordering::Relaxed);
        }
        self.elsewhere_ns.store(0, Ordering::Relaxed);
    }

    /// Whether this is the first process to report a failed topology probe.
    pub fn first_probe_failure(&self) -> bool {
        !self.probe_failure_logged.swap(true, Ordering::Relaxed)
    }

    /// Whether this is the first process to report that the kernel refused a binding.
    pub fn first_bind_failure(&self) -> bool {
        !self.bind_failure_logged.swap(true, Ordering::Relaxed)
    }
}

impl Default for NodeCounters {
    fn default() -> NodeCounters {
        NodeCounters {
            cpu_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            elsewhere_ns: AtomicU64::new(0),
            probe_failure_logged: AtomicBool::new(false),
            bind_failure_logged: AtomicBool::new(false),
        }
    }
}
