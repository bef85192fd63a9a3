//! Many threads hammer one region the way backends would: register or join a query,
//! take a slot, end slices, pause and resume, withdraw, release, leave. Waiting follows
//! PostgreSQL's latch protocol — a paused thread only wakes when someone sets its latch
//! with a process returned by the scheduler — so a grant without a wake-up, a lost slot
//! or a starved waiter shows up as a wait that never ends, and a double grant as more
//! threads inside their slice than there are slots.
//!
//! The protocol code yields at random at its [`chaos`](super::chaos) points in this test
//! build, so that interleavings which would need an unlucky preemption happen often.
//!
//! With the slots split by node, each query has a home node, a waiter that has spun a
//! while is allowed to steal (and dispatches, as the extension's waiter does), and a
//! thread standing in for the scheduler worker dispatches every 200 µs; every node's
//! holders must stay within its slots.
//!
//! The threads meet at a barrier every few statements. A slot lost in a race would
//! otherwise be picked up again by the next thread that queues; at the barrier nobody
//! else queues, so a waiter stranded beside a free slot waits for ever and fails the
//! test.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::*;

const THREADS: u32 = 8;
const GROUPS: u32 = 3;
/// Longest any wait may take before the test calls it lost.
const DEADLINE: Duration = Duration::from_secs(60);

struct World<'a> {
    sched: &'a SchedShared,
    /// Stands in for the extension's registration LWLock.
    registration: Mutex<()>,
    latches: Vec<AtomicBool>,
    /// Threads that are inside a slice: must never exceed the slot count.
    holders: AtomicU32,
    max_slots: u32,
    /// Threads inside a slice by node of the slot, and each node's slots (when split).
    node_holders: Vec<AtomicU32>,
    node_slots: Vec<u32>,
    ops: AtomicU64,
    waits: AtomicU64,
    stop: AtomicBool,
    barrier: Barrier,
}

/// A spinning barrier whose last arrival decides for everyone whether to stop, and which
/// gives up (and fails the test) after the deadline instead of hanging.
struct Barrier {
    arrived: AtomicU32,
    generation: AtomicU32,
    done: AtomicBool,
}

impl Barrier {
    fn new() -> Self {
        Barrier {
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            done: AtomicBool::new(false),
        }
    }

    /// Returns the decision of the last thread to arrive.
    fn wait(&self, stop: &AtomicBool, decide: impl FnOnce() -> bool) -> bool {
        let generation = self.generation.load(SeqCst);
        if self.arrived.fetch_add(1, SeqCst) + 1 == THREADS {
            self.done.store(decide(), SeqCst);
            self.arrived.store(0, SeqCst);
            self.generation.fetch_add(1, SeqCst);
        } else {
            let start = Instant::now();
            while self.generation.load(SeqCst) == generation {
                std::thread::yield_now();
                assert!(!stop.load(SeqCst), "another thread failed");
                assert!(
                    start.elapsed() < DEADLINE,
                    "barrier: a thread never arrived (stranded waiter?)"
                );
            }
        }
        self.done.load(SeqCst)
    }
}

impl World<'_> {
    fn wake(&self, w: Option<ProcId>) {
        if let Some(w) = w {
            self.latches[w.index()].store(true, SeqCst);
        }
    }

    /// PostgreSQL's latch loop: check the condition, sleep until the latch is set, reset.
    fn wait_for_slot(&self, p: ProcId) {
        self.waits.fetch_add(1, Relaxed);
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.sched.is_running(p) {
            while !self.latches[p.index()].swap(false, SeqCst) {
                spins += 1;
                if !self.node_slots.is_empty() && spins.is_multiple_of(4096) {
                    // Waited "k slices" at home: may take another node's slot.
                    self.sched.allow_steal(p);
                    while let Some(w) = self.sched.dispatch() {
                        self.wake(Some(w));
                    }
                }
                if spins.is_multiple_of(64) {
                    std::thread::yield_now();
                    assert!(!self.stop.load(SeqCst), "another thread failed");
                    assert!(
                        start.elapsed() < DEADLINE,
                        "{p:?} waited {DEADLINE:?}: lost slot or missing wake-up (running {}, slots {})",
                        self.sched.running(),
                        self.sched.cpu_slots()
                    );
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    fn enter_slice(&self, p: ProcId) {
        let inside = self.holders.fetch_add(1, SeqCst) + 1;
        assert!(
            inside <= self.max_slots,
            "{inside} holders with at most {} slots",
            self.max_slots
        );
        assert!(self.sched.running() <= self.max_slots);
        if !self.node_slots.is_empty() {
            let n = self.sched.slot_node(p).expect("a holder has a node") as usize;
            let on_node = self.node_holders[n].fetch_add(1, SeqCst) + 1;
            assert!(
                on_node <= self.node_slots[n],
                "{on_node} holders on node {n} with {} slots",
                self.node_slots[n]
            );
        }
        // A little work inside the slice, so that slices of different threads overlap.
        for _ in 0..50 {
            std::hint::spin_loop();
        }
    }

    fn leave_slice(&self, p: ProcId) {
        self.holders.fetch_sub(1, SeqCst);
        if !self.node_slots.is_empty() {
            let n = self.sched.slot_node(p).expect("a holder has a node") as usize;
            self.node_holders[n].fetch_sub(1, SeqCst);
        }
    }

    fn op(&self) -> u64 {
        self.ops.fetch_add(1, Relaxed) + 1
    }
}

/// xorshift64*, one per thread.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n
    }
}

/// One thread: rounds of statements until `ops_target` operations have been done by all
/// threads.
fn backend(world: &World, me: u32, shared_queries: &[QueryId], ops_target: u64) {
    let mut rng = Rng(0x9E37_79B9 ^ ((me as u64 + 1) << 20));
    loop {
        for _ in 0..1 + rng.below(8) {
            statement(world, ProcId(me), shared_queries, &mut rng);
        }
        if world
            .barrier
            .wait(&world.stop, || world.ops.load(SeqCst) >= ops_target)
        {
            return;
        }
    }
}

/// One statement of process `p`.
fn statement(world: &World, p: ProcId, shared_queries: &[QueryId], rng: &mut Rng) {
    let s = world.sched;
    {
        // Half the statements register their own query; the others join a long-lived
        // one, as parallel workers join their leader's.
        let own = rng.below(2) == 0;
        let q = if own {
            let _lock = world.registration.lock().unwrap();
            let options = QueryOptions {
                pinned_priority: (rng.below(4) == 0).then(|| 1 + rng.below(20_000) as u32),
                home: rng.below(world.node_slots.len().max(1) as u64) as u32,
                start: None,
            };
            s.register_query(GroupId(rng.below(GROUPS as u64) as u32), options)
                .unwrap()
        } else {
            shared_queries[rng.below(shared_queries.len() as u64) as usize]
        };
        s.join(p, q).unwrap();

        let out = s.acquire(p);
        world.op();
        world.wake(out.wake);
        if out.turn == Turn::Wait {
            world.wait_for_slot(p);
        }
        world.enter_slice(p);

        let mut withdrew = false;
        for _ in 0..1 + rng.below(30) {
            world.leave_slice(p);
            let out = s.end_slice(p, rng.below(4_000_000));
            world.op();
            world.wake(out.wake);
            if out.turn == Turn::Wait {
                if rng.below(50) == 0 {
                    // Cancelled while paused: leave without waiting for the slot.
                    world.wake(s.leave(p));
                    withdrew = true;
                    break;
                }
                world.wait_for_slot(p);
            }
            world.enter_slice(p);
        }
        if !withdrew {
            world.leave_slice(p);
            world.wake(s.release(p, rng.below(1_000_000)));
            world.op();
            world.wake(s.leave(p));
        }
        if own {
            let _lock = world.registration.lock().unwrap();
            s.unregister_query(q).unwrap();
        }
    }
}

/// `split`: the slots of each node (empty: not split; `slots` then applies).
fn run(slots: u32, ops_target: u64, change_slots: bool, split: &[u32]) -> (u64, u64) {
    let cap = Capacity {
        max_procs: THREADS,
        max_queries: 2 * THREADS + 4,
        max_groups: GROUPS,
    };
    let region = OwnedRegion::new(
        cap,
        &SchedConfig {
            cpu_slots: slots,
            ..Default::default()
        },
    )
    .unwrap();
    let s: &SchedShared = &region;
    if !split.is_empty() {
        s.set_node_slots(split);
    }
    s.set_decay(DecayParams {
        lambda: 0.8,
        d_start: 2,
        quantum_ns: 2_000_000,
    });
    for (g, weight) in [(0, 100), (1, 300), (2, 50)] {
        s.configure_group(
            GroupId(g),
            GroupConfig {
                weight,
                ..GroupConfig::default()
            },
        );
    }
    let shared_queries: Vec<QueryId> = (0..3)
        .map(|g| {
            let home = g % split.len().max(1) as u32;
            s.register_query(
                GroupId(g),
                QueryOptions {
                    home,
                    ..QueryOptions::default()
                },
            )
            .unwrap()
        })
        .collect();
    let world = World {
        sched: s,
        registration: Mutex::new(()),
        latches: (0..THREADS).map(|_| AtomicBool::new(false)).collect(),
        holders: AtomicU32::new(0),
        max_slots: if change_slots {
            4
        } else if split.is_empty() {
            slots
        } else {
            split.iter().sum()
        },
        node_holders: split.iter().map(|_| AtomicU32::new(0)).collect(),
        node_slots: split.to_vec(),
        ops: AtomicU64::new(0),
        waits: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        barrier: Barrier::new(),
    };
    std::thread::scope(|scope| {
        let backends: Vec<_> = (0..THREADS)
            .map(|t| {
                let (world, shared_queries) = (&world, &shared_queries);
                scope.spawn(move || {
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        backend(world, t, shared_queries, ops_target)
                    }));
                    if let Err(panic) = result {
                        world.stop.store(true, SeqCst);
                        std::panic::resume_unwind(panic);
                    }
                })
            })
            .collect();
        if change_slots {
            // A GUC reload every so often: lower or raise the slot count, then dispatch.
            let mut n = 0u32;
            while !backends.iter().all(|b| b.is_finished()) {
                n += 1;
                s.set_cpu_slots(1 + n % 4);
                while let Some(w) = s.dispatch() {
                    world.wake(Some(w));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        } else if !split.is_empty() {
            // The scheduler worker's round.
            while !backends.iter().all(|b| b.is_finished()) {
                while let Some(w) = s.dispatch() {
                    world.wake(Some(w));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for b in backends {
            if let Err(panic) = b.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });

    // Everything returned: no slot held, nobody waiting, accounting back to zero.
    assert_eq!(s.running(), 0);
    assert!(s.nobody_waits());
    for t in 0..THREADS {
        let snap = s.proc_snapshot(ProcId(t));
        assert!(
            !snap.running && !snap.waiting && snap.query.is_none(),
            "{t}: {snap:?}"
        );
    }
    for q in shared_queries {
        assert_eq!(s.query_snapshot(q).unwrap().members, 0);
        s.unregister_query(q).unwrap();
    }
    for q in 0..cap.max_queries {
        assert_eq!(
            s.query_snapshot(QueryId(q)),
            None,
            "query {q} left registered"
        );
    }
    (world.ops.load(SeqCst), world.waits.load(SeqCst))
}

/// Debug builds are ~10x slower; the operation count stays at 10^6 either way.
const MILLION: u64 = 1_000_000;

#[test]
fn eight_threads_a_million_operations() {
    let (ops, waits) = run(1, MILLION, false, &[]);
    assert!(ops >= MILLION);
    // The test is only meaningful if processes really queued and were handed slots.
    assert!(waits > ops / 100, "only {waits} waits in {ops} operations");
}

#[test]
fn slot_count_changes_under_load() {
    let (ops, waits) = run(2, MILLION / 5, true, &[]);
    assert!(ops >= MILLION / 5);
    assert!(waits > 0);
}

#[test]
fn slots_split_by_node_with_stealing() {
    let (ops, waits) = run(0, MILLION / 2, false, &[1, 2, 1]);
    assert!(ops >= MILLION / 2);
    assert!(waits > ops / 100, "only {waits} waits in {ops} operations");
}
