//! The hot path: taking, keeping and handing on CPU slots. No locks: every operation is
//! a bounded sequence of atomic operations plus retry loops that only repeat when
//! another process made progress in between.
//!
//! The invariant kept is that once the operations in flight have returned, a slot is
//! never free while a process waits. Both sides of a hand-off follow the same pattern —
//! publish, then look at the other side: a process that starts waiting publishes its
//! bit and then tries to take a free slot; a process that frees a slot publishes the
//! decrement of `running` and then looks for waiters. Whichever comes second in the
//! (sequentially consistent) order sees the other, so no slot is lost; and a waiter is
//! only ever handed a slot by clearing its bit (`fetch_and`), so none is granted twice.
//!
//! Operations that hand a slot to another process return that process: the caller sets
//! its latch, holding nothing.

use std::sync::atomic::Ordering::*;

use super::entries::*;
use super::{chaos, SchedShared};
use crate::ids::ProcId;

/// Whether the calling process may run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// It holds a slot: go on.
    Run,
    /// It waits: sleep on the latch until [`SchedShared::is_running`] says otherwise.
    Wait,
}

/// Result of [`SchedShared::acquire`] and [`SchedShared::end_slice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Outcome {
    /// Whether the caller runs or waits.
    pub turn: Turn,
    /// A process that was handed a slot and must be woken (`SetLatch`).
    pub wake: Option<ProcId>,
}

impl SchedShared {
    /// Process `p` (joined, idle) wants to run: it gets a free slot at once when nobody
    /// waits, or else queues and competes in stride order.
    pub fn acquire(&self, p: ProcId) -> Outcome {
        let pe = self.proc(p);
        let home = self.home_of(&self.queries()[pe.query.load(Relaxed) as usize]);
        // The node whose slot it tries for: its home, or, when its home has no slots
        // (it may take any node's, `eligible`), the first node with a free one.
        let node = if self.node(home).slots.load(SeqCst) == 0 {
            (0..self.node_count())
                .find(|&n| {
                    let entry = self.node(n);
                    entry.running.load(SeqCst) < entry.slots.load(SeqCst)
                })
                .unwrap_or(home)
        } else {
            home
        };
        if self.nobody_waits() {
            chaos::point();
            if self.try_take_slot(node) {
                pe.node.store(node as u32, Relaxed);
                pe.state.store(PROC_RUNNING, SeqCst);
                return Outcome {
                    turn: Turn::Run,
                    wake: None,
                };
            }
        }
        self.publish_waiter(p, false);
        chaos::point();
        let granted = self.fill_free_slot(node);
        self.outcome(p, granted)
    }

    /// Process `p`, holding a slot, ended a slice that used `used_ns` of CPU where it may
    /// not give the slot up (it holds row locks, or its interrupts are held): charge it to
    /// its query and group, as [`Self::end_slice`] does, and decide nothing.
    pub fn charge_kept_slice(&self, p: ProcId, used_ns: u64) {
        debug_assert!(self.is_running(p), "{p:?} ends a slice without a slot");
        self.charge(p, used_ns);
    }

    /// Process `p`, holding a slot, ended a slice that used `used_ns` of CPU: charge it
    /// to its query and group, then decide whether `p` goes on.
    ///
    /// When nobody waits and the slot count was not lowered, this is the yield check that
    /// does not switch: the charge plus three loads. Otherwise it is one scheduling
    /// decision: `p` competes with the waiters for its own slot, and keeps it if its
    /// `(group pass, query pass)` is still the lowest — and no other process of its own
    /// query waits, since members of one query take turns.
    pub fn end_slice(&self, p: ProcId, used_ns: u64) -> Outcome {
        debug_assert!(self.is_running(p), "{p:?} ends a slice without a slot");
        self.charge(p, used_ns);
        let pe = self.proc(p);
        // A request to end the slice early is answered by this check-in.
        pe.yield_asked.store(0, Relaxed);
        let n = pe.node.load(Relaxed) as usize;
        let node = self.node(n);
        if self.nobody_waits() && node.running.load(SeqCst) <= node.slots.load(SeqCst) {
            return Outcome {
                turn: Turn::Run,
                wake: None,
            };
        }
        self.rotate_past(p);
        // A process on a node other than its home got there by stealing: it keeps the
        // right to, so that it competes for the slot it holds like the node's own.
        let home = self.home_of(&self.queries()[pe.query.load(Relaxed) as usize]);
        self.publish_waiter(p, n != home);
        let granted = self.pass_slot_on(n);
        let outcome = self.outcome(p, granted);
        if outcome.turn == Turn::Wait {
            let pe = self.proc(p);
            pe.switches.store(pe.switches.load(Relaxed) + 1, Relaxed);
        }
        outcome
    }

    /// Process `p` stops running (end of the statement, or before it blocks on a lock,
    /// I/O or the client — psaroudakis2013 §5: a blocked holder should not keep a slot),
    /// charging the `used_ns` of CPU since its last check-in. Its slot goes to the best
    /// waiter, which is returned for waking.
    pub fn release(&self, p: ProcId, used_ns: u64) -> Option<ProcId> {
        debug_assert!(self.is_running(p), "{p:?} releases a slot it does not hold");
        self.charge(p, used_ns);
        let pe = self.proc(p);
        pe.yield_asked.store(0, Relaxed);
        let n = pe.node.load(Relaxed) as usize;
        pe.state.store(PROC_IDLE, SeqCst);
        self.pass_slot_on(n)
    }

    /// Whether process `p` holds a slot: the condition a paused process checks after each
    /// latch wake-up.
    #[inline]
    pub fn is_running(&self, p: ProcId) -> bool {
        self.proc(p).state.load(SeqCst) == PROC_RUNNING
    }

    /// Hands one free slot, if any, to the best waiter that may take it and returns
    /// that process for waking. Called in a loop after raising the slot counts or
    /// allowing a process to steal, and periodically by the scheduler worker as a safety
    /// net.
    pub fn dispatch(&self) -> Option<ProcId> {
        for n in 0..self.node_count() {
            if self.nobody_waits() {
                return None;
            }
            if let Some(w) = self.fill_free_slot(n) {
                return Some(w);
            }
        }
        None
    }

    /// Takes a free slot of node `n`, if there is one.
    fn try_take_slot(&self, n: usize) -> bool {
        let node = self.node(n);
        let slots = node.slots.load(SeqCst);
        let mut running = node.running.load(SeqCst);
        while running < slots {
            match node
                .running
                .compare_exchange_weak(running, running + 1, SeqCst, SeqCst)
            {
                Ok(_) => return true,
                Err(now) => running = now,
            }
        }
        false
    }

    /// After publishing a waiter (or raising the slot count): while a slot of node `n`
    /// is free, take it and give it to the best waiter that may run there. Returns the
    /// process served, which may be the caller itself.
    fn fill_free_slot(&self, n: usize) -> Option<ProcId> {
        loop {
            if !self.try_take_slot(n) {
                return None;
            }
            chaos::point();
            if let Some(w) = self.claim_best(n) {
                return Some(w);
            }
            // Nobody who may run on `n` waits after all: give the slot back, then look
            // once more, since such a waiter may have published after our search and
            // missed the slot we held.
            chaos::point();
            self.node(n).running.fetch_sub(1, SeqCst);
            chaos::point();
            if self.nobody_waits() || self.best_waiting_query(n).is_none() {
                return None;
            }
        }
    }

    /// The caller holds a slot of node `n` it no longer needs (it released it, or it
    /// competes for it as a waiter): hand it to the best waiter that may run there, or —
    /// over the node's capacity, or with nobody waiting for it — give it back.
    fn pass_slot_on(&self, n: usize) -> Option<ProcId> {
        let node = self.node(n);
        if node.running.load(SeqCst) <= node.slots.load(SeqCst) {
            if let Some(w) = self.claim_best(n) {
                return Some(w);
            }
        }
        chaos::point();
        node.running.fetch_sub(1, SeqCst);
        chaos::point();
        if self.nobody_waits() {
            return None;
        }
        self.fill_free_slot(n)
    }

    fn outcome(&self, p: ProcId, granted: Option<ProcId>) -> Outcome {
        let turn = if self.is_running(p) {
            Turn::Run
        } else {
            Turn::Wait
        };
        Outcome {
            turn,
            wake: granted.filter(|&w| w != p),
        }
    }
}
