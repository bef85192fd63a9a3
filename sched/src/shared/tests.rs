//! Single-threaded tests of the shared form's protocol and accounting.

use super::*;
use crate::decay::{PriorityRange, P0, P_MIN};
use crate::predict::StartPolicy;

fn region(slots: u32, policy: Policy) -> OwnedRegion {
    let cap = Capacity {
        max_procs: 32,
        max_queries: 16,
        max_groups: 4,
    };
    OwnedRegion::new(
        cap,
        &SchedConfig {
            cpu_slots: slots,
            policy,
            decay: DecayParams::default(),
        },
    )
    .unwrap()
}

/// Registers a query in group `g` with one process `p` joined.
fn query_with(s: &SchedShared, g: u32, p: u32) -> QueryId {
    let q = s
        .register_query(GroupId(g), QueryOptions::default())
        .unwrap();
    s.join(ProcId(p), q).unwrap();
    q
}

const RUN: Outcome = Outcome {
    turn: Turn::Run,
    wake: None,
};
const WAIT: Outcome = Outcome {
    turn: Turn::Wait,
    wake: None,
};
const SLICE: u64 = 2_000_000;

#[test]
fn free_slots_are_taken_then_processes_queue() {
    let s = region(2, Policy::FairStride);
    for p in 0..3 {
        query_with(&s, 0, p);
    }
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), RUN);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    assert_eq!(s.running(), 2);
    assert!(!s.nobody_waits());
    // Releasing hands the slot straight to the waiter.
    assert_eq!(s.release(ProcId(0), SLICE), Some(ProcId(2)));
    assert!(s.is_running(ProcId(2)));
    assert_eq!(s.running(), 2);
    assert!(s.nobody_waits());
    assert_eq!(s.release(ProcId(1), 0), None);
    assert_eq!(s.release(ProcId(2), 0), None);
    assert_eq!(s.running(), 0);
}

#[test]
fn slice_end_without_waiters_keeps_the_slot() {
    let s = region(1, Policy::DecayingStride);
    let q = query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    for _ in 0..5 {
        assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    }
    let snap = s.query_snapshot(q).unwrap();
    assert_eq!(snap.cpu_ns, 5 * SLICE);
    assert_eq!(s.proc_snapshot(ProcId(0)).slices, 5);
    assert_eq!(s.proc_snapshot(ProcId(0)).switches, 0);
}

#[test]
fn lowest_pass_runs_next_and_the_runner_yields() {
    let s = region(1, Policy::FairStride);
    let a = query_with(&s, 0, 0);
    let b = query_with(&s, 0, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    // A ran a slice: its pass is now ahead of B's, so B gets the slot.
    assert_eq!(
        s.end_slice(ProcId(0), SLICE),
        Outcome {
            turn: Turn::Wait,
            wake: Some(ProcId(1))
        }
    );
    assert!(s.is_running(ProcId(1)));
    assert!(!s.is_running(ProcId(0)));
    assert_eq!(s.proc_snapshot(ProcId(0)).switches, 1);
    // B runs a shorter slice: still behind A, so it keeps the slot.
    assert_eq!(s.end_slice(ProcId(1), SLICE / 2), RUN);
    assert_eq!(
        s.end_slice(ProcId(1), SLICE),
        Outcome {
            turn: Turn::Wait,
            wake: Some(ProcId(0))
        }
    );
    let (pa, pb) = (
        s.query_snapshot(a).unwrap().pass,
        s.query_snapshot(b).unwrap().pass,
    );
    assert!(crate::stride::pass_before(pa, pb));
}

#[test]
fn new_query_starts_at_the_global_pass() {
    let s = region(1, Policy::FairStride);
    let a = query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    for _ in 0..100 {
        assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    }
    let b = query_with(&s, 0, 1);
    let (pa, pb) = (
        s.query_snapshot(a).unwrap().pass,
        s.query_snapshot(b).unwrap().pass,
    );
    // The global pass advanced with A's slices (A was alone: at A's own rate).
    assert!(pb > 0);
    assert_eq!(pa, pb);
    // So B does not get 100 slices in a row: the two alternate.
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.end_slice(ProcId(0), SLICE).wake, Some(ProcId(1)));
    assert_eq!(s.end_slice(ProcId(1), SLICE).wake, Some(ProcId(0)));
}

/// CPU each of processes 0 and 1, sharing one slot (process 0 holding it), gets over
/// `slices` slices, each handed on as `end_slice` says.
fn alternate(s: &SchedShared, slices: u32) -> [u64; 2] {
    let mut cpu = [0u64; 2];
    let mut runner = 0u32;
    for _ in 0..slices {
        cpu[runner as usize] += SLICE;
        if let Some(w) = s.end_slice(ProcId(runner), SLICE).wake {
            runner = w.0;
        }
    }
    cpu
}

#[test]
fn groups_are_chosen_before_queries() {
    let s = region(1, Policy::FairStride);
    s.configure_group(
        GroupId(1),
        GroupConfig {
            weight: 300,
            ..GroupConfig::default()
        },
    );
    let _a = query_with(&s, 0, 0);
    let _b = query_with(&s, 1, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    let cpu = alternate(&s, 4_000);
    // Weight 300 against 100: three quarters of the CPU.
    let share = cpu[1] as f64 / (cpu[0] + cpu[1]) as f64;
    assert!((share - 0.75).abs() < 0.005, "share {share}");
}

#[test]
fn a_moved_query_takes_its_new_groups_weight_and_priorities() {
    let s = region(1, Policy::DecayingStride);
    s.configure_group(
        GroupId(2),
        GroupConfig {
            weight: 300,
            priority: PriorityRange::new(P0 / 10, P_MIN / 10),
            ..GroupConfig::default()
        },
    );
    let a = query_with(&s, 0, 0);
    let b = query_with(&s, 1, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    // Only a query whose one member is not waiting may move.
    assert_eq!(
        s.move_query(b, GroupId(2), None),
        Err(SchedError::QueryInUse)
    );
    s.move_query(a, GroupId(2), None).unwrap();
    let snap = s.query_snapshot(a).unwrap();
    assert_eq!((snap.group, snap.priority), (GroupId(2), P0 / 10));
    assert_eq!(s.groups()[0].prio_sum.load(Relaxed), 0);
    assert_eq!(s.groups()[2].prio_sum.load(Relaxed), (P0 / 10) as u64);
    assert_eq!(s.weight_sum.load(Relaxed), 400, "groups 1 and 2 are active");
    // Weight 300 against 100 from now on: three quarters of the CPU.
    let cpu = alternate(&s, 4_000);
    let share = cpu[0] as f64 / (cpu[0] + cpu[1]) as f64;
    assert!((share - 0.75).abs() < 0.01, "share {share}");
    // It decays within its new range, and the sums stay right.
    assert_eq!(s.query_snapshot(a).unwrap().priority, P_MIN / 10);
    let holder = if s.is_running(ProcId(0)) { 0 } else { 1 };
    assert_eq!(s.release(ProcId(holder), 0).map(|p| p.0), Some(1 - holder));
    assert_eq!(s.release(ProcId(1 - holder), 0), None);
    for (p, q) in [(0, a), (1, b)] {
        assert_eq!(s.leave(ProcId(p)), None);
        s.unregister_query(q).unwrap();
    }
    for g in 0..3 {
        assert_eq!(s.groups()[g].prio_sum.load(Relaxed), 0, "group {g}");
    }
    assert_eq!(s.weight_sum.load(Relaxed), 0);
}

#[test]
fn decay_lowers_priority_per_quantum_and_keeps_the_sum() {
    let s = region(1, Policy::DecayingStride);
    s.set_decay(DecayParams {
        lambda: 0.5,
        d_start: 2,
        quantum_ns: SLICE,
    });
    let q = query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    let prio = |s: &SchedShared| s.query_snapshot(q).unwrap().priority;
    assert_eq!(prio(&s), P0);
    assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    assert_eq!(prio(&s), P0);
    assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    assert_eq!(prio(&s), P0 / 2);
    // Half a quantum: no boundary crossed.
    assert_eq!(s.end_slice(ProcId(0), SLICE / 2), RUN);
    assert_eq!(prio(&s), P0 / 2);
    for _ in 0..20 {
        assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    }
    assert_eq!(prio(&s), P_MIN);
    assert_eq!(s.groups()[0].prio_sum.load(Relaxed), P_MIN as u64);
    assert_eq!(s.release(ProcId(0), 0), None);
    assert_eq!(s.leave(ProcId(0)), None);
    s.unregister_query(q).unwrap();
    assert_eq!(s.groups()[0].prio_sum.load(Relaxed), 0);
    assert_eq!(s.weight_sum.load(Relaxed), 0);
}

#[test]
fn pinned_and_group_priorities() {
    let s = region(1, Policy::DecayingStride);
    s.configure_group(
        GroupId(2),
        GroupConfig {
            priority: PriorityRange::new(P0 / 2, P_MIN / 2),
            ..GroupConfig::default()
        },
    );
    let pinned = s
        .register_query(
            GroupId(0),
            QueryOptions {
                pinned_priority: Some(777),
                ..Default::default()
            },
        )
        .unwrap();
    s.join(ProcId(0), pinned).unwrap();
    let from_group = query_with(&s, 2, 1);
    assert_eq!(s.query_snapshot(from_group).unwrap().priority, P0 / 2);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    for _ in 0..100 {
        assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    }
    assert_eq!(s.query_snapshot(pinned).unwrap().priority, 777);
}

#[test]
fn a_query_far_ahead_of_its_group_stays_behind_a_newcomer() {
    // Passes live in u64 and are compared by signed difference. A query pinned at
    // priority 1 runs for 9,000 s of CPU (2^50 pass units a second) beside a registered
    // query of priority 10,000 that keeps its group's virtual time, where newcomers
    // start, almost still: its lead passes 2^63 unless bounded, and it would come
    // before every newcomer.
    let s = region(1, Policy::DecayingStride);
    let pinned = |priority| QueryOptions {
        pinned_priority: Some(priority),
        ..Default::default()
    };
    let long = s.register_query(GroupId(0), pinned(1)).unwrap();
    s.join(ProcId(0), long).unwrap();
    let high = s.register_query(GroupId(0), pinned(10_000)).unwrap();
    s.join(ProcId(1), high).unwrap();
    assert_eq!(s.acquire(ProcId(0)), RUN);
    for _ in 0..9 {
        assert_eq!(s.end_slice(ProcId(0), 1_000_000_000_000), RUN);
    }
    query_with(&s, 0, 2);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    let out = s.end_slice(ProcId(0), SLICE);
    assert_eq!((out.turn, out.wake), (Turn::Wait, Some(ProcId(2))));
}

#[test]
fn a_holders_priority_is_known_while_it_holds_its_slot() {
    let s = region(1, Policy::DecayingStride);
    let queries = [query_with(&s, 0, 0), query_with(&s, 0, 1)];
    assert_eq!(s.holder_priority(ProcId(0)), None);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.holder_priority(ProcId(0)), Some(P0));
    // A waiter has no holder's priority, and neither has a process without a query.
    assert_eq!(s.holder_priority(ProcId(1)), None);
    assert_eq!(s.holder_priority(ProcId(5)), None);
    for _ in 0..40 {
        let holder = u32::from(s.is_running(ProcId(1)));
        let _ = s.end_slice(ProcId(holder), SLICE);
    }
    let holder = usize::from(s.is_running(ProcId(1)));
    let decayed = s.query_snapshot(queries[holder]).unwrap().priority;
    assert!(decayed < P0);
    assert_eq!(s.holder_priority(ProcId(holder as u32)), Some(decayed));
    assert_eq!(s.holder_priority(ProcId(1 - holder as u32)), None);
}

#[test]
fn a_group_may_decay_on_its_own_terms() {
    // Two slots, one query each: group 1 decays from the first quantum by half, group
    // 0 keeps the global d_start of 8 quanta.
    let s = region(2, Policy::DecayingStride);
    s.configure_group(
        GroupId(1),
        GroupConfig {
            decay_lambda: Some(0.5),
            decay_start: Some(0),
            ..GroupConfig::default()
        },
    );
    assert_eq!(s.group_config(GroupId(1)).decay_lambda, Some(0.5));
    assert_eq!(s.group_config(GroupId(0)).decay_start, None);
    let global = query_with(&s, 0, 0);
    let own = query_with(&s, 1, 1);
    for p in 0..2 {
        assert_eq!(s.acquire(ProcId(p)), RUN);
    }
    for _ in 0..3 {
        for p in 0..2 {
            assert_eq!(s.end_slice(ProcId(p), SLICE), RUN);
        }
    }
    assert_eq!(s.query_snapshot(global).unwrap().priority, P0);
    assert_eq!(s.query_snapshot(own).unwrap().priority, P0 / 8);
}

#[test]
fn a_predicted_start_sets_the_initial_priority_and_when_decay_begins() {
    // Three slots, one query each, global d_start 8: one starting at a tenth with no
    // hold (decays at once), one holding its start for 12 quanta, one asking for more
    // than its group allows (clamped to the range).
    let s = region(3, Policy::DecayingStride);
    let start = |p0, d_start| QueryOptions {
        start: Some(StartPolicy { p0, d_start }),
        ..QueryOptions::default()
    };
    let long = s.register_query(GroupId(0), start(P0 / 10, 0)).unwrap();
    let short = s.register_query(GroupId(0), start(P0, 12)).unwrap();
    let above = s.register_query(GroupId(0), start(P0 * 10, 0)).unwrap();
    for (p, q) in [long, short, above].into_iter().enumerate() {
        s.join(ProcId(p as u32), q).unwrap();
    }
    assert_eq!(s.query_snapshot(long).unwrap().priority, P0 / 10);
    assert_eq!(s.query_snapshot(above).unwrap().priority, P0);
    for p in 0..3 {
        assert_eq!(s.acquire(ProcId(p)), RUN);
    }
    for _ in 0..10 {
        for p in 0..3 {
            assert_eq!(s.end_slice(ProcId(p), SLICE), RUN);
        }
    }
    // 10 quanta: the long one decayed from its own start, the short one did not (its
    // group's d_start of 8 would have), the clamped one decayed from the group's p0
    assert!(s.query_snapshot(long).unwrap().priority < P0 / 10);
    assert_eq!(s.query_snapshot(short).unwrap().priority, P0);
    assert!(s.query_snapshot(above).unwrap().priority < P0);
    // a pinned query ignores a start
    let pinned = s
        .register_query(
            GroupId(0),
            QueryOptions {
                pinned_priority: Some(777),
                ..start(P0 / 10, 0)
            },
        )
        .unwrap();
    assert_eq!(s.query_snapshot(pinned).unwrap().priority, 777);
}

#[test]
fn fifo_never_preempts_for_a_later_arrival() {
    let s = region(1, Policy::Fifo);
    query_with(&s, 0, 0);
    query_with(&s, 1, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    for _ in 0..50 {
        assert_eq!(s.end_slice(ProcId(0), SLICE), RUN);
    }
    assert_eq!(s.release(ProcId(0), SLICE), Some(ProcId(1)));
}

#[test]
fn lowering_slots_pauses_holders_raising_dispatches() {
    let s = region(3, Policy::FairStride);
    for p in 0..4 {
        query_with(&s, 0, p);
    }
    for p in 0..3 {
        assert_eq!(s.acquire(ProcId(p)), RUN);
    }
    assert_eq!(s.acquire(ProcId(3)), WAIT);
    s.set_cpu_slots(1);
    // Over capacity: holders give up their slot at the slice end, without a hand-off.
    assert_eq!(s.end_slice(ProcId(0), SLICE), WAIT);
    assert_eq!(s.end_slice(ProcId(1), SLICE), WAIT);
    assert_eq!(s.running(), 1);
    // At capacity again: the last holder competes normally.
    let out = s.end_slice(ProcId(2), SLICE);
    assert_eq!(out.turn, Turn::Wait);
    assert_eq!(out.wake, Some(ProcId(3)));
    assert_eq!(s.running(), 1);
    s.set_cpu_slots(4);
    let mut woken = Vec::new();
    while let Some(w) = s.dispatch() {
        woken.push(w.0);
    }
    woken.sort();
    assert_eq!(woken, vec![0, 1, 2]);
    assert_eq!(s.running(), 4);
    assert!(s.nobody_waits());
}

#[test]
fn leaving_while_waiting_or_running() {
    let s = region(1, Policy::FairStride);
    let a = query_with(&s, 0, 0);
    let b = query_with(&s, 0, 1);
    let c = query_with(&s, 1, 2);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    // A waiter withdraws: nothing to wake, and it is no longer chosen.
    assert_eq!(s.leave(ProcId(1)), None);
    s.unregister_query(b).unwrap();
    // The holder dies: the reclaimer's leave passes its slot on.
    assert_eq!(s.leave(ProcId(0)), Some(ProcId(2)));
    assert_eq!(s.unregister_query(a), Ok(()));
    assert_eq!(s.unregister_query(c), Err(SchedError::QueryInUse));
    assert_eq!(s.leave(ProcId(2)), None);
    assert_eq!(s.running(), 0);
    assert!(s.nobody_waits());
}

#[test]
fn stopping_gives_back_the_slot_or_the_wait_and_keeps_the_query() {
    let s = region(1, Policy::FairStride);
    let a = query_with(&s, 0, 0);
    query_with(&s, 0, 1);
    query_with(&s, 1, 2);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    // A waiter stops: it is no longer chosen, and stays in its query.
    assert_eq!(s.stop(ProcId(1), 0), None);
    assert!(!s.is_running(ProcId(1)));
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    // The holder stops: its slot goes to the remaining waiter; stopping again, or an
    // idle process, changes nothing.
    assert_eq!(s.stop(ProcId(0), SLICE), Some(ProcId(2)));
    assert_eq!(s.stop(ProcId(0), SLICE), None);
    assert_eq!(s.running(), 1);
    assert_eq!(s.query_of(ProcId(0)), Some(a));
    // It takes a slot again in turn, as one that had released it.
    assert_eq!(s.acquire(ProcId(0)), WAIT);
    assert_eq!(s.release(ProcId(2), SLICE), Some(ProcId(0)));
    assert_eq!(s.release(ProcId(0), 0), None);
    assert_eq!(s.running(), 0);
    assert!(s.nobody_waits());
}

#[test]
fn members_of_one_query_take_turns() {
    let s = region(1, Policy::FairStride);
    let q = s
        .register_query(GroupId(0), QueryOptions::default())
        .unwrap();
    for p in 0..3 {
        s.join(ProcId(p), q).unwrap();
    }
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    let mut order = vec![0];
    let mut runner = ProcId(0);
    for _ in 0..6 {
        runner = s.end_slice(runner, SLICE).wake.unwrap();
        order.push(runner.0);
    }
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn tables_fill_up() {
    let s = region(1, Policy::FairStride);
    let q = s
        .register_query(GroupId(0), QueryOptions::default())
        .unwrap();
    let big = OwnedRegion::new(
        Capacity {
            max_procs: 100,
            max_queries: 1,
            max_groups: 1,
        },
        &SchedConfig::default(),
    )
    .unwrap();
    let bq = big
        .register_query(GroupId(0), QueryOptions::default())
        .unwrap();
    for p in 0..MAX_QUERY_MEMBERS as u32 {
        big.join(ProcId(p), bq).unwrap();
    }
    assert_eq!(big.join(ProcId(99), bq), Err(SchedError::QueryFull));
    assert_eq!(
        big.register_query(GroupId(0), QueryOptions::default()),
        Err(SchedError::NoFreeQueryEntry)
    );
    assert_eq!(s.query_of(ProcId(0)), None);
    s.join(ProcId(0), q).unwrap();
    assert_eq!(s.query_of(ProcId(0)), Some(q));
}

#[test]
fn worker_grants_follow_hint_and_cap() {
    let s = region(8, Policy::DecayingStride);
    s.configure_group(
        GroupId(1),
        GroupConfig {
            max_workers: 5,
            ..GroupConfig::default()
        },
    );
    assert_eq!(s.hint(), 8.0);
    for p in 0..6 {
        query_with(&s, 0, p);
        assert_eq!(s.acquire(ProcId(p)), RUN);
    }
    // Six statements, 2 free slots: 0.5·2 + 0.5·8 = 5, then 3.5, 2.75.
    assert_eq!(s.sample_hint(crate::hint::HINT_ALPHA, 6), 5.0);
    assert_eq!(s.sample_hint(crate::hint::HINT_ALPHA, 6), 3.5);
    assert_eq!(s.sample_hint(crate::hint::HINT_ALPHA, 6), 2.75);
    assert_eq!(s.reserve_workers(GroupId(1), 4, Demand::default()), 2);
    assert_eq!(s.reserve_workers(GroupId(1), 4, Demand::default()), 2);
    assert_eq!(s.reserve_workers(GroupId(1), 4, Demand::default()), 1); // the cap: 5
    assert_eq!(s.reserve_workers(GroupId(1), 4, Demand::default()), 0);
    s.return_workers(GroupId(1), 3);
    assert_eq!(s.workers_in_use(GroupId(1)), 2);
    assert_eq!(s.reserve_workers(GroupId(0), 100, Demand::default()), 2); // no cap on group 0
                                                                          // A leader that scans beside its workers keeps one of the 2 free slots for itself.
    let beside = Demand {
        leader_runs: true,
        ..Demand::default()
    };
    assert_eq!(s.reserve_workers(GroupId(0), 100, beside), 1);
    // Seven statements elsewhere want the 8 slots, more than the 6 held: one is free.
    let busy = Demand {
        elsewhere: 7,
        ..Demand::default()
    };
    assert_eq!(s.reserve_workers(GroupId(0), 100, busy), 1);
    // A statement predicted short gets none while slots are held.
    let short = Demand {
        predicted_short: true,
        ..Demand::default()
    };
    assert_eq!(s.reserve_workers(GroupId(0), 100, short), 0);
}

#[test]
fn a_statement_predicted_short_gets_workers_only_on_an_idle_server() {
    let s = region(4, Policy::DecayingStride);
    let short = |elsewhere| Demand {
        predicted_short: true,
        elsewhere,
        ..Demand::default()
    };
    assert_eq!(s.reserve_workers(GroupId(0), 2, short(0)), 2);
    assert_eq!(s.reserve_workers(GroupId(0), 2, short(1)), 0);
    s.return_workers(GroupId(0), 2);
    query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.reserve_workers(GroupId(0), 2, short(0)), 0);
    assert_eq!(
        s.reserve_workers(GroupId(0), 2, Demand::default()),
        2,
        "not predicted short: the free slots"
    );
}

/// Registers a query homed on node `home` in group 0 with processes `procs` joined.
fn homed_query(s: &SchedShared, home: u32, procs: &[u32]) -> QueryId {
    let q = s
        .register_query(
            GroupId(0),
            QueryOptions {
                home,
                ..QueryOptions::default()
            },
        )
        .unwrap();
    for &p in procs {
        s.join(ProcId(p), q).unwrap();
    }
    q
}

#[test]
fn split_slots_keep_a_query_on_its_home_node_until_it_may_steal() {
    let s = region(0, Policy::FairStride);
    s.set_node_slots(&[1, 1]);
    assert_eq!((s.node_count(), s.cpu_slots()), (2, 2));
    let q = homed_query(&s, 0, &[0, 1]);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.slot_node(ProcId(0)), Some(0));
    // Node 1 is free, but process 1 is homed on node 0: it waits.
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.dispatch(), None);
    assert_eq!(s.node_loads()[1].running, 0);
    // After waiting long enough it may steal: the next dispatch gives it node 1.
    s.allow_steal(ProcId(1));
    assert_eq!(s.dispatch(), Some(ProcId(1)));
    assert_eq!(s.slot_node(ProcId(1)), Some(1));
    assert_eq!(s.dispatch(), None);
    // A query homed on node 1 arrives: the stealer competes with it for node 1 at its
    // slice end, by pass, and loses to the lower pass.
    let home1 = homed_query(&s, 1, &[2]);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    assert_eq!(
        s.end_slice(ProcId(1), 10 * SLICE),
        Outcome {
            turn: Turn::Wait,
            wake: Some(ProcId(2)),
        }
    );
    assert_eq!(s.slot_node(ProcId(2)), Some(1));
    // Process 0 ends its slice on node 0: process 1 (still allowed to steal, and
    // at home there) takes the home slot; at home its right to steal ends.
    assert_eq!(
        s.end_slice(ProcId(0), 10 * SLICE),
        Outcome {
            turn: Turn::Wait,
            wake: Some(ProcId(1)),
        }
    );
    assert_eq!(s.slot_node(ProcId(1)), Some(0));
    assert_eq!(s.release(ProcId(1), 0), Some(ProcId(0)));
    assert_eq!(s.release(ProcId(2), 0), None);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.dispatch(), None, "a new wait starts at home");
    assert_eq!(s.query_snapshot(q).unwrap().home, 0);
    assert_eq!(s.query_snapshot(home1).unwrap().home, 1);
    assert_eq!(s.leave(ProcId(1)), None);
    assert_eq!(s.release(ProcId(0), 0), None);
    assert_eq!(s.running(), 0);
}

#[test]
fn a_query_whose_home_lost_its_slots_takes_another_nodes_without_stealing() {
    let s = region(0, Policy::FairStride);
    s.set_node_slots(&[1, 1]);
    let away = homed_query(&s, 1, &[0]);
    let other = homed_query(&s, 0, &[1]);
    assert_eq!(s.acquire(ProcId(1)), RUN);
    // The slots are lowered to one, on node 0, while node 1's query waits for one; it
    // is never allowed to steal (numa_steal_after = -1).
    s.set_node_slots(&[1, 0]);
    assert_eq!(s.acquire(ProcId(0)), WAIT);
    assert_eq!(
        s.end_slice(ProcId(1), 10 * SLICE),
        Outcome {
            turn: Turn::Wait,
            wake: Some(ProcId(0)),
        }
    );
    assert_eq!(s.slot_node(ProcId(0)), Some(0));
    assert_eq!(s.query_snapshot(away).unwrap().home, 1);
    assert_eq!(s.release(ProcId(0), 0), Some(ProcId(1)));
    assert_eq!(s.release(ProcId(1), 0), None);
    assert_eq!(s.query_snapshot(other).unwrap().home, 0);
    assert_eq!(s.running(), 0);
    // Its next run finds node 0's slot free: it takes it at once.
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.slot_node(ProcId(0)), Some(0));
    assert_eq!(s.release(ProcId(0), 0), None);
}

#[test]
fn homes_go_to_the_least_utilised_node_and_are_counted() {
    let s = region(0, Policy::DecayingStride);
    assert_eq!(s.choose_home(), 0, "slots not split: node 0");
    s.set_node_slots(&[2, 2]);
    let a = homed_query(&s, s.choose_home(), &[0]);
    assert_eq!(s.query_snapshot(a).unwrap().home, 0);
    // Equal utilisation: the node with fewer homed queries per slot.
    let b = homed_query(&s, s.choose_home(), &[1]);
    assert_eq!(s.query_snapshot(b).unwrap().home, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), RUN);
    let c = homed_query(&s, 0, &[2]);
    assert_eq!(s.acquire(ProcId(2)), RUN);
    for _ in 0..50 {
        s.sample_node_util();
    }
    let loads = s.node_loads();
    assert_eq!((loads[0].running, loads[0].homed), (2, 2));
    assert_eq!((loads[1].running, loads[1].homed), (1, 1));
    assert!(loads[0].util > 1.9 && loads[1].util < 1.1, "{loads:?}");
    assert_eq!(s.choose_home(), 1);
    for p in 0..3 {
        assert_eq!(s.leave(ProcId(p)), None);
    }
    for q in [a, b, c] {
        s.unregister_query(q).unwrap();
    }
    assert!(s
        .node_loads()
        .iter()
        .all(|l| l.homed == 0 && l.running == 0));
}

#[test]
fn fewer_nodes_send_holders_of_removed_nodes_home() {
    let s = region(0, Policy::FairStride);
    s.set_node_slots(&[1, 1]);
    homed_query(&s, 1, &[0]);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.slot_node(ProcId(0)), Some(1));
    // Back to one node: its home reads as node 0 now, and the slot of node 1 is given
    // up at the next slice end, for node 0's.
    s.set_node_slots(&[2]);
    assert_eq!(s.cpu_slots(), 2);
    assert_eq!(s.end_slice(ProcId(0), SLICE), WAIT);
    assert_eq!(s.running(), 0);
    assert_eq!(s.dispatch(), Some(ProcId(0)));
    assert_eq!(s.slot_node(ProcId(0)), Some(0));
    assert_eq!(s.release(ProcId(0), 0), None);
}

#[test]
fn a_waiter_at_home_takes_its_free_home_slot_while_others_wait_elsewhere() {
    let s = region(0, Policy::FairStride);
    s.set_node_slots(&[1, 1]);
    homed_query(&s, 0, &[0, 1]);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    // Somebody waits, so this is the queueing path, not the free-slot shortcut.
    homed_query(&s, 1, &[2]);
    assert_eq!(s.acquire(ProcId(2)), RUN);
    assert_eq!(s.slot_node(ProcId(2)), Some(1));
    // Its release finds nobody homed on node 1 and frees the slot.
    assert_eq!(s.release(ProcId(2), SLICE), None);
    assert_eq!(s.node_loads()[1].running, 0);
    assert!(!s.is_running(ProcId(1)));
}

/// Runs `p` (holding a slot, alone in the way) for `n` slices.
fn run_slices(s: &SchedShared, p: u32, n: u32) {
    for _ in 0..n {
        assert_eq!(s.end_slice(ProcId(p), SLICE).turn, Turn::Run);
    }
}

/// One slot: process 0's query ran 40 slices alone, then process 1's new query waits.
fn newcomer_behind_a_long_holder(policy: Policy) -> OwnedRegion {
    let s = region(1, policy);
    query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    run_slices(&s, 0, 40);
    query_with(&s, 0, 1);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    s
}

#[test]
fn a_new_query_asks_a_decayed_holder_to_yield_once() {
    let s = newcomer_behind_a_long_holder(Policy::DecayingStride);
    let long = s.query_of(ProcId(0)).unwrap();
    assert!(s.query_snapshot(long).unwrap().priority < P0);
    assert_eq!(s.ask_holder_to_yield(ProcId(1)), Some(ProcId(0)));
    assert_ne!(s.yield_flag(ProcId(0)).load(Relaxed), 0);
    // A second waiter finds nobody else to ask: one request per holder.
    query_with(&s, 0, 2);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    assert_eq!(s.ask_holder_to_yield(ProcId(2)), None);
    // The holder checks in early (a short slice) and loses its slot to a new query.
    assert_ne!(s.yield_flag(ProcId(0)).swap(0, Relaxed), 0);
    assert_eq!(s.yield_flag(ProcId(0)).swap(0, Relaxed), 0);
    let out = s.end_slice(ProcId(0), SLICE / 10);
    assert_eq!(out.turn, Turn::Wait);
    assert!(matches!(out.wake, Some(ProcId(1 | 2))));
}

#[test]
fn holders_of_equal_or_higher_priority_are_not_asked() {
    // Two new queries: equal priorities, the slice decides.
    let s = region(1, Policy::DecayingStride);
    query_with(&s, 0, 0);
    query_with(&s, 0, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), WAIT);
    assert_eq!(s.ask_holder_to_yield(ProcId(1)), None);
    // A decayed query waiting behind a new one asks nobody either.
    let s = region(1, Policy::DecayingStride);
    query_with(&s, 0, 0);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    run_slices(&s, 0, 40);
    assert_eq!(s.release(ProcId(0), 0), None);
    query_with(&s, 0, 1);
    assert_eq!(s.acquire(ProcId(1)), RUN);
    assert_eq!(s.acquire(ProcId(0)), WAIT);
    assert_eq!(s.ask_holder_to_yield(ProcId(0)), None);
    // Without decay nobody is ever asked.
    let s = newcomer_behind_a_long_holder(Policy::FairStride);
    assert_eq!(s.ask_holder_to_yield(ProcId(1)), None);
}

#[test]
fn the_lowest_priority_holder_is_asked_and_a_check_in_clears_the_request() {
    let s = region(2, Policy::DecayingStride);
    let long = query_with(&s, 0, 0);
    let mid = query_with(&s, 0, 1);
    assert_eq!(s.acquire(ProcId(0)), RUN);
    assert_eq!(s.acquire(ProcId(1)), RUN);
    run_slices(&s, 0, 60);
    run_slices(&s, 1, 20);
    let (pl, pm) = (
        s.query_snapshot(long).unwrap().priority,
        s.query_snapshot(mid).unwrap().priority,
    );
    assert!(pl < pm && pm < P0, "priorities {pl} {pm}");
    query_with(&s, 0, 2);
    assert_eq!(s.acquire(ProcId(2)), WAIT);
    assert_eq!(s.ask_holder_to_yield(ProcId(2)), Some(ProcId(0)));
    // The next waiter does not ask the same holder again.
    query_with(&s, 0, 3);
    assert_eq!(s.acquire(ProcId(3)), WAIT);
    assert_ne!(s.ask_holder_to_yield(ProcId(3)), Some(ProcId(0)));
    // A check-in answers the request even when the holder did not look at its flag.
    let _ = s.end_slice(ProcId(0), SLICE);
    assert_eq!(s.yield_flag(ProcId(0)).load(Relaxed), 0);
}
