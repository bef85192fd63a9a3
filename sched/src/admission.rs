//! Admission control: a bounded number of admitted statements, the rest waiting in
//! stride order (wagner2021 §2.3: a bounded set of active resource groups with a wait
//! queue in front; docs/design.md §1 "admission").
//!
//! Two limits apply to each statement: the global `max_active` and its group's
//! `max_concurrency` (0 = none). When both have room a statement is admitted at once;
//! otherwise it waits. Whenever room appears, waiting statements are admitted greedily,
//! choosing between groups by stride scheduling over admissions: a group's pass grows by
//! `STRIDE_ONE / weight` with each statement admitted from the queue, and a group that had
//! no statement waiting (whether or not some ran) rejoins at the virtual time, so it
//! neither lost nor banked its share while away (wagner2021 §2.1, global pass for
//! arrivals). Of two groups with equal passes the
//! heavier one goes first: the comparison is on the pass a group *would* have after the
//! admission (Waldspurger's join at global pass plus one stride). Inside a group,
//! statements are admitted in arrival order, which is what per-query stride order gives
//! for statements that have not run yet (each arrives at the then global pass).
//!
//! The state is split in two:
//!
//! * [`Counts`]: admitted statements (global and per group), the limits, and the number
//!   of waiting statements, all atomics. An uncontended statement — nobody waits and both
//!   limits have room — is admitted and released with a few atomic operations and no lock
//!   ([`Counts::try_enter`], [`Counts::leave`]): that is every statement of a server that
//!   is not at its limits, so admission costs it next to nothing (docs/design.md §3).
//! * [`Queue`]: the waiting statements, arrival tickets and stride passes. The caller
//!   keeps it in shared memory and serialises every call with one lock (the extension's
//!   admission LWLock). Waiting processes are entries of a caller-provided slice indexed
//!   by process number; the functions report which of them were admitted so the caller
//!   can wake them.
//!
//! No wake-up is lost between the two: a waiter is counted in `waiting` *before* the
//! queue tries to admit it, and a leaving statement lowers `active` *before* it reads
//! `waiting` (all sequentially consistent). So either the leaver sees the waiter and
//! dispatches under the lock, or the waiter's own dispatch sees the room the leaver made.
//! Admissions on the fast path do not advance the groups' passes: the passes order the
//! contended admissions only, which is where the weights matter.
//!
//! A process keeps its admission between its statements while nobody waits: a
//! [`Lease`], one per process in a cache line of its own. Its next statement of the same
//! group resumes the lease without touching [`Counts`], so the statements of an
//! uncontended server write no shared cache line at all (with several cores, those
//! writes moved the `Counts` line between them at every statement). An idle lease is an
//! admission like any other, so it counts against the limits; the first statement that
//! has to wait revokes every idle lease before it queues ([`Queue::arrive`]), and once
//! statements wait, an ending statement gives its admission back instead of keeping it.
//! The same store-then-load pairing as above keeps the two sides from missing each
//! other: a process stores "idle" and then reads `waiting`; an arriving waiter raises
//! `waiting` and then reads the leases. A compare-and-swap decides between a process
//! resuming its lease and a waiter revoking it.

use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::SeqCst;

use crate::memory::Budget;
use crate::shared::MAX_GROUPS;

// `Queue::dispatch` keeps one bit per group.
const _: () = assert!(MAX_GROUPS <= 64);

/// Pass units per unit of weight: a group of weight `w` advances `STRIDE_ONE / w` per
/// statement admitted from the queue.
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
    /// Memory the waiting statement reserves when admitted, kB (`crate::memory`).
    pub need_kb: u64,
    /// Memory the process's admitted statement reserved, kB, and from which group's
    /// budget; given back by [`Queue::release_memory`]. A process holds at most one
    /// reservation: its further statements run under the admission it holds.
    pub reserved_kb: u64,
    pub reserved_group: u32,
}

/// Whether a statement of group `g` waits for admission, or was admitted while it waited
/// and its process has not noticed yet.
pub fn group_has_waiters(waiters: &[Waiter], g: usize) -> bool {
    waiters
        .iter()
        .any(|w| w.state != WaitState::Idle && w.group as usize == g)
}

/// What happened to an arriving statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    Admitted,
    Queued,
}

/// Admitted statements of one group and the group's limit.
#[derive(Debug, Default)]
#[repr(C)]
struct GroupCount {
    active: AtomicU32,
    /// Admitted statements allowed at once; 0 = no group limit.
    max_concurrency: AtomicU32,
}

/// Whether `active` admissions leave room under a group's `limit` (0 = no limit).
fn below_limit(active: u32, limit: u32) -> bool {
    limit == 0 || active < limit
}

/// The counts and limits of admission, read and changed without the lock.
#[derive(Debug)]
#[repr(C)]
pub struct Counts {
    /// Admitted statements allowed at once (`pg_stride.max_active_queries`).
    max_active: AtomicU32,
    /// Admitted statements.
    active: AtomicU32,
    /// Waiting statements; changed only under the queue's lock.
    waiting: AtomicU32,
    /// Admissions given back that were not counted: always 0 unless a bug gave one
    /// back twice (the counts saturate at 0 rather than wrap).
    underflows: AtomicU32,
    /// 1 while a memory budget is set (the server's or a group's): then statements
    /// estimate their memory before admission (`crate::memory`).
    memory_accounting: AtomicU32,
    groups: [GroupCount; MAX_GROUPS as usize],
}

impl Counts {
    pub fn new(max_active: u32) -> Counts {
        Counts {
            max_active: AtomicU32::new(max_active),
            active: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            underflows: AtomicU32::new(0),
            memory_accounting: AtomicU32::new(0),
            groups: std::array::from_fn(|_| GroupCount::default()),
        }
    }

    /// Admitted statements, server-wide.
    pub fn active(&self) -> u32 {
        self.active.load(SeqCst)
    }

    /// Waiting statements, server-wide.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(SeqCst)
    }

    /// Admitted statements of group `g`.
    pub fn group_active(&self, g: usize) -> u32 {
        self.groups[g].active.load(SeqCst)
    }

    /// Sets the global limit. Call [`Queue::dispatch`] afterwards: a raised limit may let
    /// waiters in.
    pub fn set_max_active(&self, n: u32) {
        self.max_active.store(n, SeqCst);
    }

    /// Whether a memory budget is set, so that a statement must estimate its memory and
    /// reserve it ([`Queue::arrive`]).
    pub fn memory_accounting(&self) -> bool {
        self.memory_accounting.load(SeqCst) != 0
    }

    pub fn set_memory_accounting(&self, on: bool) {
        self.memory_accounting.store(u32::from(on), SeqCst);
    }

    /// Sets group `g`'s limit (0 = none). Call [`Queue::dispatch`] afterwards.
    pub fn set_max_concurrency(&self, g: usize, n: u32) {
        self.groups[g].max_concurrency.store(n, SeqCst);
    }

    /// The fast path of an arrival: admits a statement of group `g` at once when nobody
    /// waits and both limits have room. Lock-free. `false`: take the lock and
    /// [`Queue::arrive`].
    pub fn try_enter(&self, g: usize) -> bool {
        self.waiting.load(SeqCst) == 0 && self.take(g)
    }

    /// An admitted statement of group `g` ends. Lock-free. Returns whether statements
    /// wait: then the caller takes the lock and calls [`Queue::dispatch`].
    pub fn leave(&self, g: usize) -> bool {
        self.decrement(&self.groups[g].active);
        self.decrement(&self.active);
        self.waiting.load(SeqCst) > 0
    }

    /// Whether an admission of group `g` that is already counted stays within the
    /// limits: the counts include it, so they may equal the limits but not exceed them
    /// (they do once a limit was lowered while admissions were held).
    fn within_limits(&self, g: usize) -> bool {
        let group = &self.groups[g];
        let group_limit = group.max_concurrency.load(SeqCst);
        (group_limit == 0 || group.active.load(SeqCst) <= group_limit)
            && self.active.load(SeqCst) <= self.max_active.load(SeqCst)
    }

    /// Takes one admission of group `g` if both limits have room.
    fn take(&self, g: usize) -> bool {
        let group = &self.groups[g];
        let limit = group.max_concurrency.load(SeqCst);
        let took_group = group
            .active
            .fetch_update(SeqCst, SeqCst, |a| below_limit(a, limit).then_some(a + 1))
            .is_ok();
        if !took_group {
            return false;
        }
        let max_active = self.max_active.load(SeqCst);
        let took = self
            .active
            .fetch_update(SeqCst, SeqCst, |a| (a < max_active).then_some(a + 1))
            .is_ok();
        if !took {
            // A dispatch that saw this moment's count may have passed over the group's
            // waiters; the caller goes on to the locked path, which dispatches again.
            self.decrement(&group.active);
        }
        took
    }

    /// Admissions given back twice; see `underflows`. Tests check it stays 0.
    pub fn underflows(&self) -> u32 {
        self.underflows.load(SeqCst)
    }

    fn decrement(&self, counter: &AtomicU32) {
        if counter
            .fetch_update(SeqCst, SeqCst, |v| v.checked_sub(1))
            .is_err()
        {
            self.underflows.fetch_add(1, SeqCst);
        }
    }

    /// Admits a statement of group `g` whatever the limits.
    fn force(&self, g: usize) {
        self.groups[g].active.fetch_add(1, SeqCst);
        self.active.fetch_add(1, SeqCst);
    }
}

/// The admission a process holds for its statement, or keeps idle between statements;
/// see the module comment. Only its own process takes a lease, uses it and keeps it
/// idle; anyone may revoke it while it is idle.
///
/// A statement that waits for its client (a cursor between fetches, a result the client
/// does not read), or on a lock only a client can release, may have its admission
/// **lent** ([`Lease::lend`]): the statement keeps the lease, but no longer counts
/// against the limits, so that a statement the client may be waiting for can be
/// admitted (psaroudakis2013 §5 treats a blocked worker the same way). When it runs
/// again it must count again before it goes on: at once when nobody waits and the
/// limits have room ([`Lease::reclaim`]), otherwise through the [`Queue`] in its turn
/// like any arrival, then [`Lease::returned`]. Nothing here forces an admission; only
/// [`Queue::force_admit`] does (docs/design.md §4 rule 12).
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct Lease(AtomicU32);

/// Lease states: `NO_LEASE`, or the group slot plus one shifted left by two, with
/// `IN_USE` set while a statement uses the admission (clear while it is idle), and
/// `LENT` set while that statement's admission is lent out.
const NO_LEASE: u32 = 0;
const IN_USE: u32 = 1;
const LENT: u32 = 2;

fn idle_lease(g: usize) -> u32 {
    ((g as u32) + 1) << 2
}

fn group_of(state: u32) -> usize {
    (state >> 2) as usize - 1
}

impl Lease {
    /// Resumes the idle lease for a statement of group `g`: `true` = admitted, nothing
    /// else to do. Fails when there is no idle lease of `g` (none, or a waiter revoked it).
    pub fn resume(&self, g: usize) -> bool {
        self.0
            .compare_exchange(idle_lease(g), idle_lease(g) | IN_USE, SeqCst, SeqCst)
            .is_ok()
    }

    /// Whether the process has no lease: then the admission of its next statement,
    /// admitted through [`Counts`] or the [`Queue`], can become one ([`Lease::hold`]).
    pub fn is_free(&self) -> bool {
        self.0.load(SeqCst) == NO_LEASE
    }

    /// Group of the idle lease, if there is one.
    pub fn idle_group(&self) -> Option<usize> {
        let state = self.0.load(SeqCst);
        (state != NO_LEASE && state & IN_USE == 0).then(|| group_of(state))
    }

    /// Group of the statement that uses the lease (lent or not), if one does: it may be
    /// other than the group of the process's latest statement (a cursor opened before a
    /// change of `pg_stride.resource_group`).
    pub fn group_in_use(&self) -> Option<usize> {
        let state = self.0.load(SeqCst);
        (state & IN_USE != 0).then(|| group_of(state))
    }

    /// Whether a statement uses the lease and its admission is lent out.
    pub fn is_lent(&self) -> bool {
        self.0.load(SeqCst) & LENT != 0
    }

    /// A statement of group `g` was admitted while the lease was free: its admission is
    /// the lease from now on, to be ended by [`Lease::finish`].
    pub fn hold(&self, g: usize) {
        debug_assert!(self.is_free());
        self.0.store(idle_lease(g) | IN_USE, SeqCst);
    }

    /// The statement using the lease ended. Keeps the admission idle when nobody waits
    /// and the counts are within the limits, gives it back otherwise (a lent admission
    /// was given back already): a limit lowered while sessions held their admissions
    /// applies once their statements end, even when nobody has to wait. Returns
    /// whether statements wait: then the caller takes the lock and calls
    /// [`Queue::dispatch`].
    ///
    /// Called outside pgrx's error boundary, so it cannot panic: a lease no statement
    /// uses (a bug) is counted with the admissions given back twice ([`Counts::underflows`])
    /// rather than asserted.
    pub fn finish(&self, c: &Counts) -> bool {
        loop {
            let state = self.0.load(SeqCst);
            if state & IN_USE == 0 {
                c.underflows.fetch_add(1, SeqCst);
                return false;
            }
            let g = group_of(state);
            if state & LENT != 0 {
                if self.swap_state(state, NO_LEASE) {
                    return false;
                }
                continue;
            }
            if c.waiting.load(SeqCst) == 0 && c.within_limits(g) {
                if !self.swap_state(state, idle_lease(g)) {
                    continue; // lent meanwhile
                }
                if c.waiting.load(SeqCst) == 0 && c.within_limits(g) {
                    return false;
                }
                // A waiter arrived meanwhile and may have missed the idle lease, or new
                // limits were set and revoked the idle leases before this one was idle.
                return self.surrender(c);
            }
            if self.swap_state(state, NO_LEASE) {
                return c.leave(g);
            }
        }
    }

    /// Gives back the idle lease, if there is one (the process leaves, or its next
    /// statement is of another group). Returns whether statements wait, as
    /// [`Counts::leave`].
    pub fn surrender(&self, c: &Counts) -> bool {
        self.revoke(c).unwrap_or(false)
    }

    /// Takes the idle lease away and gives its admission back. `None`: there was none
    /// (or its process resumed it first); otherwise what [`Counts::leave`] returned.
    /// Anyone may: a waiter ([`Queue::arrive`]), or new limits ([`Queue::revoke_idle`]).
    fn revoke(&self, c: &Counts) -> Option<bool> {
        let g = self.idle_group()?;
        self.swap_state(idle_lease(g), NO_LEASE).then(|| c.leave(g))
    }

    /// Lends out the admission of the statement using the lease: it stops counting
    /// against the limits. `None` when no statement uses the lease or its admission is
    /// lent already; otherwise whether statements wait, as [`Counts::leave`] (then the
    /// caller dispatches). Called by anyone who sees the statement wait on a lock or on
    /// its client.
    pub fn lend(&self, c: &Counts) -> Option<bool> {
        let state = self.0.load(SeqCst);
        if state & IN_USE == 0 || state & LENT != 0 {
            return None;
        }
        self.swap_state(state, state | LENT)
            .then(|| c.leave(group_of(state)))
    }

    /// Group of the statement whose admission is lent out, if it is.
    pub fn lent_group(&self) -> Option<usize> {
        let state = self.0.load(SeqCst);
        (state & LENT != 0).then(|| group_of(state))
    }

    /// The statement whose admission was lent runs again: it counts again if it can do
    /// so within the limits with nobody waiting ([`Counts::try_enter`]). Called by its
    /// own process, or by anyone who sees it run.
    pub fn reclaim(&self, c: &Counts) -> Reclaim {
        let state = self.0.load(SeqCst);
        if state & LENT == 0 {
            return Reclaim::NotLent;
        }
        let g = group_of(state);
        if !c.try_enter(g) {
            return Reclaim::NoRoom;
        }
        if self.swap_state(state, state & !LENT) {
            return Reclaim::Reclaimed;
        }
        // Meanwhile the statement ended, or its process took the admission back itself:
        // the one just taken is not needed.
        Reclaim::Raced {
            waiters: c.leave(g),
        }
    }

    /// The lent statement's process was admitted through the [`Queue`] for it: that
    /// admission is the lease's from now on. Returns whether statements wait (then the
    /// caller dispatches): the lease had been reclaimed meanwhile, and the admission
    /// from the queue is given back.
    pub fn returned(&self, c: &Counts) -> bool {
        loop {
            let state = self.0.load(SeqCst);
            if state & LENT == 0 {
                return c.leave(group_of(state));
            }
            if self.swap_state(state, state & !LENT) {
                return false;
            }
        }
    }

    fn swap_state(&self, from: u32, to: u32) -> bool {
        self.0.compare_exchange(from, to, SeqCst, SeqCst).is_ok()
    }
}

/// What [`Lease::reclaim`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// The admission was not lent out.
    NotLent,
    /// It counts again.
    Reclaimed,
    /// The limits have no room, or statements wait: it stays lent, and its process
    /// comes back through the queue.
    NoRoom,
    /// Someone else ended the lending first; `waiters`: the caller dispatches.
    Raced { waiters: bool },
}

impl Reclaim {
    /// Whether the caller must dispatch the queue.
    pub fn must_dispatch(self) -> bool {
        matches!(self, Reclaim::Raced { waiters: true })
    }
}

/// Per-group queue state.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct GroupQueue {
    /// Waiting statements.
    pub waiting: u32,
    /// CPU weight of the group (≥ 1).
    pub weight: u32,
    /// Stride pass over admissions from the queue.
    pub pass: u64,
    /// The group's memory budget (`memory_budget`; 0 = none).
    pub memory: Budget,
}

impl GroupQueue {
    fn stride(&self) -> u64 {
        STRIDE_ONE / u64::from(self.weight.max(1))
    }
}

/// The waiting statements of the whole server; every call under one lock.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Queue {
    next_ticket: u64,
    /// Virtual time: the highest pass from which an admission was charged; groups that
    /// had nobody waiting rejoin here.
    virtual_time: u64,
    /// The server's memory budget (`pg_stride.memory_budget`; 0 = none).
    pub memory: Budget,
    pub groups: [GroupQueue; MAX_GROUPS as usize],
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            next_ticket: 0,
            virtual_time: 0,
            memory: Budget::default(),
            groups: [GroupQueue {
                weight: 100,
                ..GroupQueue::default()
            }; MAX_GROUPS as usize],
        }
    }
}

impl Queue {
    /// Sets a group's weight, concurrency limit and memory budget (kB, 0 = none). Call
    /// [`Queue::dispatch`] afterwards.
    pub fn configure_group(
        &mut self,
        c: &Counts,
        g: usize,
        weight: u32,
        max_concurrency: u32,
        memory_budget_kb: u64,
    ) {
        self.groups[g].weight = weight.max(1);
        self.groups[g].memory.limit_kb = memory_budget_kb;
        c.set_max_concurrency(g, max_concurrency);
    }

    /// Gives back the idle leases that the limits no longer have room for (after a limit
    /// was lowered), until the counts are within them: their sessions' next statements
    /// are admitted, or wait, like any other. Under the queue's lock, as [`Queue::arrive`]
    /// revokes them. Leases in use are given back when their statements end
    /// ([`Lease::finish`]).
    pub fn revoke_idle<'a>(&mut self, c: &Counts, leases: impl IntoIterator<Item = &'a Lease>) {
        for lease in leases {
            if let Some(g) = lease.idle_group() {
                if !c.within_limits(g) {
                    lease.revoke(c);
                }
            }
        }
    }

    /// Sets the server's memory budget (kB, 0 = none). Call [`Queue::dispatch`]
    /// afterwards.
    pub fn set_memory_budget(&mut self, kb: u64) {
        self.memory.limit_kb = kb;
    }

    /// The pass group `g` would have after one more admission.
    fn next_pass(&self, g: usize) -> u64 {
        let q = &self.groups[g];
        q.pass + q.stride()
    }

    /// Charges group `g`'s pass for an admission from the queue.
    fn charge(&mut self, g: usize) {
        let q = &mut self.groups[g];
        self.virtual_time = self.virtual_time.max(q.pass);
        q.pass += q.stride();
    }

    /// A statement of process `p` in group `g` arrives (after [`Counts::try_enter`]
    /// failed, or instead of it), reserving `need_kb` of memory once admitted (a
    /// statement that needs memory must not take the fast path). Admits it at once if
    /// nobody waits and there is room; otherwise queues it and admits whoever may go now,
    /// which may be `p` itself.
    ///
    /// `leases` are every process's [`Lease`]: the idle ones are revoked first, since the
    /// statement would otherwise wait for admissions that nobody uses.
    #[allow(clippy::too_many_arguments)]
    pub fn arrive<'a>(
        &mut self,
        c: &Counts,
        waiters: &mut [Waiter],
        leases: impl IntoIterator<Item = &'a Lease>,
        p: usize,
        g: usize,
        need_kb: u64,
        wake: impl FnMut(usize),
    ) -> Arrival {
        // Counted as waiting before the leases are read (see the module comment): from
        // here on, no process keeps an idle lease that this scan does not see.
        c.waiting.fetch_add(1, SeqCst);
        for lease in leases {
            lease.revoke(c);
        }
        if self.groups[g].waiting == 0 {
            // A group that had nobody waiting rejoins the queue at the virtual time, even
            // with statements running (admitted before, or at once): what it did not
            // ask for meanwhile is not owed to it later (wagner2021 §2.1).
            let q = &mut self.groups[g];
            q.pass = q.pass.max(self.virtual_time);
        }
        waiters[p] = Waiter {
            group: g as u32,
            state: WaitState::Queued,
            ticket: self.next_ticket,
            need_kb,
            ..waiters[p]
        };
        self.next_ticket += 1;
        self.groups[g].waiting += 1;
        self.memory.ask(need_kb);
        self.groups[g].memory.ask(need_kb);
        self.dispatch(c, waiters, wake);
        if self.take_admitted(waiters, p) {
            Arrival::Admitted
        } else {
            Arrival::Queued
        }
    }

    /// Whether group `g`'s waiting statements exceed `group_max`, or the server's exceed
    /// `server_max` (0 = no bound): asked right after [`Queue::arrive`] queued one, which
    /// then withdraws it ([`Queue::withdraw`]) and fails at once.
    pub fn over_bounds(&self, c: &Counts, g: usize, group_max: u32, server_max: u32) -> bool {
        (group_max > 0 && self.groups[g].waiting > group_max)
            || (server_max > 0 && c.waiting() > server_max)
    }

    /// Process `p` stops waiting (timeout, cancel, exit). Returns `true` if it was still
    /// queued and is now gone from the queue; `false` if it had been admitted meanwhile,
    /// in which case it holds an admission the caller must give back
    /// ([`Counts::leave`]); the memory that admission reserved is given back here.
    /// A statement that waited for memory may have held back others (see
    /// [`Queue::dispatch`]): they are admitted now if they can be, and woken.
    pub fn withdraw(
        &mut self,
        c: &Counts,
        waiters: &mut [Waiter],
        p: usize,
        wake: impl FnMut(usize),
    ) -> bool {
        let w = waiters[p];
        let g = w.group as usize;
        match w.state {
            WaitState::Queued => {
                self.groups[g].waiting -= 1;
                self.memory.stop_asking(w.need_kb);
                self.groups[g].memory.stop_asking(w.need_kb);
                c.waiting.fetch_sub(1, SeqCst);
                waiters[p].state = WaitState::Idle;
                if w.need_kb > 0 {
                    self.dispatch(c, waiters, wake);
                }
                true
            }
            WaitState::Admitted => {
                self.memory.unreserve(w.need_kb);
                self.groups[g].memory.unreserve(w.need_kb);
                waiters[p].reserved_kb -= w.need_kb;
                waiters[p].state = WaitState::Idle;
                false
            }
            WaitState::Idle => true,
        }
    }

    /// Process `p`'s wait ran out of time: it takes an admission granted meanwhile, with
    /// the memory reserved for it (returns `true`), or leaves the queue ([`Queue::withdraw`],
    /// `false`). Unlike [`Queue::withdraw`] alone, which gives that memory back for a
    /// caller that gives the admission back too.
    pub fn stop_waiting(
        &mut self,
        c: &Counts,
        waiters: &mut [Waiter],
        p: usize,
        wake: impl FnMut(usize),
    ) -> bool {
        self.take_admitted(waiters, p) || {
            let left = self.withdraw(c, waiters, p, wake);
            debug_assert!(left, "an admission was taken above");
            false
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

    /// Admits process `p` whatever the limits, if it is queued: the watchdog's way out
    /// of a wait-for cycle through admission (docs/design.md §4 rules 5 and 12), the one
    /// place where a limit is crossed. Returns the group it was admitted in.
    pub fn force_admit(&mut self, c: &Counts, waiters: &mut [Waiter], p: usize) -> Option<usize> {
        if waiters[p].state != WaitState::Queued {
            return None;
        }
        let g = waiters[p].group as usize;
        c.force(g);
        self.mark_admitted(c, waiters, p, g);
        Some(g)
    }

    /// Records that `p`, queued in group `g`, holds an admission now, and the memory it
    /// reserved with it.
    fn mark_admitted(&mut self, c: &Counts, waiters: &mut [Waiter], p: usize, g: usize) {
        let need = waiters[p].need_kb;
        self.groups[g].waiting -= 1;
        self.memory.stop_asking(need);
        self.groups[g].memory.stop_asking(need);
        self.memory.reserve(need);
        self.groups[g].memory.reserve(need);
        c.waiting.fetch_sub(1, SeqCst);
        self.charge(g);
        let w = &mut waiters[p];
        debug_assert!(
            w.reserved_kb == 0 || need == 0,
            "one reservation per process"
        );
        w.reserved_kb += need;
        w.reserved_group = g as u32;
        w.state = WaitState::Admitted;
    }

    /// Process `p`'s statement that reserved memory ended (or the process exits): gives
    /// the memory back. Returns whether statements wait: then the caller dispatches.
    pub fn release_memory(&mut self, c: &Counts, waiters: &mut [Waiter], p: usize) -> bool {
        let w = &mut waiters[p];
        let kb = std::mem::take(&mut w.reserved_kb);
        self.memory.unreserve(kb);
        self.groups[w.reserved_group as usize].memory.unreserve(kb);
        kb > 0 && c.waiting() > 0
    }

    /// The statement of group `g` that may be admitted next, by arrival, and whether
    /// the group's first statement was held back for another's memory. The first
    /// statement of the group goes if its memory fits, beside the memory kept for an
    /// earlier statement; if not, a later one that needs no memory may pass it: it takes
    /// a place of the group, but no memory. `held_for`: the ticket and need of the
    /// statement memory is kept for ([`Queue::memory_held_for`]).
    fn next_of(
        &self,
        waiters: &[Waiter],
        g: usize,
        held_for: Option<(u64, u64)>,
    ) -> (Option<usize>, bool) {
        let queued = || {
            waiters
                .iter()
                .enumerate()
                .filter(move |(_, w)| w.state == WaitState::Queued && w.group as usize == g)
        };
        let Some((first, w)) = queued().min_by_key(|(_, w)| w.ticket) else {
            return (None, false);
        };
        let held = w.need_kb > 0
            && held_for.is_some_and(|(ticket, kept_kb)| {
                ticket < w.ticket && !self.memory.fits_beside(w.need_kb, kept_kb)
            });
        if !held && self.memory.fits(w.need_kb) && self.groups[g].memory.fits(w.need_kb) {
            return (Some(first), false);
        }
        let passing = queued()
            .filter(|(_, w)| w.need_kb == 0)
            .min_by_key(|(_, w)| w.ticket)
            .map(|(p, _)| p);
        (passing, held)
    }

    /// The arrival ticket and the need of the statement the server's memory is kept for:
    /// the first to arrive of the statements that need memory, are first in their
    /// groups, and that their groups' budgets would let in, whether or not their groups'
    /// limits have room now. A statement needing memory that came after it is let in
    /// only if the server's budget keeps room for both (`fits_beside`): the memory beyond
    /// the kept statement's need is used meanwhile, and what it needs is there once its
    /// group has a place. Kept while its group is full too: a group kept full by
    /// statements needing no memory (which pass its first one while that one's memory
    /// does not fit) would otherwise see the memory go to later statements of other
    /// groups, for ever. By arrival, not by the groups' places in stride order: a group's
    /// pass also advances with the statements needing no memory that pass its large one,
    /// so a busy group ahead of it could otherwise take every share of memory that frees
    /// up, for ever.
    fn memory_held_for(&self, waiters: &[Waiter]) -> Option<(u64, u64)> {
        let mut first_of_group = [None::<&Waiter>; MAX_GROUPS as usize];
        for w in waiters.iter().filter(|w| w.state == WaitState::Queued) {
            let slot = &mut first_of_group[w.group as usize];
            if slot.is_none_or(|f| w.ticket < f.ticket) {
                *slot = Some(w);
            }
        }
        first_of_group
            .iter()
            .enumerate()
            .filter_map(|(g, w)| w.map(|w| (g, w)))
            .filter(|&(g, w)| w.need_kb > 0 && self.groups[g].memory.fits(w.need_kb))
            .map(|(_, w)| (w.ticket, w.need_kb))
            .min()
    }

    /// Admits waiting statements while there is room, lowest next pass first (ties to
    /// the lower group index), and calls `wake` for each. Call it after raising a limit
    /// and when [`Counts::leave`] says statements wait.
    pub fn dispatch(&mut self, c: &Counts, waiters: &mut [Waiter], mut wake: impl FnMut(usize)) {
        // Groups whose limit (or the global one, or memory) had no room in this round.
        let mut full: u64 = 0;
        // Groups whose first statement was held back for another's memory: tried again
        // once the statement the memory is kept for changes (admitted, or withdrawn).
        let mut held: u64 = 0;
        let mut last_held_for = None;
        loop {
            // Without a server budget, or with nobody asking for memory, it is held for
            // nobody (and the scan is saved).
            let held_for = if self.memory.limit_kb > 0 && self.memory.waiting_kb > 0 {
                self.memory_held_for(waiters)
            } else {
                None
            };
            if held_for != last_held_for {
                full &= !held;
                held = 0;
                last_held_for = held_for;
            }
            let best = (0..self.groups.len())
                .filter(|&g| self.groups[g].waiting > 0 && full & (1 << g) == 0)
                .min_by_key(|&g| (self.next_pass(g), g));
            let Some(g) = best else { return };
            let (next, was_held) = self.next_of(waiters, g, held_for);
            if was_held {
                held |= 1 << g;
            }
            let Some(p) = next else {
                if self.groups[g].waiting > 0
                    && !waiters
                        .iter()
                        .any(|w| w.state == WaitState::Queued && w.group as usize == g)
                {
                    // The counts say someone waits in g but no entry does: repair the
                    // count rather than spin (cannot happen while callers keep to the
                    // lock).
                    c.waiting.fetch_sub(self.groups[g].waiting, SeqCst);
                    self.groups[g].waiting = 0;
                    self.groups[g].memory.waiting_kb = 0;
                }
                full |= 1 << g;
                continue;
            };
            if !c.take(g) {
                full |= 1 << g;
                continue;
            }
            self.mark_admitted(c, waiters, p, g);
            wake(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The admission state with the extension's calling pattern: the fast path first,
    /// the queue (under its lock, here `&mut`) when it fails.
    struct Server {
        c: Counts,
        q: Queue,
        w: Vec<Waiter>,
        l: Vec<Lease>,
    }

    impl Server {
        fn new(max_active: u32, procs: usize) -> Server {
            Server {
                c: Counts::new(max_active),
                q: Queue::default(),
                w: vec![Waiter::default(); procs],
                l: (0..procs).map(|_| Lease::default()).collect(),
            }
        }

        fn configure(&mut self, g: usize, weight: u32, max_concurrency: u32) {
            self.q
                .configure_group(&self.c, g, weight, max_concurrency, 0);
        }

        fn arrive(&mut self, p: usize, g: usize) -> Arrival {
            if self.c.try_enter(g) {
                return Arrival::Admitted;
            }
            self.q
                .arrive(&self.c, &mut self.w, &self.l, p, g, 0, |_| {})
        }

        /// As the extension admits a statement: the idle lease first, then the fast
        /// path, then the queue; an admission becomes the lease when there is none.
        /// Returns whether it was admitted at once and whether it runs on the lease.
        fn arrive_leasing(&mut self, p: usize, g: usize) -> (Arrival, bool) {
            if self.l[p].resume(g) {
                return (Arrival::Admitted, true);
            }
            let woken = self.l[p].surrender(&self.c);
            assert!(!woken, "nobody waits in these tests when a group changes");
            let arrival = self.arrive(p, g);
            let leased = arrival == Arrival::Admitted && self.l[p].is_free();
            if leased {
                self.l[p].hold(g);
            }
            (arrival, leased)
        }

        /// Ends p's statement that runs on its lease; returns who was woken.
        fn finish_leased(&mut self, p: usize) -> Vec<usize> {
            let mut woken = vec![];
            if self.l[p].finish(&self.c) {
                self.q.dispatch(&self.c, &mut self.w, |p| woken.push(p));
            }
            woken
        }

        /// Ends an admitted statement of group `g`; returns who was woken.
        fn finish(&mut self, g: usize) -> Vec<usize> {
            let mut woken = vec![];
            if self.c.leave(g) {
                self.q.dispatch(&self.c, &mut self.w, |p| woken.push(p));
            }
            woken
        }

        /// A statement needing `kb` of memory arrives: it skips the fast path.
        fn arrive_needing(&mut self, p: usize, g: usize, kb: u64) -> Arrival {
            self.q
                .arrive(&self.c, &mut self.w, &self.l, p, g, kb, |_| {})
        }

        /// Ends p's admitted statement of group `g` that reserved memory: the memory goes
        /// back first, then the admission. Returns who was woken.
        fn finish_needing(&mut self, p: usize, g: usize) -> Vec<usize> {
            let mut woken = vec![];
            if self.q.release_memory(&self.c, &mut self.w, p) {
                self.q.dispatch(&self.c, &mut self.w, |p| woken.push(p));
            }
            woken.extend(self.finish(g));
            woken
        }

        fn take_admitted(&mut self, p: usize) -> bool {
            self.q.take_admitted(&mut self.w, p)
        }

        fn totals(&self) -> (u32, u32) {
            (self.c.active(), self.c.waiting())
        }
    }

    #[test]
    fn admits_up_to_the_global_limit_then_queues() {
        let mut s = Server::new(2, 4);
        assert_eq!(s.arrive(0, 0), Arrival::Admitted);
        assert_eq!(s.arrive(1, 0), Arrival::Admitted);
        assert_eq!(s.arrive(2, 0), Arrival::Queued);
        assert_eq!(s.totals(), (2, 1));
        assert_eq!(s.finish(0), vec![2]);
        assert!(s.take_admitted(2));
        assert_eq!(s.totals(), (2, 0));
    }

    #[test]
    fn the_fast_path_never_overtakes_a_waiter() {
        let mut s = Server::new(1, 3);
        assert!(s.c.try_enter(0));
        assert_eq!(s.arrive(1, 0), Arrival::Queued);
        // Room appears without a dispatch yet (a limit raised): a newcomer must still
        // queue behind process 1.
        s.c.set_max_active(2);
        assert!(!s.c.try_enter(0));
        assert_eq!(
            s.q.arrive(&s.c, &mut s.w, &s.l, 2, 0, 0, |_| {}),
            Arrival::Queued
        );
        assert!(s.take_admitted(1), "the waiter went first");
    }

    #[test]
    fn group_limit_holds_back_only_its_group() {
        let mut s = Server::new(10, 4);
        s.configure(1, 100, 1);
        assert_eq!(s.arrive(0, 1), Arrival::Admitted);
        assert_eq!(s.arrive(1, 1), Arrival::Queued);
        assert_eq!(s.arrive(2, 0), Arrival::Admitted);
        assert!(s.finish(0).is_empty(), "group 1 is still at its limit");
        assert_eq!(s.finish(1), vec![1]);
        assert_eq!(s.c.group_active(1), 1);
    }

    #[test]
    fn heavier_group_waiter_goes_first_though_it_came_later() {
        let mut s = Server::new(1, 4);
        s.configure(1, 100, 0);
        s.configure(2, 300, 0);
        assert_eq!(s.arrive(0, 0), Arrival::Admitted);
        assert_eq!(s.arrive(1, 1), Arrival::Queued); // light group, first
        assert_eq!(s.arrive(2, 2), Arrival::Queued); // heavy group, second
        assert_eq!(s.finish(0), vec![2]);
    }

    #[test]
    fn same_group_waiters_go_in_arrival_order() {
        let mut s = Server::new(1, 5);
        s.arrive(0, 0);
        for p in [3, 1, 4, 2] {
            assert_eq!(s.arrive(p, 0), Arrival::Queued);
        }
        let mut order = vec![];
        for _ in 0..4 {
            let woken = s.finish(0);
            assert_eq!(woken.len(), 1);
            order.push(woken[0]);
        }
        assert_eq!(order, vec![3, 1, 4, 2]);
    }

    /// Runs `rounds` admissions with one slot while every process always has a statement
    /// waiting; returns the admissions per group.
    fn closed_loop(s: &mut Server, group_of: &[usize], rounds: usize) -> Vec<u32> {
        let mut per_group = vec![0u32; MAX_GROUPS as usize];
        s.arrive(0, group_of[0]);
        for (p, &g) in group_of.iter().enumerate().skip(1) {
            assert_eq!(s.arrive(p, g), Arrival::Queued);
        }
        let mut current = 0;
        for _ in 0..rounds {
            let woken = s.finish(group_of[current]);
            assert_eq!(woken.len(), 1);
            let p = woken[0];
            assert!(s.take_admitted(p));
            per_group[group_of[p]] += 1;
            // The finished process sends its next statement, which has to wait; process
            // 0 only holds the slot at the start.
            if current != 0 {
                assert_eq!(s.arrive(current, group_of[current]), Arrival::Queued);
            }
            current = p;
        }
        per_group
    }

    #[test]
    fn admissions_follow_the_weights_under_contention() {
        let mut s = Server::new(1, 7);
        s.configure(1, 300, 0);
        s.configure(2, 100, 0);
        let per_group = closed_loop(&mut s, &[0, 1, 1, 1, 2, 2, 2], 4000);
        let ratio = f64::from(per_group[1]) / f64::from(per_group[2]);
        assert!((ratio - 3.0).abs() < 0.05, "ratio {ratio}");
    }

    /// Group 1 is admitted from the queue 1000 times while group 2 waits for nothing,
    /// then both groups' statements arrive in a closed loop: returns the admissions of
    /// each in 10 turns.
    fn after_a_thousand_admissions_of_group_1(mut s: Server) -> (u32, u32) {
        s.arrive(0, 1);
        for _ in 0..1000 {
            assert_eq!(s.arrive(1, 1), Arrival::Queued);
            assert_eq!(s.finish(1), vec![1]);
            assert!(s.take_admitted(1));
        }
        s.finish(1);
        let per_group = closed_loop(&mut s, &[0, 1, 1, 2, 2], 10);
        (per_group[1], per_group[2])
    }

    #[test]
    fn an_idle_group_rejoins_at_the_virtual_time() {
        // Group 2 must neither get a burst of admissions to catch up nor wait behind
        // group 1's history: with equal weights the two alternate.
        let s = Server::new(1, 5);
        assert_eq!(after_a_thousand_admissions_of_group_1(s), (5, 5));
    }

    #[test]
    fn a_group_with_a_statement_running_rejoins_at_the_virtual_time() {
        // As above, but group 2 has a long statement running all along (admitted before
        // group 1's turns): it asked for nothing meanwhile, so it is owed nothing.
        let mut s = Server::new(2, 6);
        assert_eq!(s.arrive(5, 2), Arrival::Admitted);
        assert_eq!(after_a_thousand_admissions_of_group_1(s), (5, 5));
    }

    #[test]
    fn withdraw_removes_a_waiter_or_reports_its_admission() {
        let mut s = Server::new(1, 3);
        s.arrive(0, 0);
        s.arrive(1, 0);
        s.arrive(2, 0);
        assert!(s.q.withdraw(&s.c, &mut s.w, 1, |_| {}));
        assert_eq!(s.c.waiting(), 1);
        s.finish(0);
        // Process 2 was admitted before it noticed; withdrawing tells the caller.
        assert!(!s.q.withdraw(&s.c, &mut s.w, 2, |_| {}));
        assert_eq!(s.c.active(), 1);
        s.finish(0);
        assert_eq!(s.totals(), (0, 0));
    }

    #[test]
    fn a_group_has_waiters_from_its_arrival_in_the_queue_until_its_process_takes_the_admission() {
        let mut s = Server::new(1, 3);
        s.arrive(0, 0);
        assert!(!group_has_waiters(&s.w, 0), "admitted at once");
        assert_eq!(s.arrive(1, 2), Arrival::Queued);
        assert!(group_has_waiters(&s.w, 2) && !group_has_waiters(&s.w, 0));
        s.finish(0);
        assert!(group_has_waiters(&s.w, 2), "admitted, not yet noticed");
        assert!(s.q.take_admitted(&mut s.w, 1));
        assert!(!group_has_waiters(&s.w, 2));
    }

    #[test]
    fn force_admit_ignores_the_limits() {
        let mut s = Server::new(1, 2);
        s.arrive(0, 0);
        s.arrive(1, 0);
        assert_eq!(s.q.force_admit(&s.c, &mut s.w, 1), Some(0));
        assert_eq!(s.totals(), (2, 0));
        assert_eq!(s.q.force_admit(&s.c, &mut s.w, 1), None);
        s.finish(0);
        s.finish(0);
        assert_eq!(s.c.active(), 0);
    }

    #[test]
    fn a_lease_keeps_the_admission_between_statements_while_nobody_waits() {
        let mut s = Server::new(1, 2);
        assert_eq!(s.arrive_leasing(0, 0), (Arrival::Admitted, true));
        assert_eq!(s.l[0].group_in_use(), Some(0));
        assert!(s.finish_leased(0).is_empty());
        assert_eq!(s.l[0].idle_group(), Some(0));
        assert_eq!(s.l[0].group_in_use(), None, "idle");
        assert_eq!(s.totals(), (1, 0), "the idle lease still counts");
        assert_eq!(s.arrive_leasing(0, 0), (Arrival::Admitted, true));
        assert_eq!(s.l[0].idle_group(), None, "in use");
        assert!(s.finish_leased(0).is_empty());
    }

    #[test]
    fn a_waiter_revokes_idle_leases_instead_of_waiting_for_them() {
        let mut s = Server::new(2, 3);
        s.configure(1, 100, 1);
        // Process 0 keeps an idle lease in group 1, process 1 one in group 0: both
        // limits are reached by admissions nobody uses.
        s.arrive_leasing(0, 1);
        s.finish_leased(0);
        s.arrive_leasing(1, 0);
        s.finish_leased(1);
        assert_eq!(s.totals(), (2, 0));
        assert_eq!(s.arrive_leasing(2, 1), (Arrival::Admitted, true));
        assert_eq!((s.l[0].idle_group(), s.l[1].idle_group()), (None, None));
        assert_eq!(s.totals(), (1, 0));
        // Process 0's next statement has lost its lease and must queue behind the limit.
        assert!(!s.l[0].resume(1));
        assert_eq!(s.arrive_leasing(0, 1), (Arrival::Queued, false));
    }

    #[test]
    fn a_lowered_group_limit_applies_to_sessions_that_keep_their_leases() {
        let mut s = Server::new(10, 4);
        // Four sessions of group 1 each keep an admission between their statements;
        // two of them are running a statement when the limit drops from none to 1.
        for p in 0..4 {
            assert_eq!(s.arrive_leasing(p, 1), (Arrival::Admitted, true));
        }
        s.finish_leased(0);
        s.finish_leased(1);
        assert_eq!(s.c.group_active(1), 4);
        s.configure(1, 100, 1);
        s.q.revoke_idle(&s.c, &s.l);
        // The idle leases are given back, and the statements still running give theirs
        // back when they end, though nobody waits.
        assert_eq!((s.l[0].idle_group(), s.l[1].idle_group()), (None, None));
        assert_eq!(s.c.group_active(1), 2);
        assert!(s.finish_leased(2).is_empty());
        assert!(s.l[2].is_free());
        // Within the limit again: the last session keeps its lease idle.
        s.finish_leased(3);
        assert_eq!(s.l[3].idle_group(), Some(1));
        assert_eq!(s.c.group_active(1), 1);
        // The sessions that lost their leases are admitted up to the limit, then wait.
        assert_eq!(s.arrive_leasing(0, 1), (Arrival::Admitted, true));
        assert_eq!(s.arrive_leasing(1, 1), (Arrival::Queued, false));
        assert!(!s.l[3].resume(1), "the waiter revoked the idle lease");
        assert_eq!(s.c.underflows(), 0);
    }

    #[test]
    fn a_lowered_server_limit_applies_to_sessions_that_keep_their_leases() {
        let mut s = Server::new(3, 3);
        for p in 0..3 {
            assert_eq!(s.arrive_leasing(p, p % 2), (Arrival::Admitted, true));
        }
        s.finish_leased(0);
        s.c.set_max_active(1);
        s.q.revoke_idle(&s.c, &s.l);
        assert!(s.l[0].is_free());
        assert!(s.finish_leased(1).is_empty());
        assert!(s.l[1].is_free());
        assert_eq!(s.totals(), (1, 0));
        s.finish_leased(2);
        assert_eq!(s.l[2].idle_group(), Some(0));
        // Revoking stops once the counts are within the limits.
        s.q.revoke_idle(&s.c, &s.l);
        assert_eq!(s.l[2].idle_group(), Some(0));
        assert_eq!(s.totals(), (1, 0));
    }

    #[test]
    fn an_ending_statement_gives_its_lease_back_when_someone_waits() {
        let mut s = Server::new(1, 2);
        s.arrive_leasing(0, 0);
        assert_eq!(s.arrive_leasing(1, 0), (Arrival::Queued, false));
        assert_eq!(s.finish_leased(0), vec![1]);
        assert!(s.l[0].is_free());
        assert!(s.take_admitted(1));
        assert_eq!(s.totals(), (1, 0));
    }

    #[test]
    fn a_lease_of_another_group_is_given_back() {
        let mut s = Server::new(4, 1);
        s.arrive_leasing(0, 0);
        s.finish_leased(0);
        assert_eq!(s.arrive_leasing(0, 2), (Arrival::Admitted, true));
        assert_eq!((s.c.group_active(0), s.c.group_active(2)), (0, 1));
        s.finish_leased(0);
        assert!(!s.l[0].surrender(&s.c));
        assert_eq!(s.totals(), (0, 0));
    }

    /// Lends p's admission as the watchdog does; returns who was woken.
    fn lend(s: &mut Server, p: usize) -> Option<Vec<usize>> {
        let waits = s.l[p].lend(&s.c)?;
        let mut woken = vec![];
        if waits {
            s.q.dispatch(&s.c, &mut s.w, |p| woken.push(p));
        }
        Some(woken)
    }

    #[test]
    fn a_lent_admission_lets_the_next_statement_in_and_comes_back_through_the_queue() {
        // Process 0's statement waits for its client, whose next move needs process 1's
        // statement, queued behind it: lending 0's admission lets 1 in.
        let mut s = Server::new(1, 3);
        assert_eq!(s.arrive_leasing(0, 0), (Arrival::Admitted, true));
        assert_eq!(s.arrive_leasing(1, 0), (Arrival::Queued, false));
        assert_eq!(lend(&mut s, 0), Some(vec![1]));
        assert_eq!(s.l[0].lent_group(), Some(0));
        assert_eq!(lend(&mut s, 0), None, "lent once only");
        assert!(s.take_admitted(1));
        assert_eq!(s.totals(), (1, 0));
        // Process 0 runs again while 1 holds the only admission: it stays lent, and a
        // statement that arrived before it comes back goes first.
        assert_eq!(s.l[0].reclaim(&s.c), Reclaim::NoRoom);
        assert_eq!(s.totals(), (1, 0), "no limit crossed");
        assert_eq!(s.arrive(2, 0), Arrival::Queued);
        assert_eq!(
            s.q.arrive(&s.c, &mut s.w, &s.l, 0, 0, 0, |_| {}),
            Arrival::Queued
        );
        assert_eq!(s.finish(0), vec![2], "the earlier arrival first");
        assert_eq!(s.finish(0), vec![0]);
        assert!(s.take_admitted(0));
        assert!(!s.l[0].returned(&s.c));
        assert_eq!(s.l[0].lent_group(), None);
        assert_eq!(s.totals(), (1, 0));
        assert!(s.finish_leased(0).is_empty());
        assert_eq!(
            s.l[0].idle_group(),
            Some(0),
            "back from the queue, it is an admission again"
        );
        s.l[0].surrender(&s.c);
        assert_eq!(s.totals(), (0, 0));
    }

    #[test]
    fn a_lent_admission_comes_back_at_once_when_there_is_room_and_nobody_waits() {
        let mut s = Server::new(2, 2);
        s.arrive_leasing(0, 0);
        assert_eq!(lend(&mut s, 0), Some(vec![]));
        assert_eq!(s.totals(), (0, 0));
        assert_eq!(s.l[0].reclaim(&s.c), Reclaim::Reclaimed);
        assert_eq!(
            s.l[0].reclaim(&s.c),
            Reclaim::NotLent,
            "reclaimed once only"
        );
        assert_eq!(s.totals(), (1, 0));
        // Room, but a statement waits (its group is full): the lent one does not pass it.
        s.configure(1, 100, 1);
        s.arrive(1, 1);
        assert_eq!(lend(&mut s, 0), Some(vec![]));
        assert_eq!(s.arrive(1, 1), Arrival::Queued);
        assert_eq!(s.l[0].reclaim(&s.c), Reclaim::NoRoom);
    }

    #[test]
    fn an_admission_from_the_queue_is_given_back_when_the_lease_was_reclaimed_meanwhile() {
        let mut s = Server::new(1, 1);
        s.arrive_leasing(0, 0);
        lend(&mut s, 0);
        // Its process queues for it, and before it is admitted another reclaims it.
        assert_eq!(s.l[0].reclaim(&s.c), Reclaim::Reclaimed);
        assert_eq!(
            s.q.arrive(&s.c, &mut s.w, &s.l, 0, 0, 0, |_| {}),
            Arrival::Queued
        );
        assert_eq!(s.finish(0), vec![0]);
        assert!(s.take_admitted(0));
        assert_eq!(s.totals(), (1, 0));
        assert!(!s.l[0].returned(&s.c), "nobody waits");
        assert_eq!(s.totals(), (0, 0), "the queue's admission given back");
    }

    #[test]
    fn a_statement_that_ends_while_lent_gives_back_nothing_more() {
        let mut s = Server::new(1, 2);
        s.arrive_leasing(0, 0);
        assert_eq!(lend(&mut s, 0), Some(vec![]));
        assert_eq!(s.totals(), (0, 0));
        assert_eq!(s.arrive_leasing(1, 0), (Arrival::Admitted, true));
        assert!(s.finish_leased(0).is_empty());
        assert!(
            s.l[0].is_free(),
            "no idle lease: its admission is another's now"
        );
        assert!(s.finish_leased(1).is_empty());
        s.l[1].surrender(&s.c);
        assert_eq!(s.totals(), (0, 0));
    }

    #[test]
    fn only_a_lease_in_use_can_be_lent() {
        let mut s = Server::new(2, 1);
        assert_eq!(lend(&mut s, 0), None, "no lease");
        s.arrive_leasing(0, 1);
        s.finish_leased(0);
        assert_eq!(lend(&mut s, 0), None, "an idle lease is revoked, not lent");
        assert_eq!(s.c.group_active(1), 1);
    }

    #[test]
    fn a_bounded_queue_turns_away_the_statement_past_its_bound() {
        let mut s = Server::new(1, 5);
        s.configure(1, 100, 0);
        assert_eq!(s.arrive(0, 0), Arrival::Admitted);
        assert_eq!(s.arrive(1, 0), Arrival::Queued);
        assert!(!s.q.over_bounds(&s.c, 0, 1, 0), "one waits, one may");
        assert_eq!(s.arrive(2, 0), Arrival::Queued);
        assert!(s.q.over_bounds(&s.c, 0, 1, 0));
        assert!(s.q.withdraw(&s.c, &mut s.w, 2, |_| {}));
        // The server's bound counts every group's waiters.
        assert_eq!(s.arrive(3, 1), Arrival::Queued);
        assert!(s.q.over_bounds(&s.c, 1, 0, 1));
        assert!(!s.q.over_bounds(&s.c, 1, 0, 2));
        assert!(!s.q.over_bounds(&s.c, 1, 0, 0), "0: no bound");
        assert!(s.q.withdraw(&s.c, &mut s.w, 3, |_| {}));
        assert_eq!(s.finish(0), vec![1]);
    }

    #[test]
    fn raising_the_limit_and_dispatching_admits_waiters() {
        let mut s = Server::new(1, 3);
        s.arrive(0, 0);
        s.arrive(1, 0);
        s.arrive(2, 0);
        s.c.set_max_active(3);
        let mut woken = vec![];
        s.q.dispatch(&s.c, &mut s.w, |p| woken.push(p));
        assert_eq!(woken, vec![1, 2]);
    }
    #[test]
    fn a_statement_whose_memory_does_not_fit_waits_and_one_needing_none_passes_it() {
        let mut s = Server::new(10, 4);
        s.q.set_memory_budget(100);
        assert_eq!(s.arrive_needing(0, 0, 60), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 0, 60), Arrival::Queued);
        assert_eq!(s.q.memory.waiting_kb, 60);
        // Same group, later, needs no memory: it takes nothing the first one waits for.
        assert_eq!(s.arrive_needing(2, 0, 0), Arrival::Admitted);
        assert_eq!(
            s.arrive_needing(3, 0, 40),
            Arrival::Queued,
            "arrival order in a group"
        );
        assert_eq!(s.q.memory.reserved_kb, 60);
        assert_eq!(s.finish_needing(0, 0), vec![1, 3], "60 + 40 fit in 100");
        assert!(s.take_admitted(1) && s.take_admitted(3));
        assert_eq!((s.q.memory.reserved_kb, s.q.memory.waiting_kb), (100, 0));
        assert_eq!(s.finish_needing(1, 0), vec![]);
        assert_eq!(s.q.groups[0].memory.reserved_kb, 40);
    }

    #[test]
    fn a_statement_larger_than_the_budget_runs_alone_and_holds_the_memory_it_waits_for() {
        let mut s = Server::new(10, 5);
        s.q.set_memory_budget(100);
        assert!(s.q.memory.exceeds(500) && !s.q.memory.exceeds(100));
        assert_eq!(s.arrive_needing(0, 0, 30), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 1, 500), Arrival::Queued);
        // Another group's statement would fit, but comes after the large one in stride
        // order: the memory is held for the large one. One needing none goes.
        assert_eq!(s.arrive_needing(2, 2, 30), Arrival::Queued);
        assert_eq!(s.arrive_needing(3, 2, 0), Arrival::Admitted);
        assert_eq!(
            s.finish_needing(0, 0),
            vec![1],
            "alone once the budget is empty"
        );
        assert!(s.take_admitted(1));
        assert_eq!(s.q.memory.reserved_kb, 500);
        assert_eq!(s.finish_needing(1, 1), vec![2]);
    }

    #[test]
    fn a_large_statement_that_stops_waiting_lets_in_those_it_held_back() {
        let mut s = Server::new(10, 4);
        s.q.set_memory_budget(100);
        assert_eq!(s.arrive_needing(0, 0, 50), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 0, 500), Arrival::Queued);
        assert_eq!(
            s.arrive_needing(2, 0, 30),
            Arrival::Queued,
            "behind it in its group"
        );
        let mut woken = vec![];
        assert!(s.q.withdraw(&s.c, &mut s.w, 1, |p| woken.push(p)));
        assert_eq!(woken, vec![2]);
    }

    #[test]
    fn a_group_budget_holds_back_its_own_statements_only() {
        let mut s = Server::new(10, 4);
        s.configure(1, 100, 0);
        s.q.configure_group(&s.c, 1, 100, 0, 50);
        assert_eq!(s.arrive_needing(0, 1, 40), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 1, 40), Arrival::Queued);
        assert_eq!(
            s.arrive_needing(2, 0, 40),
            Arrival::Admitted,
            "no server budget"
        );
        assert_eq!(s.q.groups[1].memory.waiting_kb, 40);
        assert_eq!(s.finish_needing(0, 1), vec![1]);
    }

    /// A budget of 100 kB; process 1 waited for 80 kB that process 0 held, and has just
    /// been admitted with them.
    fn admitted_to_memory_just_now() -> Server {
        let mut s = Server::new(10, 3);
        s.q.set_memory_budget(100);
        assert_eq!(s.arrive_needing(0, 0, 80), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 0, 80), Arrival::Queued);
        assert_eq!(s.finish_needing(0, 0), vec![1]);
        s
    }

    #[test]
    fn memory_admitted_to_a_statement_that_stopped_waiting_is_given_back() {
        let mut s = admitted_to_memory_just_now();
        // Its wait timed out just as it was admitted.
        assert!(!s.q.withdraw(&s.c, &mut s.w, 1, |_| {}));
        assert_eq!(s.finish(0), vec![]);
        assert_eq!((s.q.memory.reserved_kb, s.w[1].reserved_kb), (0, 0));
        // A queued statement that withdraws stops asking.
        assert_eq!(s.arrive_needing(2, 0, 80), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 0, 80), Arrival::Queued);
        assert!(s.q.withdraw(&s.c, &mut s.w, 1, |_| {}));
        assert_eq!(s.q.memory.waiting_kb, 0);
    }

    #[test]
    fn memory_goes_to_the_first_statement_waiting_for_it_whatever_its_groups_pass() {
        let mut s = Server::new(10, 8);
        s.q.set_memory_budget(1000);
        assert_eq!(s.arrive_needing(0, 1, 400), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 1, 400), Arrival::Admitted);
        assert_eq!(s.arrive_needing(2, 0, 800), Arrival::Queued);
        assert_eq!(s.arrive_needing(3, 1, 400), Arrival::Queued);
        // Statements of group 0 that need no memory pass its large one, and move the
        // group's pass past group 1's.
        for p in 4..8 {
            assert_eq!(s.arrive_needing(p, 0, 0), Arrival::Admitted);
            assert_eq!(s.finish(0), vec![]);
        }
        assert!(s.q.next_pass(0) > s.q.next_pass(1));
        assert_eq!(
            s.finish_needing(0, 1),
            vec![],
            "the 400 kB freed are held for process 2, which came before process 3"
        );
        assert_eq!(s.finish_needing(1, 1), vec![2]);
        assert!(s.take_admitted(2));
        assert_eq!(s.finish_needing(2, 0), vec![3]);
    }

    /// A budget of 1000 kB; process 0 of group `first.0` holds `first.1` kB, process 1
    /// of group 1 (limit 2) none; process 2 of group 1 waits for `kb` kB, then process 3
    /// of group `next.0` for `next.1` kB, which the memory kept for process 2 holds back.
    fn memory_kept_for_process_2(
        procs: usize,
        first: (usize, u64),
        kb: u64,
        next: (usize, u64),
    ) -> Server {
        let mut s = Server::new(10, procs);
        s.q.set_memory_budget(1000);
        s.configure(1, 100, 2);
        assert_eq!(s.arrive_needing(0, first.0, first.1), Arrival::Admitted);
        assert_eq!(s.arrive_needing(1, 1, 0), Arrival::Admitted);
        assert_eq!(s.arrive_needing(2, 1, kb), Arrival::Queued);
        assert_eq!(
            s.arrive_needing(3, next.0, next.1),
            Arrival::Queued,
            "the memory is kept for process 2"
        );
        s
    }

    #[test]
    fn memory_stays_kept_for_a_statement_whose_group_is_full() {
        let mut s = memory_kept_for_process_2(6, (0, 800), 400, (2, 100));
        // A statement of group 1 needing no memory passes process 2 and fills the
        // group; process 2's 400 kB stay kept for it, which came first.
        assert_eq!(s.arrive_needing(4, 1, 0), Arrival::Admitted);
        assert!(!s.take_admitted(3));
        // The 800 kB come free: process 3 gets 100 of what is beyond process 2's need.
        assert_eq!(s.finish_needing(0, 0), vec![3]);
        assert!(s.take_admitted(3));
        // Once its group has room, process 2 finds its memory there.
        assert_eq!(s.finish_needing(1, 1), vec![2]);
        assert_eq!(s.q.memory.reserved_kb, 500);
    }

    #[test]
    fn a_statement_needing_memory_is_not_passed_for_ever_by_its_groups_small_ones() {
        // Group 1 (limit 2) keeps receiving statements that need no memory; group 2's
        // statements need memory, as process 2 of group 1 does, and came after it. Every
        // time a place of group 1 frees, one of its small statements could take it while
        // process 2's memory does not fit yet; the memory group 2's statements free must
        // still go to process 2, which then gets the next place of its group.
        let mut s = memory_kept_for_process_2(8, (2, 700), 800, (2, 700));
        let mut small = 4;
        assert_eq!(
            s.arrive_needing(small, 1, 0),
            Arrival::Admitted,
            "passes process 2"
        );
        for _ in 0..20 {
            // A small statement of group 1 ends and another takes its place: process 2's
            // memory does not fit while process 0 holds 700 kB.
            assert_eq!(s.arrive_needing(7 - (small - 4), 1, 0), Arrival::Queued);
            let woken = s.finish_needing(small, 1);
            assert_eq!(woken, vec![7 - (small - 4)]);
            assert!(s.take_admitted(woken[0]));
            small = woken[0];
            assert!(
                !s.take_admitted(3),
                "process 3 would take process 2's memory"
            );
        }
        // Group 2's statement ends: its memory goes to nobody before process 2, which
        // is let in at its group's next free place.
        assert_eq!(s.finish_needing(0, 2), vec![]);
        assert_eq!(s.finish_needing(1, 1), vec![2]);
        assert!(s.take_admitted(2));
        assert_eq!(s.q.memory.reserved_kb, 800);
    }

    #[test]
    fn a_wait_that_runs_out_as_it_is_admitted_takes_the_admission_with_its_memory() {
        let mut s = admitted_to_memory_just_now();
        // Its timeout came just after the dispatch: it runs, and holds its 80 kB.
        assert!(s.q.stop_waiting(&s.c, &mut s.w, 1, |_| {}));
        assert_eq!((s.q.memory.reserved_kb, s.w[1].reserved_kb), (80, 80));
        assert_eq!(
            s.arrive_needing(2, 0, 80),
            Arrival::Queued,
            "the budget counts it"
        );
        // Still queued when it runs out: it leaves the queue and stops asking.
        assert!(!s.q.stop_waiting(&s.c, &mut s.w, 2, |_| {}));
        assert_eq!((s.q.memory.reserved_kb, s.q.memory.waiting_kb), (80, 0));
    }

    #[test]
    fn reserved_memory_stays_within_the_budget_unless_one_statement_runs_alone() {
        // Random arrivals, ends and withdrawals: the budget is exceeded only by a single
        // reservation, and every statement is admitted in the end.
        let procs = 12;
        let mut s = Server::new(6, procs);
        s.q.set_memory_budget(100);
        s.q.configure_group(&s.c, 1, 300, 2, 70);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        // Per process: None idle, Some((group, admitted)).
        let mut state: Vec<Option<(usize, bool)>> = vec![None; procs];
        let mut admitted_total = 0;
        for _ in 0..20_000 {
            let p = rand(procs as u64) as usize;
            match state[p] {
                None => {
                    let g = rand(3) as usize;
                    let kb = [0, 10, 40, 60, 150][rand(5) as usize];
                    let a = s.arrive_needing(p, g, kb);
                    state[p] = Some((g, a == Arrival::Admitted));
                }
                Some((g, false)) => {
                    if s.take_admitted(p) {
                        state[p] = Some((g, true));
                    } else if rand(20) == 0 && s.q.withdraw(&s.c, &mut s.w, p, |_| {}) {
                        state[p] = None;
                    }
                }
                Some((g, true)) => {
                    for q in s.finish_needing(p, g) {
                        assert!(matches!(state[q], Some((_, false))));
                    }
                    admitted_total += 1;
                    state[p] = None;
                }
            }
            let holders = s.w.iter().filter(|w| w.reserved_kb > 0).count();
            assert!(
                s.q.memory.reserved_kb <= 100 || holders == 1,
                "{:?}",
                s.q.memory
            );
            let in_group_1 =
                s.w.iter()
                    .filter(|w| w.reserved_kb > 0 && w.reserved_group == 1);
            assert!(s.q.groups[1].memory.reserved_kb <= 70 || in_group_1.count() == 1);
            let reserved: u64 = s.w.iter().map(|w| w.reserved_kb).sum();
            assert_eq!(reserved, s.q.memory.reserved_kb);
        }
        assert!(admitted_total > 1000, "{admitted_total}");
        // Drain: everything waiting gets in, some in each round (with memory held by
        // arrival, a round may admit only one).
        while state.iter().any(Option::is_some) {
            let mut progress = false;
            for (p, st) in state.iter_mut().enumerate() {
                if let Some((g, admitted)) = *st {
                    if admitted || s.take_admitted(p) {
                        s.finish_needing(p, g);
                        *st = None;
                        progress = true;
                    }
                }
            }
            assert!(progress, "nothing runs, and {state:?} wait");
        }
        assert!(state.iter().all(Option::is_none), "{state:?}");
        assert_eq!(
            s.q.memory,
            Budget {
                limit_kb: 100,
                ..Budget::default()
            }
        );
    }
}
