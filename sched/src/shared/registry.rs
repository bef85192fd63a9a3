//! The rare path: configuring groups, registering queries, processes joining and leaving.
//!
//! These run at ExecutorStart / ExecutorEnd and on group changes, not per slice. They
//! are safe to run concurrently with the hot path. `configure_group`, `register_query`
//! and `unregister_query` keep the sum of active group weights, so calls that touch the
//! same group must not overlap: **the caller holds the registration lock** (the
//! extension's admission LWLock). `join` and `leave` need no lock.

use std::sync::atomic::Ordering::*;

use super::entries::*;
use super::{SchedError, SchedShared, MAX_SLOT_NODES};
use crate::decay::PriorityRange;
use crate::ids::{GroupId, ProcId, QueryId, NONE};
use crate::predict::StartPolicy;
use crate::stride::stride;

/// A group's settings (docs/design.md §1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupConfig {
    /// CPU weight against other groups; 0 counts as 1.
    pub weight: u32,
    /// Initial and lowest priority of the group's queries (wagner2021 §3.2 "per-user
    /// priority").
    pub priority: PriorityRange,
    /// The group's own decay rate λ; `None`: the global one.
    pub decay_lambda: Option<f64>,
    /// The group's own `d_start`; `None`: the global one.
    pub decay_start: Option<u32>,
    /// Cap on the parallel workers granted to the group's queries at once.
    pub max_workers: u32,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            weight: 100,
            priority: PriorityRange::default(),
            decay_lambda: None,
            decay_start: None,
            max_workers: u32::MAX,
        }
    }
}

/// Options of one query.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryOptions {
    /// A static priority instead of the decaying one (wagner2021 §3.2 custom priorities
    /// (1)), instead of its group's range.
    pub pinned_priority: Option<u32>,
    /// Home node, whose CPU slots its processes take ([`SchedShared::choose_home`]; 0
    /// when the slots are not split by node).
    pub home: u32,
    /// Where its decaying priority starts, from a prediction of its CPU
    /// ([`crate::predict::start_policy`]): an initial priority within its group's range
    /// and its own `d_start`. `None`: the group's. Ignored with `pinned_priority`.
    pub start: Option<StartPolicy>,
}

/// A read-only view of a query entry, for the extension's views.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuerySnapshot {
    /// Group of the query.
    pub group: GroupId,
    /// Current priority.
    pub priority: u32,
    /// Current pass.
    pub pass: u64,
    /// CPU charged, ns.
    pub cpu_ns: u64,
    /// Processes joined.
    pub members: u32,
    /// Processes waiting for a slot.
    pub waiting: u32,
    /// Home node.
    pub home: u32,
}

/// A read-only view of a process entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcSnapshot {
    /// Query joined.
    pub query: Option<QueryId>,
    /// Holds a slot.
    pub running: bool,
    /// Waits for a slot.
    pub waiting: bool,
    /// Slices charged.
    pub slices: u64,
    /// Slices after which it handed its slot to another process.
    pub switches: u64,
    /// Node of the slot it holds, if it holds one.
    pub node: Option<u32>,
}

impl SchedShared {
    /// Sets a group's weight, priority range, decay and worker cap. Queries already registered
    /// keep their priority range. Caller holds the registration lock.
    pub fn configure_group(&self, g: GroupId, config: GroupConfig) {
        let ge = self.group(g);
        let weight = config.weight.max(1);
        let old = ge.weight.swap(weight, Relaxed);
        ge.stride.store(stride(weight as u64), Relaxed);
        if ge.active_queries.load(Relaxed) > 0 {
            self.weight_sum.fetch_add(weight as u64, Relaxed);
            self.weight_sum.fetch_sub(old as u64, Relaxed);
        }
        let range = PriorityRange::new(config.priority.p0, config.priority.p_min);
        ge.p0.store(range.p0, Relaxed);
        ge.p_min.store(range.p_min, Relaxed);
        let lambda = config.decay_lambda.map(|l| l.clamp(0.0, 1.0));
        ge.decay_lambda_bits
            .store(lambda.unwrap_or(0.0).to_bits(), Relaxed);
        ge.decay_start
            .store(config.decay_start.unwrap_or(0), Relaxed);
        let overrides = if lambda.is_some() {
            OWN_DECAY_LAMBDA
        } else {
            0
        } | if config.decay_start.is_some() {
            OWN_DECAY_START
        } else {
            0
        };
        ge.decay_overrides.store(overrides, Relaxed);
        ge.max_workers.store(config.max_workers, Relaxed);
    }

    /// A group's settings.
    pub fn group_config(&self, g: GroupId) -> GroupConfig {
        let ge = self.group(g);
        GroupConfig {
            weight: ge.weight.load(Relaxed),
            priority: PriorityRange::new(ge.p0.load(Relaxed), ge.p_min.load(Relaxed)),
            decay_lambda: (ge.decay_overrides.load(Relaxed) & OWN_DECAY_LAMBDA != 0)
                .then(|| f64::from_bits(ge.decay_lambda_bits.load(Relaxed))),
            decay_start: (ge.decay_overrides.load(Relaxed) & OWN_DECAY_START != 0)
                .then(|| ge.decay_start.load(Relaxed)),
            max_workers: ge.max_workers.load(Relaxed),
        }
    }

    /// Registers a query in group `g` and returns its entry. The query starts at the
    /// group's global pass (wagner2021 §2.1: not at 0, which would let it run ahead of
    /// everyone); a group that had no queries starts at the global pass over groups.
    /// Under FIFO the pass is the arrival ticket. Caller holds the registration lock.
    pub fn register_query(&self, g: GroupId, options: QueryOptions) -> Result<QueryId, SchedError> {
        let ge = self.group(g);
        let q = self
            .queries()
            .iter()
            .position(|qe| {
                qe.state.load(Relaxed) == QUERY_FREE
                    && qe
                        .state
                        .compare_exchange(QUERY_FREE, QUERY_ACTIVE, AcqRel, Relaxed)
                        .is_ok()
            })
            .ok_or(SchedError::NoFreeQueryEntry)?;
        let qe = &self.queries()[q];
        let mut range = PriorityRange::new(ge.p0.load(Relaxed), ge.p_min.load(Relaxed));
        let start = options.start.filter(|_| options.pinned_priority.is_none());
        if let Some(s) = start {
            range.p0 = s.p0.clamp(range.p_min, range.p0);
        }
        let priority = options.pinned_priority.map_or(range.p0, |p| p.max(1));
        qe.group.store(g.0, Relaxed);
        qe.p0.store(range.p0, Relaxed);
        qe.d_start.store(
            start.map_or(GROUP_D_START, |s| s.d_start.min(GROUP_D_START - 1)),
            Relaxed,
        );
        qe.p_min.store(range.p_min, Relaxed);
        qe.pinned
            .store(options.pinned_priority.is_some() as u32, Relaxed);
        qe.priority.store(priority, Relaxed);
        qe.stride.store(stride(priority as u64), Relaxed);
        qe.cpu_ns.store(0, Relaxed);
        qe.cursor.store(0, Relaxed);
        qe.members.store(0, Relaxed);
        qe.members_used.store(0, Relaxed);
        qe.waiting.store(0, SeqCst);
        qe.may_steal.store(0, SeqCst);
        let home = options.home as usize % MAX_SLOT_NODES;
        qe.home.store(home as u32, Relaxed);
        self.node(home).homed.fetch_add(1, Relaxed);

        self.group_gains(ge, priority);
        let pass = match self.policy() {
            super::Policy::Fifo => self.fifo_ticket.fetch_add(1, Relaxed),
            _ => ge.vtime.load(Relaxed),
        };
        qe.pass.store(pass, Release);
        Ok(QueryId(q as u32))
    }

    /// Frees a query entry. Every process must have left it. Caller holds the
    /// registration lock.
    pub fn unregister_query(&self, q: QueryId) -> Result<(), SchedError> {
        let qe = self.query(q);
        if qe.members.load(Acquire) != 0 {
            return Err(SchedError::QueryInUse);
        }
        let g = GroupId(qe.group.load(Relaxed));
        let ge = self.group(g);
        self.node(qe.home.load(Relaxed) as usize)
            .homed
            .fetch_sub(1, Relaxed);
        self.group_loses(ge, qe.priority.load(Relaxed));
        // Drop a stale "has waiters" hint so that a reuse of the entry in another group
        // is not found under this one.
        self.clear_query_hint(g.index(), q.index());
        qe.state.store(QUERY_FREE, Release);
        Ok(())
    }

    /// Whether [`Self::move_query`] could move `q` now: it has one member and no waiter.
    /// Read without the registration lock, so that a process whose query has parallel
    /// workers does not take it at each check-in only to be refused; `move_query` checks
    /// again under the lock.
    pub fn may_move(&self, q: QueryId) -> bool {
        let qe = self.query(q);
        qe.members.load(Acquire) == 1 && qe.waiting.load(SeqCst) == 0
    }

    /// Moves query `q` to group `g` (a runaway-query rule's `move`): from now on it is
    /// charged to `g`, shares `g`'s weight and takes `g`'s priority range, its current
    /// priority clamped into it (or `pinned_priority`); its pass restarts at `g`'s global
    /// pass, as an arrival's. Caller holds the registration lock, and `q` has one
    /// member, the caller's process, which is not waiting: no other process charges the
    /// query or publishes it as waiting meanwhile. `Err(QueryInUse)` otherwise.
    pub fn move_query(
        &self,
        q: QueryId,
        g: GroupId,
        pinned_priority: Option<u32>,
    ) -> Result<(), SchedError> {
        let qe = self.query(q);
        let old = GroupId(qe.group.load(Relaxed));
        if old == g {
            return Ok(());
        }
        if !self.may_move(q) {
            return Err(SchedError::QueryInUse);
        }
        let (from, to) = (self.group(old), self.group(g));
        self.group_loses(from, qe.priority.load(Relaxed));
        self.clear_query_hint(old.index(), q.index());
        let range = PriorityRange::new(to.p0.load(Relaxed), to.p_min.load(Relaxed));
        let priority = match pinned_priority {
            Some(p) => p.max(1),
            None => qe.priority.load(Relaxed).clamp(range.p_min, range.p0),
        };
        qe.p0.store(range.p0, Relaxed);
        qe.p_min.store(range.p_min, Relaxed);
        qe.pinned.store(pinned_priority.is_some() as u32, Relaxed);
        qe.priority.store(priority, Relaxed);
        qe.stride.store(stride(priority as u64), Relaxed);
        self.group_gains(to, priority);
        let pass = match self.policy() {
            super::Policy::Fifo => qe.pass.load(Relaxed),
            _ => to.vtime.load(Relaxed),
        };
        qe.pass.store(pass, Relaxed);
        qe.group.store(g.0, SeqCst);
        Ok(())
    }

    /// Group `ge` gains a query of `priority`: a group that had none joins at the global
    /// pass over groups (wagner2021 §2.1), and its weight counts in the sum.
    fn group_gains(&self, ge: &GroupEntry, priority: u32) {
        if ge.active_queries.fetch_add(1, AcqRel) == 0 {
            ge.pass.store(self.group_vtime.0.load(Relaxed), Relaxed);
            self.weight_sum
                .fetch_add(ge.weight.load(Relaxed) as u64, Relaxed);
        }
        ge.prio_sum.fetch_add(priority as u64, Relaxed);
    }

    /// Group `ge` loses a query of `priority`; a group left with none stops counting in
    /// the weight sum.
    fn group_loses(&self, ge: &GroupEntry, priority: u32) {
        ge.prio_sum.fetch_sub(priority as u64, Relaxed);
        if ge.active_queries.fetch_sub(1, AcqRel) == 1 {
            self.weight_sum
                .fetch_sub(ge.weight.load(Relaxed) as u64, Relaxed);
        }
    }

    /// Process `p` starts working for query `q` (the leader after `register_query`, a
    /// parallel worker on start). The process holds no slot afterwards: it calls
    /// [`SchedShared::acquire`] before running.
    pub fn join(&self, p: ProcId, q: QueryId) -> Result<(), SchedError> {
        let qe = self.query(q);
        let mut used = qe.members_used.load(Relaxed);
        let member = loop {
            if used == u64::MAX {
                return Err(SchedError::QueryFull);
            }
            let m = (!used).trailing_zeros();
            match qe
                .members_used
                .compare_exchange_weak(used, used | 1 << m, AcqRel, Relaxed)
            {
                Ok(_) => break m,
                Err(now) => used = now,
            }
        };
        qe.member_proc[member as usize].store(p.0, Relaxed);
        qe.members.fetch_add(1, AcqRel);
        let pe = self.proc(p);
        pe.member.store(member, Relaxed);
        pe.query.store(q.0, Relaxed);
        pe.state.store(PROC_IDLE, SeqCst);
        Ok(())
    }

    /// Process `p` stops working for its query: at the end of the statement, on error,
    /// or — called by the scheduler worker — after the process died (docs/design.md §4 rule
    /// 8). A held slot is passed on and a pending wait is withdrawn; the result is the
    /// process to wake, if the slot went to one.
    pub fn leave(&self, p: ProcId) -> Option<ProcId> {
        let pe = self.proc(p);
        let q = pe.query.load(Relaxed);
        if q == NONE {
            return None;
        }
        let wake = self.stop(p, 0);
        let qe = self.query(QueryId(q));
        let member = pe.member.load(Relaxed);
        pe.query.store(NONE, Relaxed);
        qe.members_used.fetch_and(!(1u64 << member), AcqRel);
        qe.members.fetch_sub(1, AcqRel);
        wake
    }

    /// Process `p` stops competing for slots but stays a member of its query: it gives
    /// back the slot it holds, charging the `used_ns` of CPU since its last check-in, or
    /// withdraws the wait it is in. For a process whose run an error cut short while it
    /// goes on working for the query (another statement of it stays open). Returns the
    /// process handed the slot, for waking.
    pub fn stop(&self, p: ProcId, used_ns: u64) -> Option<ProcId> {
        match self.proc(p).state.load(SeqCst) {
            PROC_RUNNING => self.release(p, used_ns),
            PROC_WAITING => self.withdraw(p),
            _ => None,
        }
    }

    /// The query that process `p` works for.
    pub fn query_of(&self, p: ProcId) -> Option<QueryId> {
        match self.proc(p).query.load(Relaxed) {
            NONE => None,
            q => Some(QueryId(q)),
        }
    }

    /// The group of the query that process `p` works for.
    pub fn group_of(&self, p: ProcId) -> Option<GroupId> {
        let q = self.query_of(p)?;
        Some(GroupId(self.query(q).group.load(Relaxed)))
    }

    /// A view of query `q`, or `None` when the entry is free.
    pub fn query_snapshot(&self, q: QueryId) -> Option<QuerySnapshot> {
        let qe = self.query(q);
        if qe.state.load(Acquire) != QUERY_ACTIVE {
            return None;
        }
        Some(QuerySnapshot {
            group: GroupId(qe.group.load(Relaxed)),
            priority: qe.priority.load(Relaxed),
            pass: qe.pass.load(Relaxed),
            cpu_ns: qe.cpu_ns.load(Relaxed),
            members: qe.members.load(Relaxed),
            waiting: qe.waiting.load(Relaxed).count_ones(),
            home: self.home_of(qe) as u32,
        })
    }

    /// The priority of the query process `p` works for, while `p` holds a slot.
    pub fn holder_priority(&self, p: ProcId) -> Option<u32> {
        let pe = self.proc(p);
        if pe.state.load(SeqCst) != PROC_RUNNING {
            return None;
        }
        let qe = self.queries().get(pe.query.load(Relaxed) as usize)?;
        Some(qe.priority.load(Relaxed))
    }

    /// A view of process `p`.
    pub fn proc_snapshot(&self, p: ProcId) -> ProcSnapshot {
        let pe = self.proc(p);
        let state = pe.state.load(SeqCst);
        ProcSnapshot {
            query: self.query_of(p),
            running: state == PROC_RUNNING,
            waiting: state == PROC_WAITING,
            slices: pe.slices.load(Relaxed),
            switches: pe.switches.load(Relaxed),
            node: (state == PROC_RUNNING).then(|| pe.node.load(Relaxed)),
        }
    }
}
