//! CPU slots split by node (`pg_stride.numa = bind`; psaroudakis2016 §4, docs/design.md §10).
//!
//! Each node has its own slot count and its own count of slots held. A query has a home
//! node, chosen when it registers; its processes take slots on that node only, until one
//! of them has waited long enough to *steal*: then it may take a slot on any node, and
//! keeps that right until it runs at home again. A query whose home has no slots (the
//! slots were lowered below the number of nodes after it chose it) takes any node's.
//! With one node (slots not split) every query is at home everywhere and the region
//! behaves as without nodes.
//!
//! The hand-off invariant of `slots` holds per node: once the operations in flight have
//! returned, no slot of node `n` is free while a process that may run on `n` waits —
//! except that a process which becomes eligible for further nodes (it is allowed to
//! steal, or the node count changed under it) is only offered their free slots by the
//! next [`SchedShared::dispatch`]. The waiter runs that itself when it starts stealing,
//! and the scheduler worker runs it every round. A process that ends a slice on a slot
//! away from its home (it stole it) and has to wait keeps the right to steal, so it
//! waits as such a process: [`SchedShared::end_slice`] only offers it the slots of the
//! node it held, and its caller runs the dispatch (else it waits with its home's slot
//! free until its next steal timeout; found by the simulator, `tests/numa_sim.rs`).

use std::sync::atomic::Ordering::*;

use super::entries::*;
use super::SchedShared;
use crate::ids::ProcId;
use crate::numa::{choose_home, NodeLoad, UtilEma};

/// Most nodes the slots can be split over (as many as a machine's NUMA nodes that
/// pg_stride accounts for).
pub const MAX_SLOT_NODES: usize = 64;

impl SchedShared {
    /// Splits the CPU slots over nodes: node `i` gets `slots[i]`. One entry means the
    /// slots are not split. At most [`MAX_SLOT_NODES`] entries are used; an empty slice
    /// counts as one node without slots.
    ///
    /// Raising a node's slots frees them: the caller then calls
    /// [`SchedShared::dispatch`] until it returns `None`, waking each process returned.
    /// Lowering takes effect as holders end their slices; a process holding a slot of a
    /// node that no longer exists gives it up at its next slice end.
    pub fn set_node_slots(&self, slots: &[u32]) {
        let count = slots.len().clamp(1, MAX_SLOT_NODES);
        if count != self.node_count() {
            // Averages of another split say nothing about this one.
            for node in &self.nodes {
                node.util_bits.store(0f64.to_bits(), Relaxed);
            }
        }
        for (n, node) in self.nodes.iter().enumerate() {
            let s = if n < count {
                slots.get(n).copied().unwrap_or(0)
            } else {
                0
            };
            node.slots.store(s, SeqCst);
        }
        self.node_count.0.store(count as u32, SeqCst);
    }

    /// Changes the number of CPU slots without splitting them by node.
    pub fn set_cpu_slots(&self, slots: u32) {
        self.set_node_slots(&[slots]);
    }

    /// Each node's slots (one entry: not split).
    pub fn node_slots(&self) -> Vec<u32> {
        self.nodes[..self.node_count()]
            .iter()
            .map(|n| n.slots.load(SeqCst))
            .collect()
    }

    /// Nodes the slots are split over (1: not split).
    pub fn node_count(&self) -> usize {
        self.node_count
            .0
            .load(Relaxed)
            .clamp(1, MAX_SLOT_NODES as u32) as usize
    }

    /// Every node entry, including those beyond the node count (whose slots are 0 but
    /// which may still be held until their holders' next slice end).
    pub(super) fn slot_nodes(&self) -> &[NodeEntry] {
        &self.nodes
    }

    #[inline]
    pub(super) fn node(&self, n: usize) -> &NodeEntry {
        &self.nodes[n]
    }

    /// The node whose slots query entry `qe`'s processes take.
    #[inline]
    pub(super) fn home_of(&self, qe: &QueryEntry) -> usize {
        qe.home.load(Relaxed) as usize % self.node_count()
    }

    /// Of the waiting members `waiting` of query entry `qe`, those that may take a slot
    /// of node `n`: all of them on their home node, elsewhere those allowed to steal, or
    /// all of them when their home has no slots (`cpu_slots` lowered below the number of
    /// nodes): with stealing off they would otherwise wait for ever.
    #[inline]
    pub(super) fn eligible(&self, qe: &QueryEntry, waiting: u64, n: usize) -> u64 {
        let home = self.home_of(qe);
        if self.node_count() <= 1 || home == n || self.node(home).slots.load(SeqCst) == 0 {
            waiting
        } else {
            waiting & qe.may_steal.load(SeqCst)
        }
    }

    /// Waiting process `p` has waited long enough on its home node
    /// ([`crate::numa::StealPolicy`]): from now on it may take a slot of any node. The
    /// caller then calls [`SchedShared::dispatch`] until it returns `None`, waking each
    /// process returned (which may be `p` itself: it holds a slot then). Does nothing
    /// unless `p` waits.
    pub fn allow_steal(&self, p: ProcId) {
        let pe = self.proc(p);
        if pe.state.load(SeqCst) != PROC_WAITING {
            return;
        }
        let qe = &self.queries()[pe.query.load(Relaxed) as usize];
        qe.may_steal.fetch_or(1 << pe.member.load(Relaxed), SeqCst);
    }

    /// The node of the slot `p` holds, if it holds one.
    pub fn slot_node(&self, p: ProcId) -> Option<u32> {
        let pe = self.proc(p);
        (pe.state.load(SeqCst) == PROC_RUNNING).then(|| pe.node.load(Relaxed))
    }

    /// The home node of the query `p` works for.
    pub fn home_node(&self, p: ProcId) -> Option<u32> {
        let q = self.query_of(p)?;
        Some(self.home_of(self.query(q)) as u32)
    }

    /// Whether `p` holds a slot of another node than its home, with the slots split: it
    /// got there by stealing. If it has to wait at that slot's end, its caller runs
    /// [`SchedShared::dispatch`] (see the module comment).
    pub fn away_from_home(&self, p: ProcId) -> bool {
        self.node_count() > 1 && self.slot_node(p) != self.home_node(p)
    }

    /// Processes waiting for a slot, by the home node of their query (one entry per
    /// node the slots are split over). Reads every process entry.
    pub fn waiting_by_node(&self) -> Vec<u32> {
        let mut waiting = vec![0u32; self.node_count()];
        for pe in self.procs() {
            if pe.state.load(Relaxed) == PROC_WAITING {
                let q = pe.query.load(Relaxed) as usize;
                if let Some(qe) = self.queries().get(q) {
                    waiting[self.home_of(qe)] += 1;
                }
            }
        }
        waiting
    }

    /// Each node's load: slots, slots held, queries homed, utilisation average.
    pub fn node_loads(&self) -> Vec<NodeLoad> {
        self.nodes[..self.node_count()]
            .iter()
            .map(|n| NodeLoad {
                slots: n.slots.load(Relaxed),
                running: n.running.load(Relaxed),
                homed: n.homed.load(Relaxed),
                util: f64::from_bits(n.util_bits.load(Relaxed)),
            })
            .collect()
    }

    /// Folds each node's demand — slots held plus processes waiting for a slot there —
    /// into its utilisation average: a node whose queries queue counts as busier than
    /// one whose slots are merely all in use. Only the scheduler worker calls this
    /// (every [`crate::hint::HINT_INTERVAL_MS`]), so a plain store suffices; it reads every
    /// process entry.
    pub fn sample_node_util(&self) {
        let count = self.node_count();
        // Unsplit, the one average is never asked: spare the scan.
        let waiting = if count > 1 {
            self.waiting_by_node()
        } else {
            vec![0]
        };
        for (node, waiting) in self.nodes[..count].iter().zip(waiting) {
            let demand = node.running.load(Relaxed) + waiting;
            let mut ema = UtilEma(f64::from_bits(node.util_bits.load(Relaxed)));
            ema.sample(f64::from(demand));
            node.util_bits.store(ema.0.to_bits(), Relaxed);
        }
    }

    /// The home node for a query registering now: the one with the fewest homed queries
    /// per slot, then the least utilised per slot ([`choose_home`]); node 0 when the
    /// slots are not split.
    pub fn choose_home(&self) -> u32 {
        if self.node_count() <= 1 {
            return 0;
        }
        choose_home(&self.node_loads()).unwrap_or(0) as u32
    }
}
