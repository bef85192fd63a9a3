//! NUMA nodes in the simulator (docs/design.md §10; psaroudakis2016 §4): the CPU
//! slots are labelled with nodes, each query's memory is on one node, and CPU work runs
//! [`NumaSim::remote_penalty`] times slower on a slot of any other node. The scheduler
//! sees the CPU time actually used, as on a real machine: a remote slice of `slice_ns`
//! gets `slice_ns / penalty` of the query's work done and is charged `slice_ns`.
//!
//! Two placements are compared:
//!
//! * [`NumaPlacement::Affine`] — pg_stride's `numa = bind`: the region's slots are split
//!   by node ([`crate::SchedShared::set_node_slots`] with [`split_slots`]); a query
//!   registers with the home [`crate::SchedShared::choose_home`] picks (fewest homed
//!   queries per slot, then least utilised per slot by the moving average
//!   [`crate::SchedShared::sample_node_util`] keeps, sampled every
//!   [`NumaSim::sample_ns`] like the extension's scheduler worker), and its memory is on
//!   that node. Its processes take home slots only, until one has waited `steal_after`
//!   slices: then it may steal a slot of any node ([`crate::SchedShared::allow_steal`],
//!   then `dispatch` until `None`), as the extension's `pause` does, and again after
//!   each further such wait; one that loses a stolen slot at a slice end dispatches at
//!   once, as the extension's slice end does. Stealing keeps slots busy at the cost of
//!   remote memory accesses (psaroudakis2016 §4, §7). The memory-intensity limit on
//!   stealing ([`crate::numa::StealPolicy::max_intensity`]) is not modelled (nor applied
//!   by the extension yet): every query is equally sensitive to remote memory.
//! * [`NumaPlacement::Oblivious`] — `numa = off`, the operating system's placement: the
//!   region has one pool of slots, and the simulator places each process that is handed
//!   a slot on a free physical slot: the one it last ran on if that is free, else the
//!   lowest-numbered free one (deterministic; the kernel's wake-up path also prefers the
//!   previous CPU, but knows nothing of the query's other processes or its memory). A
//!   query's memory is on the node of the first slot any of its processes ran on (first
//!   touch).
//!
//! With one node, or a penalty of 1 under `Oblivious`, every scheduling decision is the
//! one made without NUMA.

use crate::numa::split_slots;

/// How often the affine placement samples node utilisation: as the extension's
/// scheduler worker calls `sample_node_util`, every [`crate::hint::HINT_INTERVAL_MS`].
pub const NODE_SAMPLE_NS: u64 = crate::hint::HINT_INTERVAL_MS * 1_000_000;

/// Shortest wait before a process may steal, as in the extension (the latch wait's
/// resolution; also keeps `steal_after = 0` from spinning).
pub const MIN_STEAL_WAIT_NS: u64 = 1_000_000;

/// The simulated machine's NUMA nodes and how work is placed on them.
#[derive(Clone, Debug, PartialEq)]
pub struct NumaSim {
    /// CPUs per node: `SimConfig::slots` is split over the nodes in proportion to these
    /// with [`split_slots`], as the extension splits `pg_stride.cpu_slots`. Empty counts
    /// as one node.
    pub node_cpus: Vec<u32>,
    /// How many times slower CPU work runs on a node other than the one holding the
    /// query's memory (≥ 1; e.g. 1.3).
    pub remote_penalty: f64,
    /// Where processes run.
    pub placement: NumaPlacement,
    /// Affine: simulated time between samples of node utilisation (and the dispatch
    /// safety net of the scheduler worker).
    pub sample_ns: u64,
}

impl NumaSim {
    /// `nodes` nodes with equal CPUs.
    pub fn new(nodes: usize, remote_penalty: f64, placement: NumaPlacement) -> Self {
        NumaSim {
            node_cpus: vec![1; nodes.max(1)],
            remote_penalty,
            placement,
            sample_ns: NODE_SAMPLE_NS,
        }
    }

    /// Slots per node for `total` slots.
    pub fn node_slots(&self, total: u32) -> Vec<u32> {
        if self.node_cpus.len() <= 1 {
            vec![total]
        } else {
            split_slots(total, &self.node_cpus)
        }
    }
}

/// Where a query's processes run (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaPlacement {
    /// `numa = bind`: home-node slots; after waiting `steal_after` slices a process may
    /// take any node's slot (`None`: never).
    Affine {
        /// Slices a process waits for a home slot before it may steal (`None`: never).
        steal_after: Option<u32>,
    },
    /// `numa = off`: one slot pool, physical slots by the simulator, first-touch memory.
    Oblivious,
}

/// CPU time run on one node's slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Slots of the node.
    pub slots: u32,
    /// CPU time used on the node's slots, ns.
    pub cpu_ns: u64,
    /// Of which by queries whose memory is on another node.
    pub remote_ns: u64,
}

/// What NUMA did in a run, beyond the per-query results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NumaReport {
    /// Per node.
    pub nodes: Vec<NodeUsage>,
    /// First arrival, ns.
    pub first_arrival_ns: u64,
    /// Last completion, ns (the first arrival if nothing finished).
    pub last_finish_ns: u64,
    /// Queries finished.
    pub finished: usize,
    /// Integral of free slots over time, from the first arrival to the last completion
    /// (slot·ns).
    pub idle_slot_ns: u128,
    /// Integral of free slots that some waiting process could have used —
    /// `min(free slots, waiting processes)` — over the same span: capacity left idle by
    /// the placement (0 under `Oblivious`, which is work-conserving).
    pub stranded_slot_ns: u128,
    /// Times a waiting process was allowed to steal.
    pub steals: u64,
    /// Processes the periodic `dispatch` safety net found stranded and woke (a lost
    /// hand-off in the scheduler; expected 0).
    pub rescued: u64,
}

impl NumaReport {
    /// Slots over all nodes.
    pub fn slots(&self) -> u32 {
        self.nodes.iter().map(|n| n.slots).sum()
    }

    /// CPU time used over all nodes, ns.
    pub fn cpu_ns(&self) -> u64 {
        self.nodes.iter().map(|n| n.cpu_ns).sum()
    }

    /// Share of the CPU time that ran away from the query's memory.
    pub fn remote_share(&self) -> f64 {
        let remote: u64 = self.nodes.iter().map(|n| n.remote_ns).sum();
        remote as f64 / self.cpu_ns().max(1) as f64
    }

    /// First arrival to last completion, ns.
    pub fn makespan_ns(&self) -> u64 {
        self.last_finish_ns.saturating_sub(self.first_arrival_ns)
    }

    /// Finished queries per second of makespan.
    pub fn throughput(&self) -> f64 {
        self.finished as f64 / (self.makespan_ns().max(1) as f64 / 1e9)
    }

    fn slot_time(&self) -> f64 {
        (f64::from(self.slots()) * self.makespan_ns() as f64).max(1.0)
    }

    /// Share of slot time left free over the makespan.
    pub fn idle_share(&self) -> f64 {
        self.idle_slot_ns as f64 / self.slot_time()
    }

    /// Share of slot time left free while a process waited (see
    /// [`NumaReport::stranded_slot_ns`]).
    pub fn stranded_share(&self) -> f64 {
        self.stranded_slot_ns as f64 / self.slot_time()
    }
}

/// The physical slots of the oblivious placement: which are taken, and their nodes.
pub(super) struct PhysSlots {
    node: Vec<u32>,
    taken: Vec<bool>,
}

impl PhysSlots {
    /// Slots numbered node by node: node 0's first.
    pub(super) fn new(node_slots: &[u32]) -> Self {
        let node: Vec<u32> = node_slots
            .iter()
            .enumerate()
            .flat_map(|(n, &s)| std::iter::repeat_n(n as u32, s as usize))
            .collect();
        PhysSlots {
            taken: vec![false; node.len()],
            node,
        }
    }

    /// Takes the slot `last` if it is free, else the lowest free one.
    pub(super) fn take(&mut self, last: Option<u32>) -> u32 {
        let s = match last {
            Some(l) if !self.taken[l as usize] => l as usize,
            _ => self
                .taken
                .iter()
                .position(|t| !t)
                .expect("a process granted a slot finds a free physical slot"),
        };
        self.taken[s] = true;
        s as u32
    }

    /// Frees slot `s`.
    pub(super) fn free(&mut self, s: u32) {
        debug_assert!(self.taken[s as usize], "freeing a free physical slot");
        self.taken[s as usize] = false;
    }

    /// The node of slot `s`.
    pub(super) fn node(&self, s: u32) -> u32 {
        self.node[s as usize]
    }
}

/// Work done and CPU used by a slice of at most `slice_ns` CPU time, with `left_ns` of
/// the query's work unassigned, at `penalty` (1 when local): remote work is done at
/// `1/penalty` of the rate, and the scheduler is charged the CPU time used.
pub(super) fn slice_work(slice_ns: u64, left_ns: u64, penalty: f64) -> (u64, u64) {
    let chunk = slice_ns.max(1).min(left_ns);
    if penalty == 1.0 {
        return (chunk, chunk);
    }
    let full = ((slice_ns.max(1) as f64 / penalty).floor() as u64).max(1);
    let work = full.min(left_ns);
    let used = ((work as f64 * penalty).round() as u64).max(1);
    (work, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_slots_prefer_the_last_then_the_lowest() {
        let mut p = PhysSlots::new(&[2, 2]);
        assert_eq!((0..4).map(|s| p.node(s)).collect::<Vec<_>>(), [0, 0, 1, 1]);
        assert_eq!(p.take(None), 0);
        assert_eq!(p.take(Some(3)), 3);
        assert_eq!(p.take(Some(0)), 1, "slot 0 is taken: the lowest free");
        p.free(0);
        assert_eq!(p.take(Some(3)), 0, "slot 3 is taken: the lowest free");
        assert_eq!(p.take(None), 2);
    }

    #[test]
    fn remote_slices_do_less_work_for_the_same_cpu() {
        assert_eq!(
            slice_work(2_000_000, 5_000_000, 1.0),
            (2_000_000, 2_000_000)
        );
        assert_eq!(slice_work(2_000_000, 700, 1.0), (700, 700));
        assert_eq!(
            slice_work(2_000_000, 5_000_000, 1.25),
            (1_600_000, 2_000_000)
        );
        // The last, partial slice: the CPU its work takes remotely.
        assert_eq!(
            slice_work(2_000_000, 1_000_000, 1.25),
            (1_000_000, 1_250_000)
        );
        let (work, used) = slice_work(2_000_000, 5_000_000, 1.3);
        assert_eq!(work, 1_538_461);
        assert!(used.abs_diff(2_000_000) <= 1);
    }

    #[test]
    fn report_shares() {
        let r = NumaReport {
            nodes: vec![
                NodeUsage {
                    slots: 2,
                    cpu_ns: 300,
                    remote_ns: 100,
                },
                NodeUsage {
                    slots: 2,
                    cpu_ns: 100,
                    remote_ns: 0,
                },
            ],
            first_arrival_ns: 100,
            last_finish_ns: 200,
            finished: 4,
            idle_slot_ns: 100,
            stranded_slot_ns: 40,
            ..Default::default()
        };
        assert_eq!((r.slots(), r.cpu_ns(), r.makespan_ns()), (4, 400, 100));
        assert_eq!(r.remote_share(), 0.25);
        assert_eq!((r.idle_share(), r.stranded_share()), (0.25, 0.1));
        assert_eq!(r.throughput(), 4e7);
    }
}
