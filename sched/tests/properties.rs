//! Properties of the scheduling policy, checked through the simulator (which runs the
//! shared-memory scheduler itself): proportional shares, wagner2021 principle 1, and
//! freedom from starvation thanks to `p_min`.

use pg_stride_sched::decay::{P0, P_MIN};
use pg_stride_sched::sim::{simulate, QueryResult, QuerySpec, SimConfig};
use pg_stride_sched::{DecayParams, GroupConfig, Policy};
use proptest::prelude::*;

const SLICE: u64 = 2_000_000;

fn spec(arrival_ns: u64, cpu_ns: u64, group: u32, class: &str) -> QuerySpec {
    QuerySpec {
        arrival_ns,
        cpu_ns,
        group,
        class: class.to_string(),
        procs: 1,
        pinned_priority: None,
        fingerprint: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Fixed priorities: over 10^5 slices every query gets `w_g/Σw · p_i/Σp_g` of the CPU,
    /// within 2 % of that share, or within 10 slices for the smallest shares (1/441 of
    /// the slices is about 230: 2 % of it is less than the slice or two by which stride
    /// scheduling's order may leave any one client, per slot).
    #[test]
    fn shares_converge_to_weights_and_priorities(
        weights in prop::collection::vec(1u32..=10, 1..=3),
        priorities in prop::collection::vec(prop::collection::vec(1u32..=10, 1..=3), 3),
        slots in 1u32..=4,
    ) {
        let horizon = 100_000 * SLICE / slots as u64;
        let mut workload = Vec::new();
        let mut expected = Vec::new();
        let weight_sum: u32 = weights.iter().sum();
        for (g, &w) in weights.iter().enumerate() {
            let prio_sum: u32 = priorities[g].iter().sum();
            for &p in &priorities[g] {
                let mut q = spec(0, horizon * slots as u64, g as u32, "q");
                q.procs = slots; // enough processes to use every slot
                q.pinned_priority = Some(p * 1_000);
                workload.push(q);
                expected.push(w as f64 / weight_sum as f64 * p as f64 / prio_sum as f64);
            }
        }
        let cfg = SimConfig {
            groups: weights.iter().map(|&w| GroupConfig { weight: w * 100, ..GroupConfig::default() }).collect(),
            horizon_ns: Some(horizon),
            ..SimConfig::new(slots, Policy::FairStride)
        };
        let results = simulate(&workload, &cfg);
        let total: u64 = results.iter().map(|r| r.received_ns).sum();
        prop_assert!(total >= 99_000 * SLICE, "only {} slices ran", total / SLICE);
        for (r, want) in results.iter().zip(&expected) {
            let got = r.received_ns as f64 / total as f64;
            let tolerance = (0.02 * want).max(10.0 * SLICE as f64 / total as f64);
            prop_assert!((got - want).abs() <= tolerance, "share {got:.5}, expected {want:.5}");
        }
    }

    /// wagner2021 §3.2 principle 1: of two queries arriving together, the one needing
    /// less CPU finishes first under decaying priorities — whatever else is running, and
    /// for any decay parameters. "Less" means by at least one slice: below that, the
    /// order depends on which of the two got the first slice.
    #[test]
    fn shorter_of_two_simultaneous_queries_finishes_first(
        at_ms in 0u64..300,
        short_ms in 1u64..150,
        extra_ms in 2u64..150,
        background in prop::collection::vec((0u64..400, 1u64..120), 0..12),
        lambda in 0.3f64..1.0,
        d_start in 0u32..20,
    ) {
        let mut workload = vec![
            spec(at_ms * 1_000_000, short_ms * 1_000_000, 0, "short"),
            spec(at_ms * 1_000_000, (short_ms + extra_ms) * 1_000_000, 0, "long"),
        ];
        workload.extend(background.iter().map(|&(a, c)| spec(a * 1_000_000, c * 1_000_000, 0, "bg")));
        let cfg = SimConfig {
            decay: DecayParams { lambda, d_start, quantum_ns: SLICE },
            ..SimConfig::new(1, Policy::DecayingStride)
        };
        let results = simulate(&workload, &cfg);
        let finish = |class: &str| results.iter().find(|r| r.class == class).and_then(|r| r.finish_ns).unwrap();
        prop_assert!(finish("short") < finish("long"), "short {} >= long {}", finish("short"), finish("long"));
    }

    /// No starvation: a long query whose priority decayed to `p_min` keeps getting CPU
    /// under a never-ending overload of fresh high-priority queries. Stride bounds its
    /// wait: its pass leads the global pass by at most one stride `K/p_min`, which the
    /// global pass covers within `Σp/p_min ≤ n·p0/p_min` slices, after which arrivals
    /// queue behind it.
    #[test]
    fn decayed_query_does_not_starve(
        active in 2u32..=6,
        short_ms in 2u64..=10,
    ) {
        let (long, results) = starvation_run(active, short_ms, None);
        let bound = (2 * active as u64 * (P0 / P_MIN) as u64 + active as u64 + 2) * SLICE;
        prop_assert!(long.finish_ns.is_some(), "the long query never finished: {long:?}");
        prop_assert!(long.max_wait_ns <= bound, "waited {} ms, bound {} ms", long.max_wait_ns / 1_000_000, bound / 1_000_000);
        prop_assert!(results.iter().filter(|r| r.finish_ns.is_some()).count() > 1_000);
    }
}

/// One long query (20 ms) at time 0, then short queries arriving at 111 % of capacity for
/// a minute, with at most `active` queries admitted at once. Returns the long query's
/// result and all results.
fn starvation_run(
    active: u32,
    short_ms: u64,
    long_pinned: Option<u32>,
) -> (QueryResult, Vec<QueryResult>) {
    let mut workload = vec![spec(0, 20_000_000, 0, "long")];
    workload[0].pinned_priority = long_pinned;
    let gap = short_ms * 900_000;
    workload.extend(
        (1..=60_000_000_000 / gap).map(|i| spec(i * gap, short_ms * 1_000_000, 0, "short")),
    );
    let cfg = SimConfig {
        decay: DecayParams {
            lambda: 0.5,
            d_start: 2,
            quantum_ns: SLICE,
        },
        max_active: active,
        horizon_ns: Some(60_000_000_000),
        ..SimConfig::new(1, Policy::DecayingStride)
    };
    let results = simulate(&workload, &cfg);
    (results[0].clone(), results)
}

/// The control for `decayed_query_does_not_starve`: the same overload starves a query
/// whose priority may sink to 1 instead of `p_min`, so the property is `p_min`'s doing.
#[test]
fn without_p_min_the_long_query_starves() {
    let (long, _) = starvation_run(6, 4, Some(1));
    assert_eq!(long.finish_ns, None, "{long:?}");
    assert!(long.received_ns < 20_000_000);
}

/// The benchmark's shape (bench/scheduling.py): two groups with weights 3:1, each
/// running two serial queries, on two slots with decaying priorities. The CPU of the
/// groups follows the weights.
#[test]
fn serial_queries_of_two_groups_share_by_weight() {
    let horizon = 60_000_000_000;
    let workload: Vec<QuerySpec> = [0, 1, 0, 1]
        .iter()
        .map(|&g| spec(0, horizon, g, "long"))
        .collect();
    let cfg = SimConfig {
        groups: vec![
            GroupConfig {
                weight: 300,
                ..GroupConfig::default()
            },
            GroupConfig {
                weight: 100,
                ..GroupConfig::default()
            },
        ],
        horizon_ns: Some(horizon),
        ..SimConfig::new(2, Policy::DecayingStride)
    };
    let results = simulate(&workload, &cfg);
    let cpu = |g: u32| {
        results
            .iter()
            .filter(|r| r.group == g)
            .map(|r| r.received_ns)
            .sum::<u64>() as f64
    };
    let ratio = cpu(0) / cpu(1);
    assert!((ratio - 3.0).abs() < 0.1, "CPU ratio {ratio:.3}");
}
