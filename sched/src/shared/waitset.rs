//! The set of waiting processes and the choice of who runs next.
//!
//! A waiting process sets its member bit in its query's `waiting` word, then its query's
//! bit in its group's query mask, then its group's bit in `waiting_groups` (bottom-up).
//! A process is handed a slot by whoever clears its member bit with `fetch_and`: that
//! read-modify-write is the claim, so two granters can never claim the same waiter, and a
//! waiter that withdraws races the granters on the same bit.
//!
//! The choice (wagner2021 §2.1, hierarchical per docs/design.md §1): among queries with
//! waiting members, the lowest `(group pass, query pass)`; within the query, the next
//! waiting member after the last one served (round robin, so that no worker of a parallel
//! query is passed over forever).

use std::cmp::Ordering;
use std::sync::atomic::Ordering::*;

use super::charge::bound;
use super::entries::*;
use super::{chaos, Policy, SchedShared};
use crate::ids::{ProcId, QueryId};
use crate::stride::pass_cmp;

/// After this many spins a process waiting for a granter's store yields the CPU.
const SPINS_BEFORE_YIELD: u32 = 64;

impl SchedShared {
    /// Publishes process `p` (joined to a query, holding no slot... or about to give one
    /// up) as waiting. Unless `keep_steal`, a wait starts at home: `p` loses the right to
    /// take other nodes' slots (see `nodes`).
    pub(super) fn publish_waiter(&self, p: ProcId, keep_steal: bool) {
        let pe = self.proc(p);
        let q = pe.query.load(Relaxed) as usize;
        let qe = &self.queries()[q];
        let g = qe.group.load(Relaxed) as usize;
        let bit = 1 << pe.member.load(Relaxed);
        if !keep_steal && qe.may_steal.load(Relaxed) & bit != 0 {
            qe.may_steal.fetch_and(!bit, SeqCst);
        }
        // A query that did not run for long (a cursor between its fetches) may trail its
        // group by more than the passes can order (stride.rs).
        let ge = &self.groups()[g];
        bound(&qe.pass, qe.pass.load(Relaxed), ge.vtime.load(Relaxed));
        bound(
            &ge.pass,
            ge.pass.load(Relaxed),
            self.group_vtime.0.load(Relaxed),
        );
        pe.state.store(PROC_WAITING, SeqCst);
        qe.waiting.fetch_or(bit, SeqCst);
        chaos::point();
        self.group_query_mask(g)[q / 64].fetch_or(1 << (q % 64), SeqCst);
        chaos::point();
        self.waiting_groups.0.fetch_or(1 << g, SeqCst);
    }

    /// Picks the waiting process that should run next on node `n`, claims it and marks
    /// it running there. The caller has a slot of `n` to give it. `None` when nobody
    /// that may run on `n` waits.
    pub(super) fn claim_best(&self, n: usize) -> Option<ProcId> {
        loop {
            let (g, q) = self.best_waiting_query(n)?;
            if let Some(p) = self.claim_in_query(g, q, n) {
                return Some(p);
            }
            // Its waiters were claimed or withdrew meanwhile: choose again.
        }
    }

    /// The waiting query with the lowest `(group pass, query pass)` among those with a
    /// member that may run on node `n`, cleaning stale hint bits met on the way.
    pub(super) fn best_waiting_query(&self, n: usize) -> Option<(usize, usize)> {
        let fifo = self.policy() == Policy::Fifo;
        let mut best: Option<(u64, u64, usize, usize)> = None;
        let mut groups = self.waiting_groups.0.load(SeqCst);
        while groups != 0 {
            let g = groups.trailing_zeros() as usize;
            groups &= groups - 1;
            let gkey = if fifo {
                0
            } else {
                self.groups()[g].pass.load(Relaxed)
            };
            if let Some((bg, ..)) = best {
                if pass_cmp(gkey, bg) == Ordering::Greater {
                    continue;
                }
            }
            let mut found = false;
            for (w, word) in self.group_query_mask(g).iter().enumerate() {
                let mut bits = word.load(SeqCst);
                while bits != 0 {
                    let q = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let qe = &self.queries()[q];
                    let waiting = qe.waiting.load(SeqCst);
                    if waiting == 0 || qe.group.load(Relaxed) as usize != g {
                        self.clear_query_hint(g, q);
                        continue;
                    }
                    found = true;
                    if self.eligible(qe, waiting, n) == 0 {
                        continue;
                    }
                    let qkey = qe.pass.load(Relaxed);
                    let better = match best {
                        None => true,
                        Some((bg, bq, ..)) => match pass_cmp(gkey, bg) {
                            Ordering::Less => true,
                            Ordering::Equal => pass_cmp(qkey, bq) == Ordering::Less,
                            Ordering::Greater => false,
                        },
                    };
                    if better {
                        best = Some((gkey, qkey, g, q));
                    }
                }
            }
            if !found {
                self.clear_group_hint(g);
            }
        }
        best.map(|(.., g, q)| (g, q))
    }

    /// Claims one waiting member of query `q` (group `g`) that may run on node `n` and
    /// marks its process running there.
    fn claim_in_query(&self, g: usize, q: usize, n: usize) -> Option<ProcId> {
        let qe = &self.queries()[q];
        loop {
            let waiting = qe.waiting.load(SeqCst);
            if waiting == 0 {
                self.clear_query_hint(g, q);
                return None;
            }
            let eligible = self.eligible(qe, waiting, n);
            if eligible == 0 {
                return None;
            }
            let start = qe.cursor.load(Relaxed) % 64;
            let member = (eligible.rotate_right(start).trailing_zeros() + start) % 64;
            let bit = 1u64 << member;
            let before = qe.waiting.fetch_and(!bit, SeqCst);
            if before & bit == 0 {
                continue; // claimed by another granter, or withdrawn
            }
            chaos::point();
            qe.cursor.store(member + 1, Relaxed);
            if before == bit {
                self.clear_query_hint(g, q);
            }
            let p = ProcId(qe.member_proc[member as usize].load(Relaxed));
            let pe = self.proc(p);
            pe.node.store(n as u32, Relaxed);
            pe.state.store(PROC_RUNNING, SeqCst);
            return Some(p);
        }
    }

    /// Makes the next search among the waiting members of `p`'s query start after `p`,
    /// so that `p`, which just ran, comes last.
    pub(super) fn rotate_past(&self, p: ProcId) {
        let pe = self.proc(p);
        let qe = &self.queries()[pe.query.load(Relaxed) as usize];
        qe.cursor.store(pe.member.load(Relaxed) + 1, Relaxed);
    }

    /// Clears query `q`'s bit in group `g`'s mask unless it still has waiters there
    /// (clear, then recheck and restore: a concurrent publisher is never lost).
    pub(super) fn clear_query_hint(&self, g: usize, q: usize) {
        let word = &self.group_query_mask(g)[q / 64];
        let bit = 1u64 << (q % 64);
        word.fetch_and(!bit, SeqCst);
        chaos::point();
        let qe = &self.queries()[q];
        if qe.waiting.load(SeqCst) != 0 && qe.group.load(Relaxed) as usize == g {
            word.fetch_or(bit, SeqCst);
            self.waiting_groups.0.fetch_or(1 << g, SeqCst);
        } else if self.group_query_mask(g).iter().all(|w| w.load(SeqCst) == 0) {
            self.clear_group_hint(g);
        }
    }

    /// Clears group `g`'s bit in `waiting_groups` unless its mask shows waiters.
    fn clear_group_hint(&self, g: usize) {
        self.waiting_groups.0.fetch_and(!(1 << g), SeqCst);
        chaos::point();
        if self.group_query_mask(g).iter().any(|w| w.load(SeqCst) != 0) {
            self.waiting_groups.0.fetch_or(1 << g, SeqCst);
        }
    }

    /// Withdraws waiting process `p` (it leaves while queued). If a granter claimed it
    /// first, `p` holds a slot now and passes it on; the result is then the process to
    /// wake.
    pub(super) fn withdraw(&self, p: ProcId) -> Option<ProcId> {
        let pe = self.proc(p);
        let q = QueryId(pe.query.load(Relaxed));
        let qe = self.query(q);
        let bit = 1u64 << pe.member.load(Relaxed);
        let before = qe.waiting.fetch_and(!bit, SeqCst);
        if before & bit != 0 {
            pe.state.store(PROC_IDLE, SeqCst);
            if before == bit {
                self.clear_query_hint(qe.group.load(Relaxed) as usize, q.index());
            }
            return None;
        }
        // A granter cleared the bit; its store of RUNNING follows within a few
        // instructions.
        let mut spins = 0;
        while pe.state.load(SeqCst) != PROC_RUNNING {
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        self.release(p, 0)
    }
}
