//! Cost of the per-slice operations (wagner2021 §3.1: "each scheduling decision takes less
//! than one microsecond"; docs/design.md §3: a yield point that does not switch must cost well
//! under 1 µs).
//!
//! * `yield_check/no_switch` — `end_slice` when nobody waits: charge plus the fast check.
//! * `decision/switch_16`, `decision/switch_64` — `end_slice` with 15 (63) processes of
//!   other queries in 4 groups waiting: charge, choose the lowest pass, hand the slot over
//!   (every iteration).
//! * `decision/keep_16` — the same scan when the runner keeps its slot (FIFO: it is the
//!   oldest).
//! * `acquire_release/uncontended` — taking and giving back a free slot.
//! * `slice_clock/chunk_done` — the per-process chunk sizing at a slice end.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use pg_stride_sched::*;

const SLICE: u64 = 2_000_000;

fn region(slots: u32, policy: Policy, queries: u32) -> (OwnedRegion, Vec<ProcId>) {
    let cap = Capacity {
        max_procs: 64,
        max_queries: 64,
        max_groups: 8,
    };
    let config = SchedConfig {
        cpu_slots: slots,
        policy,
        decay: DecayParams::default(),
    };
    let region = OwnedRegion::new(cap, &config).unwrap();
    let procs: Vec<ProcId> = (0..queries)
        .map(|i| {
            let q = region
                .register_query(GroupId(i % 4), QueryOptions::default())
                .unwrap();
            region.join(ProcId(i), q).unwrap();
            let _ = region.acquire(ProcId(i));
            ProcId(i)
        })
        .collect();
    (region, procs)
}

fn benches(c: &mut Criterion) {
    let (s, procs) = region(1, Policy::DecayingStride, 1);
    c.bench_function("yield_check/no_switch", |b| {
        b.iter(|| black_box(s.end_slice(procs[0], black_box(SLICE))))
    });

    for waiting in [16, 64] {
        let (s, procs) = region(1, Policy::FairStride, waiting);
        let mut runner = procs[0];
        assert!(s.is_running(runner));
        c.bench_function(&format!("decision/switch_{waiting}"), |b| {
            b.iter(|| {
                let out = s.end_slice(runner, black_box(SLICE));
                runner = out.wake.expect("the lowest pass is always another query");
            })
        });
    }

    let (s, procs) = region(1, Policy::Fifo, 16);
    c.bench_function("decision/keep_16", |b| {
        b.iter(|| {
            let out = s.end_slice(procs[0], black_box(SLICE));
            assert_eq!(out.turn, Turn::Run);
        })
    });

    let (s, procs) = region(4, Policy::DecayingStride, 1);
    assert_eq!(s.release(procs[0], 0), None);
    c.bench_function("acquire_release/uncontended", |b| {
        b.iter(|| {
            let out = black_box(s.acquire(procs[0]));
            debug_assert_eq!(out.turn, Turn::Run);
            black_box(s.release(procs[0], black_box(SLICE)));
        })
    });

    let mut clock = SliceClock::new(SLICE);
    c.bench_function("slice_clock/chunk_done", |b| {
        b.iter(|| black_box(clock.chunk_done(black_box(SLICE))))
    });
}

criterion_group!(sched, benches);
criterion_main!(sched);
