//! Admission under real concurrency: threads stand in for backends, a `Mutex` for the
//! admission LWLock, and each thread uses the lock-free fast path first, as the
//! extension does. Checks that the limits are never exceeded (an independent count of
//! statements "inside" is compared with them) and that no wake-up is lost. The threads
//! go in rounds, each sending one statement per round, so a waiter queued late in a
//! round can only be let in by statements that end: a wake-up lost between a leaving
//! statement and an arriving one leaves it queued, and the test fails after seconds.

use pg_stride_sched::admission::{Arrival, Counts, Queue, Waiter};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const GROUPS: usize = 3;
const MAX_ACTIVE: u32 = 3;
/// Group 1 has a limit of its own; groups 0 and 2 only the global one.
const GROUP1_LIMIT: u32 = 2;
const ROUNDS: usize = 10_000;
/// A waiter still queued after this long was forgotten.
const LOST: Duration = Duration::from_secs(10);

struct Server {
    counts: Counts,
    queue: Mutex<(Queue, Vec<Waiter>)>,
    inside: AtomicU32,
    inside_group: [AtomicU32; GROUPS],
}

impl Server {
    fn admit(&self, p: usize, g: usize) {
        if self.counts.try_enter(g) {
            return;
        }
        let arrival = {
            let mut guard = self.queue.lock().unwrap();
            let (queue, waiters) = &mut *guard;
            queue.arrive(&self.counts, waiters, p, g, |_| {})
        };
        if arrival == Arrival::Admitted {
            return;
        }
        let since = Instant::now();
        loop {
            {
                let mut guard = self.queue.lock().unwrap();
                let (queue, waiters) = &mut *guard;
                if queue.take_admitted(waiters, p) {
                    return;
                }
            }
            assert!(
                since.elapsed() < LOST,
                "process {p} of group {g} was never admitted: a lost wake-up"
            );
            std::thread::yield_now();
        }
    }

    fn release(&self, g: usize) {
        if self.counts.leave(g) {
            let mut guard = self.queue.lock().unwrap();
            let (queue, waiters) = &mut *guard;
            queue.dispatch(&self.counts, waiters, |_| {});
        }
    }
}

#[test]
fn limits_hold_and_no_waiter_is_forgotten() {
    let server = Arc::new(Server {
        counts: Counts::new(MAX_ACTIVE),
        queue: Mutex::new((Queue::default(), vec![Waiter::default(); THREADS])),
        inside: AtomicU32::new(0),
        inside_group: Default::default(),
    });
    {
        let mut guard = server.queue.lock().unwrap();
        guard
            .0
            .configure_group(&server.counts, 1, 100, GROUP1_LIMIT);
        guard.0.configure_group(&server.counts, 2, 300, 0);
    }
    let round = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|p| {
            let s = Arc::clone(&server);
            let round = Arc::clone(&round);
            std::thread::spawn(move || {
                let g = p % GROUPS;
                for i in 0..ROUNDS {
                    round.wait();
                    s.admit(p, g);
                    let inside = s.inside.fetch_add(1, SeqCst) + 1;
                    assert!(inside <= MAX_ACTIVE, "{inside} statements admitted");
                    let in_group = s.inside_group[g].fetch_add(1, SeqCst) + 1;
                    if g == 1 {
                        assert!(in_group <= GROUP1_LIMIT, "{in_group} in group 1");
                    }
                    if (i + p) % 3 == 0 {
                        std::thread::yield_now();
                    }
                    s.inside_group[g].fetch_sub(1, SeqCst);
                    s.inside.fetch_sub(1, SeqCst);
                    s.release(g);
                }
            })
        })
        .collect();
    // A thread that fails leaves the others waiting at the barrier: watch them from here.
    let deadline = Instant::now() + LOST * 3;
    while !threads.iter().all(|t| t.is_finished()) {
        assert!(Instant::now() < deadline, "the threads did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    for t in threads {
        t.join().expect("a thread failed");
    }
    assert_eq!((server.counts.active(), server.counts.waiting()), (0, 0));
    for g in 0..GROUPS {
        assert_eq!(server.counts.group_active(g), 0, "group {g}");
    }
}
