//! Admission control: a bounded number of admitted statements, the rest waiting in
//! stride order (wagner2021 §2.3: a bounded set of active resource groups with a wait
//! queue in front; DESIGN.md §1 "admission").
//!
//! Two limits apply to each statement: the global `max_active` and its group's
//! `max_concurrency` (0 = none). When both have room a statement is admitted at once;
//! otherwise it waits. Whenever room appears, waiting statements are admitted greedily,
//! choosing between groups by stride scheduling over admissions: a group's pass grows by
//! `STRIDE_ONE / weight` with each statement it gets admitted, and a group that has been
//! idle rejoins at the virtual time, so it neither lost nor banked its share while away
//! (wagner2021 §2.1, global pass for arrivals). Of two groups with equal passes the
//! heavier one goes first: the comparison is on the pass a group *would* have after the
//! admission (Waldspurger's join at global pass plus one stride). Inside a group,
//! statements are admitted in arrival order, which is what per-query stride order gives
//! for statements that have not run yet (each arrives at the then global pass).
//!
//! The state is plain data: the caller keeps it in shared memory and serialises every
//! call with one lock (the extension's admission LWLock). Waiting processes are entries
//! of a caller-provided slice indexed by process number; the functions report which of
//! them were admitted so the caller can wake them.

use crate::shared::MAX_GROUPS;

/// Pass units per unit of weight: a group of weight `w` advances `STRIDE_ONE / w` per
/// admitted statement.
pub const STRIDE_ONE: u64 = 1 << 20;

/// Where a process stands with its current statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum WaitState {
    /// No statement waiting.
    #[default]
    Idle = 0,
    /// Waiting for admission.
    Queued = 1,
    /// Admitted while it waited; the process has not noticed yet.
    Admitted = 2,
}

/// The admission record of one process.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct Waiter {
    /// Group of the waiting statement.
    pub group: u32,
    pub state: WaitState,
    /// Arrival order; lower came first.
    pub ticket: u64,
}

/// Per-group admission state.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct GroupQueue {
    /// Admitted statements.
    pub active: u32,
    /// Waiting statements.
    pub waiting: u32,
    /// CPU weight of the group (≥ 1).
    pub weight: u32,
    /// Admitted statements allowed at once; 0 = no group limit.
    pub max_concurrency: u32,
    /// Stride pass over admissions.
    pub pass: u64,
}

impl GroupQueue {
    fn stride(&self) -> u64 {
        STRIDE_ONE / u64::from(self.weight.max(1))
    }

    fn has_room(&self) -> bool {
        self.max_concurrency == 0 || self.active < self.max_concurrency
    }
}

/// What happened to an arriving statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    Admitted,
    Queued,
}

/// The admission state of the whole server.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Admission {
    /// Admitted statements allowed at once (`pg_stride.max_active_queries`).
    pub max_active: u32,
    /// Admitted statements.
    pub active: u32,
    /// Waiting statements.
    pub waiting: u32,
    next_ticket: u64,
    /// Virtual time: the highest pass from which an admission was charged; idle groups
    /// rejoin here.
    virtual_time: u64,
    pub groups: [GroupQueue; MAX_GROUPS as usize],
}

impl Admission {
    pub fn new(max_active: u32) -> Admission {
        Admission {
            max_active,
            active: 0,
            waiting: 0,
            next_ticket: 0,
            virtual_time: 0,
            groups: [GroupQueue {
                weight: 100,
                ..GroupQueue::default()
            }; MAX_GROUPS as usize],
        }
    }

    /// Sets a group's weight and concurrency limit.
    pub fn configure_group(&mut self, g: usize, weight: u32, max_concurrency: u32) {
        let q = &mut self.groups[g];
        q.weight = weight.max(1);
        q.max_concurrency = max_concurrency;
    }

    /// The pass group `g` would have after one more admission.
    fn next_pass(&self, g: usize) -> u64 {
        let q = &self.groups[g];
        q.pass + q.stride()
    }

    /// Counts an admission of a statement of group `g` and charges the group's pass.
    fn admit(&mut self, g: usize) {
        let q = &mut self.groups[g];
        self.virtual_time = self.virtual_time.max(q.pass);
        q.pass += q.stride();
        q.active += 1;
        self.active += 1;
    }

    /// A statement of process `p` in group `g` arrives.
    pub fn arrive(&mut self, waiters: &mut [Waiter], p: usize, g: usize) -> Arrival {
        let q = &mut self.groups[g];
        if q.active == 0 && q.waiting == 0 {
            // An idle group rejoins at the virtual time: what it did not use while idle
            // is not owed to it later (wagner2021 §2.1).
            q.pass = q.pass.max(self.virtual_time);
        }
        if self.active < self.max_active && self.groups[g].has_room() {
            self.admit(g);
            waiters[p].state = WaitState::Idle;
            return Arrival::Admitted;
        }
        waiters[p] = Waiter {
            group: g as u32,
            state: WaitState::Queued,
            ticket: self.next_ticket,
        };
        self.next_ticket += 1;
        self.waiting += 1;
        self.groups[g].waiting += 1;
        Arrival::Queued
    }

    /// Process `p` stops waiting (timeout, cancel, exit). Returns `true` if it was still
    /// queued and is now gone from the queue; `false` if it had been admitted meanwhile,
    /// in which case it holds an admission the caller must [`finish`](Self::finish).
    pub fn withdraw(&mut self, waiters: &mut [Waiter], p: usize) -> bool {
        match waiters[p].state {
            WaitState::Queued => {
                let g = waiters[p].group as usize;
                self.waiting -= 1;
                self.groups[g].waiting -= 1;
                waiters[p].state = WaitState::Idle;
                true
            }
            WaitState::Admitted => {
                waiters[p].state = WaitState::Idle;
                false
            }
            WaitState::Idle => true,
        }
    }

    /// Whether process `p` has been admitted; clears the mark when it has.
    pub fn take_admitted(&mut self, waiters: &mut [Waiter], p: usize) -> bool {
        if waiters[p].state == WaitState::Admitted {
            waiters[p].state = WaitState::Idle;
            true
        } else {
            false
        }
    }

    /// An admitted statement of group `g` ends. Admits whoever can go now and calls
    /// `wake` for each of them.
    pub fn finish(&mut self, waiters: &mut [Waiter], g: usize, wake: impl FnMut(usize)) {
        let q = &mut self.groups[g];
        q.active = q.active.saturating_sub(1);
        self.active = self.active.saturating_sub(1);
        self.dispatch(waiters, wake);
    }

    /// Admits process `p` whatever the limits, if it is queued (the watchdog's way out
    /// of a wait-for cycle through admission, DESIGN.md §4 rule 5). Returns whether it did.
    pub fn force_admit(&mut self, waiters: &mut [Waiter], p: usize) -> bool {
        if waiters[p].state != WaitState::Queued {
            return false;
        }
        let g = waiters[p].group as usize;
        self.mark_admitted(waiters, p, g);
        true
    }

    fn mark_admitted(&mut self, waiters: &mut [Waiter], p: usize, g: usize) {
        self.waiting -= 1;
        self.groups[g].waiting -= 1;
        self.admit(g);
        waiters[p].state = WaitState::Admitted;
    }

    /// Admits waiting statements while there is room, lowest next pass first (ties to
    /// the lower group index), and calls `wake` for each. Call it after raising a limit.
    pub fn dispatch(&mut self, waiters: &mut [Waiter], mut wake: impl FnMut(usize)) {
        while self.waiting > 0 && self.active < self.max_active {
            let best = (0..self.groups.len())
                .filter(|&g| self.groups[g].waiting > 0 && self.groups[g].has_room())
                .min_by_key(|&g| (self.next_pass(g), g));
            let Some(g) = best else { break };
            let first = waiters
                .iter()
                .enumerate()
                .filter(|(_, w)| w.state == WaitState::Queued && w.group as usize == g)
                .min_by_key(|(_, w)| w.ticket)
                .map(|(p, _)| p);
            let Some(p) = first else {
                // The counts say someone waits in g but no entry does: repair the count
                // rather than spin (cannot happen while callers keep to the lock).
                self.waiting -= self.groups[g].waiting;
                self.groups[g].waiting = 0;
                continue;
            };
            self.mark_admitted(waiters, p, g);
            wake(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(max_active: u32, procs: usize) -> (Admission, Vec<Waiter>) {
        (Admission::new(max_active), vec![Waiter::default(); procs])
    }

    #[test]
    fn admits_up_to_the_global_limit_then_queues() {
        let (mut a, mut w) = setup(2, 4);
        assert_eq!(a.arrive(&mut w, 0, 0), Arrival::Admitted);
        assert_eq!(a.arrive(&mut w, 1, 0), Arrival::Admitted);
        assert_eq!(a.arrive(&mut w, 2, 0), Arrival::Queued);
        assert_eq!((a.active, a.waiting), (2, 1));
        let mut woken = vec![];
        a.finish(&mut w, 0, |p| woken.push(p));
        assert_eq!(woken, vec![2]);
        assert!(a.take_admitted(&mut w, 2));
        assert_eq!((a.active, a.waiting), (2, 0));
    }

    #[test]
    fn group_limit_holds_back_only_its_group() {
        let (mut a, mut w) = setup(10, 4);
        a.configure_group(1, 100, 1);
        assert_eq!(a.arrive(&mut w, 0, 1), Arrival::Admitted);
        assert_eq!(a.arrive(&mut w, 1, 1), Arrival::Queued);
        assert_eq!(a.arrive(&mut w, 2, 0), Arrival::Admitted);
        let mut woken = vec![];
        a.finish(&mut w, 0, |p| woken.push(p));
        assert!(woken.is_empty(), "group 1 is still at its limit");
        a.finish(&mut w, 1, |p| woken.push(p));
        assert_eq!(woken, vec![1]);
    }

    #[test]
    fn heavier_group_waiter_goes_first_though_it_came_later() {
        let (mut a, mut w) = setup(1, 4);
        a.configure_group(1, 100, 0);
        a.configure_group(2, 300, 0);
        assert_eq!(a.arrive(&mut w, 0, 0), Arrival::Admitted);
        assert_eq!(a.arrive(&mut w, 1, 1), Arrival::Queued); // light group, first
        assert_eq!(a.arrive(&mut w, 2, 2), Arrival::Queued); // heavy group, second
        let mut woken = vec![];
        a.finish(&mut w, 0, |p| woken.push(p));
        assert_eq!(woken, vec![2]);
    }

    #[test]
    fn same_group_waiters_go_in_arrival_order() {
        let (mut a, mut w) = setup(1, 5);
        a.arrive(&mut w, 0, 0);
        for p in [3, 1, 4, 2] {
            assert_eq!(a.arrive(&mut w, p, 0), Arrival::Queued);
        }
        let mut order = vec![];
        for _ in 0..4 {
            let mut woken = vec![];
            a.finish(&mut w, 0, |p| woken.push(p));
            assert_eq!(woken.len(), 1);
            order.push(woken[0]);
        }
        assert_eq!(order, vec![3, 1, 4, 2]);
    }

    /// Runs `rounds` admissions with one slot while every process always has a statement
    /// waiting; returns the admissions per group.
    fn closed_loop(
        a: &mut Admission,
        w: &mut [Waiter],
        group_of: &[usize],
        rounds: usize,
    ) -> Vec<u32> {
        let mut per_group = vec![0u32; MAX_GROUPS as usize];
        a.arrive(w, 0, group_of[0]);
        for (p, &g) in group_of.iter().enumerate().skip(1) {
            assert_eq!(a.arrive(w, p, g), Arrival::Queued);
        }
        let mut current = 0;
        for _ in 0..rounds {
            let mut woken = vec![];
            a.finish(w, group_of[current], |p| woken.push(p));
            assert_eq!(woken.len(), 1);
            let p = woken[0];
            assert!(a.take_admitted(w, p));
            per_group[group_of[p]] += 1;
            // The finished process sends its next statement, which has to wait; process
            // 0 only holds the slot at the start.
            if current != 0 {
                assert_eq!(a.arrive(w, current, group_of[current]), Arrival::Queued);
            }
            current = p;
        }
        per_group
    }

    #[test]
    fn admissions_follow_the_weights_under_contention() {
        let (mut a, mut w) = setup(1, 7);
        a.configure_group(1, 300, 0);
        a.configure_group(2, 100, 0);
        let group_of = [0, 1, 1, 1, 2, 2, 2];
        let per_group = closed_loop(&mut a, &mut w, &group_of, 4000);
        let ratio = f64::from(per_group[1]) / f64::from(per_group[2]);
        assert!((ratio - 3.0).abs() < 0.05, "ratio {ratio}");
    }

    #[test]
    fn an_idle_group_rejoins_at_the_virtual_time() {
        // Group 1 runs alone for a long time, then group 2 arrives. Group 2 must neither
        // get a burst of admissions to catch up nor wait behind group 1's history: with
        // equal weights the two alternate from the start.
        let (mut a, mut w) = setup(1, 5);
        for _ in 0..1000 {
            assert_eq!(a.arrive(&mut w, 1, 1), Arrival::Admitted);
            a.finish(&mut w, 1, |_| {});
        }
        let group_of = [0, 1, 1, 2, 2];
        let mut w2 = vec![Waiter::default(); group_of.len()];
        let per_group = closed_loop(&mut a, &mut w2, &group_of, 10);
        assert_eq!((per_group[1], per_group[2]), (5, 5));
    }

    #[test]
    fn withdraw_removes_a_waiter_or_reports_its_admission() {
        let (mut a, mut w) = setup(1, 3);
        a.arrive(&mut w, 0, 0);
        a.arrive(&mut w, 1, 0);
        a.arrive(&mut w, 2, 0);
        assert!(a.withdraw(&mut w, 1));
        assert_eq!(a.waiting, 1);
        a.finish(&mut w, 0, |_| {});
        // Process 2 was admitted before it noticed; withdrawing tells the caller.
        assert!(!a.withdraw(&mut w, 2));
        assert_eq!(a.active, 1);
        a.finish(&mut w, 0, |_| {});
        assert_eq!((a.active, a.waiting), (0, 0));
    }

    #[test]
    fn force_admit_ignores_the_limits() {
        let (mut a, mut w) = setup(1, 2);
        a.arrive(&mut w, 0, 0);
        a.arrive(&mut w, 1, 0);
        assert!(a.force_admit(&mut w, 1));
        assert_eq!((a.active, a.waiting), (2, 0));
        assert!(!a.force_admit(&mut w, 1));
        a.finish(&mut w, 0, |_| {});
        a.finish(&mut w, 0, |_| {});
        assert_eq!(a.active, 0);
    }

    #[test]
    fn raising_the_limit_and_dispatching_admits_waiters() {
        let (mut a, mut w) = setup(1, 3);
        a.arrive(&mut w, 0, 0);
        a.arrive(&mut w, 1, 0);
        a.arrive(&mut w, 2, 0);
        a.max_active = 3;
        let mut woken = vec![];
        a.dispatch(&mut w, |p| woken.push(p));
        assert_eq!(woken, vec![1, 2]);
    }
}
