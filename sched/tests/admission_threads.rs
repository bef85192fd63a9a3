//! Admission under real concurrency: threads stand in for backends, a `Mutex` for the
//! admission LWLock, and each thread uses the lock-free fast path first, as the
//! extension does. Checks that the limits are never exceeded (an independent count of
//! statements "inside" is compared with them) and that no wake-up is lost. The threads
//! go in rounds, each sending one statement per round, so a waiter queued late in a
//! round can only be let in by statements that end: a wake-up lost between a leaving
//! statement and an arriving one leaves it queued, and the test fails after seconds.

use pg_stride_sched::admission::{Arrival, Counts, Lease, Queue, Reclaim, Waiter};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
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
    leases: Vec<Lease>,
    /// Whether each thread is between the start of an admission and the end of its
    /// release: a waiter still queued when no other thread is can never be let in.
    busy: Vec<AtomicBool>,
    inside: AtomicU32,
    inside_group: [AtomicU32; GROUPS],
}

/// Threads whose number is a multiple of this do not keep leases.
const NO_LEASE_EVERY: usize = 4;

fn uses_lease(p: usize) -> bool {
    !p.is_multiple_of(NO_LEASE_EVERY)
}

impl Server {
    /// Admits a statement of thread `p` in group `g`; returns whether it runs on the
    /// thread's lease.
    fn admit(&self, p: usize, g: usize) -> bool {
        self.busy[p].store(true, SeqCst);
        let lease = &self.leases[p];
        if uses_lease(p) {
            if lease.resume(g) {
                return true;
            }
            if lease.surrender(&self.counts) {
                self.dispatch();
            }
        }
        self.wait_for_admission(p, g);
        if uses_lease(p) {
            lease.hold(g);
        }
        uses_lease(p)
    }

    fn wait_for_admission(&self, p: usize, g: usize) {
        if self.counts.try_enter(g) {
            return;
        }
        let arrival = {
            let mut guard = self.queue.lock().unwrap();
            let (queue, waiters) = &mut *guard;
            queue.arrive(&self.counts, waiters, &self.leases, p, g, 0, |_| {})
        };
        if arrival == Arrival::Admitted {
            return;
        }
        let since = Instant::now();
        loop {
            if self.take_admitted(p) {
                return;
            }
            let others_idle = self
                .busy
                .iter()
                .enumerate()
                .all(|(q, busy)| q == p || !busy.load(SeqCst));
            if others_idle {
                // Admitted just before the others went idle, or forgotten.
                assert!(
                    self.take_admitted(p),
                    "process {p} of group {g} is queued while no other process runs or ends a statement"
                );
                return;
            }
            assert!(
                since.elapsed() < LOST,
                "process {p} of group {g} was never admitted: a lost wake-up"
            );
            std::thread::yield_now();
        }
    }

    fn take_admitted(&self, p: usize) -> bool {
        let mut guard = self.queue.lock().unwrap();
        let (queue, waiters) = &mut *guard;
        queue.take_admitted(waiters, p)
    }

    fn release(&self, p: usize, g: usize, leased: bool) {
        let waits = if leased {
            self.leases[p].finish(&self.counts)
        } else {
            self.counts.leave(g)
        };
        if waits {
            self.dispatch();
        }
        self.busy[p].store(false, SeqCst);
    }

    /// Thread `p`'s statement runs again after its admission was lent: it counts again
    /// before it goes on, at once or through the queue, as at a yield point.
    fn take_back(&self, p: usize) {
        let lease = &self.leases[p];
        let Some(g) = lease.lent_group() else { return };
        match lease.reclaim(&self.counts) {
            Reclaim::NoRoom => {}
            r => {
                if r.must_dispatch() {
                    self.dispatch();
                }
                return;
            }
        }
        self.wait_for_admission(p, g);
        if lease.returned(&self.counts) {
            self.dispatch();
        }
    }

    fn dispatch(&self) {
        let mut guard = self.queue.lock().unwrap();
        let (queue, waiters) = &mut *guard;
        queue.dispatch(&self.counts, waiters, |_| {});
    }
}

#[test]
fn limits_hold_and_no_waiter_is_forgotten() {
    let server = Arc::new(Server {
        counts: Counts::new(MAX_ACTIVE),
        queue: Mutex::new((Queue::default(), vec![Waiter::default(); THREADS])),
        leases: (0..THREADS).map(|_| Lease::default()).collect(),
        busy: (0..THREADS).map(|_| AtomicBool::new(false)).collect(),
        inside: AtomicU32::new(0),
        inside_group: Default::default(),
    });
    {
        let mut guard = server.queue.lock().unwrap();
        guard
            .0
            .configure_group(&server.counts, 1, 100, GROUP1_LIMIT, 0);
        guard.0.configure_group(&server.counts, 2, 300, 0, 0);
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
                    let leased = s.admit(p, g);
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
                    s.release(p, g, leased);
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
    // What is left are idle leases; given back, they leave nothing behind.
    for lease in &server.leases {
        assert!(!lease.surrender(&server.counts));
    }
    assert_eq!((server.counts.active(), server.counts.waiting()), (0, 0));
    assert_eq!(
        server.counts.underflows(),
        0,
        "an admission was given back twice"
    );
    for g in 0..GROUPS {
        assert_eq!(server.counts.group_active(g), 0, "group {g}");
    }
}

/// Two processes that keep leases, one admission between them, statements back to
/// back: every statement of one overlaps the other's arrival or end, which is where an
/// idle lease and a new waiter can miss each other.
#[test]
fn leases_and_waiters_do_not_miss_each_other() {
    const PROCS: usize = 2;
    const STATEMENTS: usize = 200_000;
    let server = Arc::new(Server {
        counts: Counts::new(1),
        queue: Mutex::new((Queue::default(), vec![Waiter::default(); PROCS + 1])),
        leases: (0..=PROCS).map(|_| Lease::default()).collect(),
        busy: (0..=PROCS).map(|_| AtomicBool::new(false)).collect(),
        inside: AtomicU32::new(0),
        inside_group: Default::default(),
    });
    // Threads 1 and 2: both keep leases (see `uses_lease`).
    let start = Arc::new(Barrier::new(PROCS));
    let threads: Vec<_> = (1..=PROCS)
        .map(|p| {
            let s = Arc::clone(&server);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..STATEMENTS {
                    let leased = s.admit(p, 0);
                    assert_eq!(s.inside.fetch_add(1, SeqCst), 0, "two statements admitted");
                    for _ in 0..20 {
                        std::hint::spin_loop();
                    }
                    s.inside.fetch_sub(1, SeqCst);
                    s.release(p, 0, leased);
                    for _ in 0..20 {
                        std::hint::spin_loop();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread failed");
    }
}

/// A watchdog thread lends and reclaims, without pause, the admissions of statements
/// while they run and end, as the scheduler worker does for statements that wait for
/// their clients, and the statements take lent admissions back themselves, through the
/// queue when there is no room: whatever the interleaving, nothing is counted twice or
/// lost, no waiter is forgotten, and the limit is never crossed (docs/design.md §4
/// rule 12).
#[test]
fn lending_admissions_races_with_statements_ending() {
    const PROCS: usize = 4;
    const STATEMENTS: usize = 20_000;
    let server = Arc::new(Server {
        counts: Counts::new(2),
        queue: Mutex::new((Queue::default(), vec![Waiter::default(); PROCS])),
        leases: (0..PROCS).map(|_| Lease::default()).collect(),
        busy: (0..PROCS).map(|_| AtomicBool::new(false)).collect(),
        inside: AtomicU32::new(0),
        inside_group: Default::default(),
    });
    let done = Arc::new(AtomicBool::new(false));
    let lent_total = Arc::new(AtomicU32::new(0));
    let watchdog = {
        let (s, done, lent_total) = (
            Arc::clone(&server),
            Arc::clone(&done),
            Arc::clone(&lent_total),
        );
        std::thread::spawn(move || {
            // Lends every lease in turn, then reclaims every lease in turn, so that
            // each thread's lease is both lent and reclaimed.
            let mut i = 0usize;
            while !done.load(SeqCst) {
                i += 1;
                let lease = &s.leases[i % PROCS];
                if (i / PROCS).is_multiple_of(2) {
                    if let Some(waits) = lease.lend(&s.counts) {
                        lent_total.fetch_add(1, SeqCst);
                        if waits {
                            s.dispatch();
                        }
                    }
                } else if lease.reclaim(&s.counts).must_dispatch() {
                    s.dispatch();
                }
                let active = s.counts.active();
                assert!(active <= 2, "{active} admitted against a limit of 2");
            }
        })
    };
    // Threads 1..=3 keep leases (see `uses_lease`); thread 0 does not. On a loaded
    // machine the watchdog may be scheduled rarely: the statements go on past
    // STATEMENTS until it has lent MIN_LENT times, within a bound.
    const MIN_LENT: u32 = 100;
    let threads: Vec<_> = (0..PROCS)
        .map(|p| {
            let s = Arc::clone(&server);
            let lent_total = Arc::clone(&lent_total);
            std::thread::spawn(move || {
                let enough = |i: usize| {
                    i >= 50 * STATEMENTS || (i >= STATEMENTS && lent_total.load(SeqCst) >= MIN_LENT)
                };
                for i in (0..).take_while(|&i| !enough(i)) {
                    let leased = s.admit(p, 0);
                    if i % 7 == 0 {
                        std::thread::yield_now();
                    }
                    if leased && i % 3 == 0 {
                        s.take_back(p);
                    }
                    s.release(p, 0, leased);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread failed");
    }
    done.store(true, SeqCst);
    watchdog.join().unwrap();
    assert!(
        lent_total.load(SeqCst) >= MIN_LENT,
        "the watchdog lent fewer than {MIN_LENT} admissions: the test tested too little"
    );
    for lease in &server.leases {
        assert!(
            !lease.is_lent(),
            "a statement ended with its admission lent"
        );
        lease.surrender(&server.counts);
    }
    assert_eq!((server.counts.active(), server.counts.waiting()), (0, 0));
    assert_eq!(
        server.counts.underflows(),
        0,
        "an admission was given back twice"
    );
}
