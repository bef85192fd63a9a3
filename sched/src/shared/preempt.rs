//! Ending a lower-priority holder's slice early.
//!
//! A slot changes hands only when a holder checks in at the end of its slice (2 ms of CPU
//! by default), so a process that starts waiting waits for the rest of some holder's
//! slice even when its pass is far below theirs — a new statement behind two analytical
//! queries whose priority has decayed (wagner2021 §3.2). Such a waiter asks one holder to
//! check in at its next tuple instead: the holder of the lowest priority below the
//! waiter's, of those whose `(group pass, query pass)` is not below the waiter's (the
//! ones the waiter would win against at their slice end). That holder then ends its slice and
//! competes for its slot as usual, so the stride order decides, only sooner.
//!
//! Holders of equal priority (queries that have all decayed to `p_min`, or a policy
//! without decay) are never asked: among them the slice is the unit of fairness and of
//! cache locality.

use std::cmp::Ordering;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::*;

use super::entries::*;
use super::{Policy, SchedShared};
use crate::ids::ProcId;
use crate::stride::pass_cmp;

impl SchedShared {
    /// Waiting process `p` asks a holder to end its slice at its next tuple; returns the
    /// holder asked, if one qualified and was not asked already.
    pub fn ask_holder_to_yield(&self, p: ProcId) -> Option<ProcId> {
        if self.policy() != Policy::DecayingStride {
            return None;
        }
        let pe = self.proc(p);
        let qp = pe.query.load(Relaxed) as usize;
        let qe = self.queries().get(qp)?;
        let key = |qe: &QueryEntry| {
            let g = qe.group.load(Relaxed) as usize;
            (self.groups()[g].pass.load(Relaxed), qe.pass.load(Relaxed))
        };
        let mine = key(qe);
        let my_priority = qe.priority.load(Relaxed);
        let home = self.home_of(qe);
        let mut best: Option<(u32, (u64, u64), usize)> = None;
        // The scan stops once it met as many holders as the node has slots in use, so
        // that it reads little of the table when the holders are near its start. A
        // holder missed in a race with a hand-off costs at most one request too few.
        let mut holders_left = self.node(home).running.load(SeqCst);
        for (i, h) in self.procs().iter().enumerate() {
            if holders_left == 0 {
                break;
            }
            if h.state.load(SeqCst) != PROC_RUNNING || h.node.load(Relaxed) as usize != home {
                continue;
            }
            holders_left -= 1;
            if h.yield_asked.load(Relaxed) != 0 {
                continue;
            }
            let Some(hq) = self.queries().get(h.query.load(Relaxed) as usize) else {
                continue;
            };
            let priority = hq.priority.load(Relaxed);
            if priority >= my_priority {
                continue;
            }
            let theirs = key(hq);
            // At its check-in the holder is charged its slice first, so a waiter even
            // with it now wins then.
            if key_cmp(theirs, mine) == Ordering::Less {
                continue;
            }
            // The lowest priority first; among equals, the highest pass.
            let better = match best {
                None => true,
                Some((bp, bk, _)) => {
                    priority < bp || (priority == bp && key_cmp(theirs, bk) == Ordering::Greater)
                }
            };
            if better {
                best = Some((priority, theirs, i));
            }
        }
        let (.., i) = best?;
        let asked = &self.procs()[i].yield_asked;
        // Another waiter may have asked the same holder meanwhile: one request is enough.
        (asked.swap(1, AcqRel) == 0).then_some(ProcId(i as u32))
    }

    /// The flag a holder reads at every tuple: non-zero when it was asked to end its
    /// slice (see [`SchedShared::ask_holder_to_yield`]). The holder answers by swapping
    /// it back to 0 at its check-in; `end_slice` and `release` clear it too.
    pub fn yield_flag(&self, p: ProcId) -> &AtomicU32 {
        &self.proc(p).yield_asked
    }
}

/// `(group pass, query pass)` order, the order in which waiters are served.
fn key_cmp(a: (u64, u64), b: (u64, u64)) -> Ordering {
    pass_cmp(a.0, b.0).then_with(|| pass_cmp(a.1, b.1))
}
