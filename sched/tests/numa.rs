//! NUMA topology from sysfs fixture trees (tests/fixtures/sysfs: one node as on these
//! machines, 2×2, 4×8, asymmetric, a memory-only node, non-contiguous CPU lists and
//! node ids, a kernel without NUMA) and properties of the placement rules on random
//! topologies.

use pg_stride_sched::numa::*;
use proptest::prelude::*;
use std::path::PathBuf;

fn fixture(name: &str) -> Topology {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name);
    Topology::from_sysfs(&root).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn summary(t: &Topology) -> Vec<(u32, String, Option<u64>)> {
    t.nodes
        .iter()
        .map(|n| (n.id, format_cpu_list(&n.cpus), n.mem_total_kb))
        .collect()
}

#[test]
fn fixture_topologies_read_as_the_kernel_describes_them() {
    assert_eq!(
        summary(&fixture("one_node")),
        [(0, "0-1".into(), Some(12_937_420))]
    );
    assert_eq!(fixture("one_node").nodes[0].mem_free_kb, Some(6_097_852));
    assert_eq!(
        summary(&fixture("two_by_two")),
        [
            (0, "0-1".into(), Some(8_388_608)),
            (1, "2-3".into(), Some(8_388_608))
        ]
    );
    assert_eq!(fixture("four_by_eight").cpus_per_node(), [8, 8, 8, 8]);
    assert_eq!(fixture("four_by_eight").node_of_cpu(17), Some(2));
    assert_eq!(fixture("asymmetric").cpus_per_node(), [6, 2]);
    assert_eq!(fixture("memory_only").cpus_per_node(), [4, 4, 0]);
    // Node 1 offline: ids 0 and 2; node 2 has no meminfo.
    assert_eq!(
        summary(&fixture("noncontiguous")),
        [
            (0, "0-3,8-11".into(), Some(8_388_608)),
            (2, "4-7,12-15".into(), None)
        ]
    );
    assert_eq!(fixture("noncontiguous").node_of_cpu(12), Some(1));
    // No node directory: one node with the online CPUs, memory unknown.
    assert_eq!(summary(&fixture("no_numa")), [(0, "0-3".into(), None)]);
    assert!(Topology::from_sysfs(&PathBuf::from("/nonexistent")).is_err());
}

#[test]
fn slots_split_over_the_fixture_topologies() {
    let split = |name: &str, total| split_slots(total, &fixture(name).cpus_per_node());
    assert_eq!(split("one_node", 2), [2]);
    assert_eq!(split("two_by_two", 4), [2, 2]);
    assert_eq!(split("four_by_eight", 30), [8, 8, 7, 7]);
    assert_eq!(split("asymmetric", 8), [6, 2]);
    assert_eq!(split("memory_only", 6), [3, 3, 0]);
    // The server may use only node 0's CPUs: node 1 keeps its memory, gets no slot.
    let restricted = fixture("two_by_two").restrict(&[0, 1]).unwrap();
    assert_eq!(split_slots(4, &restricted.cpus_per_node()), [4, 0]);
}

fn topology() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..64, 1..9)
}

proptest! {
    #[test]
    fn cpu_lists_round_trip(ids in prop::collection::btree_set(0u32..300, 0..80)) {
        let ids: Vec<u32> = ids.into_iter().collect();
        prop_assert_eq!(parse_cpu_list(&format_cpu_list(&ids)).unwrap(), ids);
    }

    #[test]
    fn split_slots_adds_up_and_follows_the_cpus(cpus in topology(), total in 0u32..300) {
        let slots = split_slots(total, &cpus);
        let with_cpus = cpus.iter().filter(|&&c| c > 0).count() as u32;
        let expected = if with_cpus == 0 { 0 } else { total };
        prop_assert_eq!(slots.iter().sum::<u32>(), expected);
        for i in 0..cpus.len() {
            if cpus[i] == 0 {
                prop_assert_eq!(slots[i], 0);
            } else if total >= with_cpus {
                prop_assert!(slots[i] >= 1);
            }
            for j in 0..cpus.len() {
                if cpus[i] > cpus[j] {
                    prop_assert!(slots[i] >= slots[j], "{:?} -> {:?}", cpus, slots);
                }
                if cpus[i] == cpus[j] {
                    prop_assert!(slots[i].abs_diff(slots[j]) <= 1);
                }
            }
        }
    }

    #[test]
    fn the_home_has_slots_the_fewest_queries_then_the_lowest_utilisation_per_slot(
        loads in prop::collection::vec((0u32..8, 0u32..8, 0.0f64..8.0), 1..9)
    ) {
        let loads: Vec<NodeLoad> = loads
            .into_iter()
            .map(|(slots, homed, util)| NodeLoad { slots, running: 0, homed, util })
            .collect();
        match choose_home(&loads) {
            None => prop_assert!(loads.iter().all(|l| l.slots == 0)),
            Some(h) => {
                let best = &loads[h];
                prop_assert!(best.slots > 0);
                let homed = |l: &NodeLoad| f64::from(l.homed) / f64::from(l.slots);
                let util = |l: &NodeLoad| l.util / f64::from(l.slots);
                for l in loads.iter().filter(|l| l.slots > 0) {
                    prop_assert!(homed(best) <= homed(l));
                    if homed(best) == homed(l) {
                        prop_assert!(util(best) <= util(l));
                    }
                }
            }
        }
    }

    #[test]
    fn a_spec_places_every_cpu_on_its_node(sizes in prop::collection::vec(1u32..6, 1..6)) {
        let mut next = 0;
        let lists: Vec<String> = sizes
            .iter()
            .map(|&n| {
                let cpus: Vec<u32> = (next..next + n).collect();
                next += n;
                format_cpu_list(&cpus)
            })
            .collect();
        let t = Topology::from_spec(&lists.join("|")).unwrap();
        prop_assert_eq!(t.cpus_per_node(), sizes.clone());
        let mut cpu = 0;
        for (node, &n) in sizes.iter().enumerate() {
            for _ in 0..n {
                prop_assert_eq!(t.node_of_cpu(cpu), Some(node));
                cpu += 1;
            }
        }
    }
}

/// Registers a query homed on node `home` in group 0 and joins processes `procs` to it.
fn register_homed(s: &pg_stride_sched::SchedShared, home: u32, procs: &[u32]) {
    use pg_stride_sched::{GroupId, ProcId, QueryOptions};
    let q = s
        .register_query(
            GroupId(0),
            QueryOptions {
                home,
                ..Default::default()
            },
        )
        .unwrap();
    for &p in procs {
        s.join(ProcId(p), q).unwrap();
    }
}

/// Homes are chosen at every registration, but the utilisation average moves only when
/// the scheduler worker samples it (every 50 ms, by a tenth). Queries registering
/// between two samples must still spread over the nodes: a rule that ranks by the
/// average alone sends all of them to the node that looked idlest at the last sample
/// (herding), leaving the other node's slots idle while they queue — in the simulator
/// affine placement then lost to oblivious placement (`tests/numa_sim.rs`).
#[test]
fn homes_spread_between_utilisation_samples() {
    use pg_stride_sched::{Capacity, OwnedRegion, ProcId, SchedConfig, Turn};
    let cap = Capacity {
        max_procs: 16,
        max_queries: 16,
        max_groups: 1,
    };
    let s = OwnedRegion::new(
        cap,
        &SchedConfig {
            cpu_slots: 4,
            ..Default::default()
        },
    )
    .unwrap();
    s.set_node_slots(&[2, 2]);
    let start = |p: u32, home: u32| {
        register_homed(&s, home, &[p]);
        s.acquire(ProcId(p)).turn
    };
    // A query runs on node 1 while the worker samples: node 1 looks a little busier.
    assert_eq!(start(0, 1), Turn::Run);
    s.sample_node_util();
    // Eight arrive before the next sample.
    for p in 1..=8 {
        start(p, s.choose_home());
    }
    let homed: Vec<u32> = s.node_loads().iter().map(|l| l.homed).collect();
    assert!(
        homed[0].abs_diff(homed[1]) <= 1,
        "homes {homed:?}: queries registered between samples herd onto one node"
    );
    // With the queries counted, the next sample agrees with the counts.
    s.sample_node_util();
    let loads = s.node_loads();
    assert!(loads.iter().all(|l| l.running == 2), "{loads:?}");
}

/// A process that stole a slot keeps the right to steal while it runs there. When it
/// loses that slot at a slice end it waits as a stealer, but `end_slice` only offers it
/// the slot of the node it held: a free slot at its home stays free until a dispatch —
/// which its caller runs at once (the extension's slice end, the simulator).
#[test]
fn a_stealer_that_loses_its_slot_is_offered_its_free_home_slot_by_dispatch() {
    use pg_stride_sched::{Capacity, OwnedRegion, Policy, ProcId, SchedConfig, Turn};
    let s = OwnedRegion::new(
        Capacity {
            max_procs: 8,
            max_queries: 4,
            max_groups: 1,
        },
        &SchedConfig {
            cpu_slots: 2,
            policy: Policy::FairStride,
            ..Default::default()
        },
    )
    .unwrap();
    s.set_node_slots(&[1, 1]);
    let query = |home: u32, procs: &[u32]| register_homed(&s, home, procs);
    let slice = 2_000_000;
    query(0, &[0, 1]);
    assert_eq!(s.acquire(ProcId(0)).turn, Turn::Run);
    assert_eq!(s.acquire(ProcId(1)).turn, Turn::Wait);
    s.allow_steal(ProcId(1));
    assert_eq!(s.dispatch(), Some(ProcId(1)));
    assert_eq!(s.slot_node(ProcId(1)), Some(1));
    assert!(s.away_from_home(ProcId(1)) && !s.away_from_home(ProcId(0)));
    // Process 0 stops (it blocks, or its statement ends): nobody waits for node 0.
    assert_eq!(s.release(ProcId(0), slice), None);
    // A query homed on node 1 queues there, and wins node 1's slot at the stealer's
    // slice end by its lower pass.
    query(1, &[2]);
    assert_eq!(s.acquire(ProcId(2)).turn, Turn::Wait);
    let out = s.end_slice(ProcId(1), 10 * slice);
    assert_eq!((out.turn, out.wake), (Turn::Wait, Some(ProcId(2))));
    // The stealer waits; its home's slot is free.
    assert_eq!(s.node_loads()[0].running, 0);
    assert!(!s.is_running(ProcId(1)));
    // The caller's dispatch gives it that slot.
    assert_eq!(s.dispatch(), Some(ProcId(1)));
    assert_eq!(s.slot_node(ProcId(1)), Some(0));
    assert_eq!(s.dispatch(), None);
}
