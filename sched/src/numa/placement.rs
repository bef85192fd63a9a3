//! Where `pg_stride.numa = bind` runs work (psaroudakis2016 §4, docs/design.md §10): the CPU
//! slots split by node, each query's home node chosen at admission, and the rule for
//! running a query on another node than its home (stealing).

/// Splits `total` CPU slots over nodes with `cpus[i]` CPUs each: every node with CPUs
/// gets one (when there are enough slots), the rest in proportion to the CPUs by the
/// largest remainder, so that a node with more CPUs never gets fewer slots. Nodes
/// without CPUs get none. With fewer slots than nodes with CPUs, the nodes with the
/// most CPUs (then the lowest) get one each. The counts add up to `total`.
pub fn split_slots(total: u32, cpus: &[u32]) -> Vec<u32> {
    let mut slots = vec![0u32; cpus.len()];
    let mut with_cpus: Vec<usize> = (0..cpus.len()).filter(|&i| cpus[i] > 0).collect();
    if with_cpus.len() as u64 > u64::from(total) {
        // Most CPUs first; the sort is stable, so ties stay in node order.
        with_cpus.sort_by_key(|&i| std::cmp::Reverse(cpus[i]));
        for &i in with_cpus.iter().take(total as usize) {
            slots[i] = 1;
        }
        return slots;
    }
    let rest = u64::from(total) - with_cpus.len() as u64;
    let sum: u64 = with_cpus.iter().map(|&i| u64::from(cpus[i])).sum();
    let mut given = 0;
    let mut remainders = Vec::with_capacity(with_cpus.len());
    for &i in &with_cpus {
        let share = rest * u64::from(cpus[i]);
        let whole = share / sum;
        slots[i] = 1 + whole as u32;
        given += whole;
        remainders.push((share % sum, cpus[i], i));
    }
    // Largest remainder first; equal remainders: more CPUs, then the lower node.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    for &(_, _, i) in remainders.iter().take((rest - given) as usize) {
        slots[i] += 1;
    }
    slots
}

/// A node's load, as home-node choice and stealing see it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeLoad {
    /// CPU slots of the node.
    pub slots: u32,
    /// Slots in use now.
    pub running: u32,
    /// Queries whose home the node is.
    pub homed: u32,
    /// Recent utilisation: the moving average of slots in use ([`UtilEma`]).
    pub util: f64,
}

/// A moving average of a node's slots in use, sampled periodically
/// (psaroudakis2016 §4 keeps utilisation histories per socket; an average is what the
/// home-node choice needs of them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UtilEma(pub f64);

impl UtilEma {
    /// Weight of the newest sample (psaroudakis2016: `0.9·old + 0.1·new`).
    pub const ALPHA: f64 = 0.1;

    /// Folds in a sample of slots in use.
    pub fn sample(&mut self, in_use: f64) {
        self.0 += Self::ALPHA * (in_use - self.0);
    }
}

/// The home node for a new query: among the nodes with slots, the one with the fewest
/// homed queries per slot; ties go to the one least utilised per slot, then the lowest
/// index. `None` if no node has a slot.
///
/// The homed count comes first because it is current: a query is counted the moment it
/// registers, while the utilisation average moves only when the scheduler worker samples
/// it (every [`crate::hint::HINT_INTERVAL_MS`], by a tenth). Ranked by the average first, every
/// query registering between two samples went to the node that looked idlest at the
/// last one, however many had just been homed there — the herd effect of stale load
/// information — and the other node's slots stayed idle while those queries queued
/// (`tests/numa.rs`, `homes_spread_between_utilisation_samples`; in the simulator this
/// made affine placement slower than oblivious placement, `tests/numa_sim.rs`). The
/// average still separates nodes with as many queries, such as long queries against
/// short ones.
pub fn choose_home(loads: &[NodeLoad]) -> Option<usize> {
    let util_per_slot = |l: &NodeLoad| l.util / f64::from(l.slots);
    // homed_a / slots_a against homed_b / slots_b, exactly.
    let homed_per_slot = |a: &NodeLoad, b: &NodeLoad| {
        (u64::from(a.homed) * u64::from(b.slots)).cmp(&(u64::from(b.homed) * u64::from(a.slots)))
    };
    (0..loads.len())
        .filter(|&i| loads[i].slots > 0)
        .min_by(|&a, &b| {
            let (la, lb) = (&loads[a], &loads[b]);
            homed_per_slot(la, lb)
                .then(util_per_slot(la).total_cmp(&util_per_slot(lb)))
                .then(a.cmp(&b))
        })
}

/// When a query that waits for a slot on its home node may take one on another node
/// (psaroudakis2016 §4: stealing keeps cores busy, but moves a memory-intensive query
/// away from its data, so it is forbidden above an intensity threshold).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StealPolicy {
    /// Slices a query waits on its home node before it may steal.
    pub after_slices: u32,
    /// Memory intensity above which a query never steals (`None`: no limit). The unit
    /// is the caller's (pg_stride: buffers read per CPU ms, a proxy for the memory
    /// throughput psaroudakis2016 reads from hardware counters).
    pub max_intensity: Option<f64>,
}

impl StealPolicy {
    /// Whether a query that has waited `waited_slices` with memory intensity
    /// `intensity` may run on another node.
    pub fn allows(&self, waited_slices: u32, intensity: f64) -> bool {
        waited_slices >= self.after_slices && self.max_intensity.is_none_or(|m| intensity <= m)
    }

    /// The node a query homed at `home` steals a slot from: another node with a free
    /// slot, the one with the most free slots, then the least utilised, then the lowest.
    pub fn target(&self, home: usize, loads: &[NodeLoad]) -> Option<usize> {
        let free = |l: &NodeLoad| l.slots.saturating_sub(l.running);
        (0..loads.len())
            .filter(|&i| i != home && free(&loads[i]) > 0)
            .min_by(|&a, &b| {
                free(&loads[b])
                    .cmp(&free(&loads[a]))
                    .then(loads[a].util.total_cmp(&loads[b].util))
                    .then(a.cmp(&b))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cpus() {
        assert_eq!(split_slots(2, &[2]), [2]);
        assert_eq!(split_slots(8, &[4, 4]), [4, 4]);
        assert_eq!(split_slots(6, &[8, 4]), [4, 2]);
        // Asymmetric: every node with CPUs keeps one slot.
        assert_eq!(split_slots(5, &[1, 1, 1, 100]), [1, 1, 1, 2]);
        // Memory-only nodes get none.
        assert_eq!(split_slots(4, &[2, 0, 2]), [2, 0, 2]);
        // Fewer slots than nodes: the biggest nodes first, then the lowest.
        assert_eq!(split_slots(2, &[2, 4, 4]), [0, 1, 1]);
        assert_eq!(split_slots(1, &[2, 2]), [1, 0]);
        assert_eq!(split_slots(0, &[2, 2]), [0, 0]);
        // More slots than CPUs (a limit that does not limit).
        assert_eq!(split_slots(4096, &[2, 6]), [1024, 3072]);
    }

    #[test]
    fn the_home_has_the_fewest_queries_then_the_least_utilisation_per_slot() {
        let load = |slots, running, homed, util| NodeLoad {
            slots,
            running,
            homed,
            util,
        };
        assert_eq!(
            choose_home(&[load(4, 4, 3, 3.5), load(4, 1, 1, 1.0)]),
            Some(1)
        );
        // Queries just registered on node 0, not sampled yet: the count decides.
        assert_eq!(
            choose_home(&[load(2, 2, 3, 0.1), load(2, 1, 1, 1.8)]),
            Some(1)
        );
        // Per slot: 2 of 4 is fewer than 2 of 2.
        assert_eq!(
            choose_home(&[load(2, 0, 2, 0.0), load(4, 0, 2, 3.0)]),
            Some(1)
        );
        // As many queries per slot: the lower utilisation per slot, 2 of 8 against 1.5
        // of 4.
        assert_eq!(
            choose_home(&[load(4, 0, 0, 1.5), load(8, 0, 0, 2.0)]),
            Some(1)
        );
        assert_eq!(
            choose_home(&[load(2, 0, 1, 1.9), load(2, 0, 1, 0.2)]),
            Some(1)
        );
        // All equal: the lower node.
        assert_eq!(
            choose_home(&[load(2, 0, 0, 0.0), load(2, 0, 0, 0.0)]),
            Some(0)
        );
        // A node without slots (memory only) is never a home.
        assert_eq!(
            choose_home(&[load(0, 0, 0, 0.0), load(1, 1, 5, 1.0)]),
            Some(1)
        );
        assert_eq!(choose_home(&[load(0, 0, 0, 0.0)]), None);
    }

    #[test]
    fn the_average_moves_a_tenth_of_the_way() {
        let mut u = UtilEma::default();
        u.sample(10.0);
        assert!((u.0 - 1.0).abs() < 1e-12);
        for _ in 0..200 {
            u.sample(4.0);
        }
        assert!((u.0 - 4.0).abs() < 1e-6);
    }

    #[test]
    fn stealing_waits_and_spares_memory_bound_queries() {
        let p = StealPolicy {
            after_slices: 3,
            max_intensity: Some(100.0),
        };
        assert!(!p.allows(2, 0.0));
        assert!(p.allows(3, 100.0));
        assert!(!p.allows(50, 100.5));
        let loads = [
            NodeLoad {
                slots: 2,
                running: 2,
                ..Default::default()
            },
            NodeLoad {
                slots: 2,
                running: 1,
                util: 0.5,
                ..Default::default()
            },
            NodeLoad {
                slots: 2,
                running: 1,
                util: 0.2,
                ..Default::default()
            },
            NodeLoad {
                slots: 0,
                running: 0,
                ..Default::default()
            },
        ];
        assert_eq!(p.target(0, &loads), Some(2));
        assert_eq!(p.target(2, &loads), Some(1));
        let full = [loads[0], loads[0]];
        assert_eq!(p.target(0, &full), None);
    }
}
