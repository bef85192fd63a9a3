//! Charging a slice: the stride accounting of wagner2021 §2.1 over two levels (groups,
//! then the queries of a group) and the priority decay of §3.2.
//!
//! Per slice of `used_ns`:
//!
//! * query pass += used · K / priority, group pass += used · K / weight;
//! * the group's global pass (where new queries of the group start) += used · K / Σ
//!   priorities of its queries, and the global pass over groups (where a group that gets
//!   work starts) += used · K / Σ weights of groups with queries — the `P_G += f·S_G` of
//!   §2.1 at each level;
//! * the query's CPU time grows; when it crosses a quantum boundary, the decayed priority
//!   replaces the current one (`fetch_min`, so concurrent charges by several processes of
//!   one query agree) and the group's priority sum follows.
//!
//! Every update is a single atomic add, min or max on a record of the query or its
//! group: processes of different queries do not write the same cache line, except for
//! the global pass over groups.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::*;

use super::entries::{QueryEntry, GROUP_D_START, OWN_DECAY_LAMBDA, OWN_DECAY_START};
use super::{Policy, SchedShared};
use crate::decay::{DecayParams, PriorityRange};
use crate::ids::ProcId;
use crate::predict::{self, StartPolicy};
use crate::stride::{bounded, charge, stride};

/// Adds `by` to `value`, returning the sum.
fn add(value: &AtomicU64, by: u64) -> u64 {
    value.fetch_add(by, Relaxed).wrapping_add(by)
}

/// Keeps `pass`, just made `now`, within [`crate::stride::MAX_LAG`] of `vtime`
/// ([`bounded`]). A charge another process of the query adds meanwhile may be lost: only
/// to a pass at the bound.
pub(super) fn bound(pass: &AtomicU64, now: u64, vtime: u64) {
    let within = bounded(now, vtime);
    if within != now {
        pass.store(within, Relaxed);
    }
}

impl SchedShared {
    pub(super) fn charge(&self, p: ProcId, used_ns: u64) {
        let pe = self.proc(p);
        pe.slices.store(pe.slices.load(Relaxed) + 1, Relaxed);
        let qe = &self.queries()[pe.query.load(Relaxed) as usize];
        let before = qe.cpu_ns.fetch_add(used_ns, Relaxed);
        let policy = self.policy();
        if policy == Policy::Fifo {
            return;
        }
        let ge = &self.groups()[qe.group.load(Relaxed) as usize];
        let q_pass = add(&qe.pass, charge(used_ns, qe.stride.load(Relaxed)));
        let g_pass = add(&ge.pass, charge(used_ns, ge.stride.load(Relaxed)));
        let vtime = add(
            &ge.vtime,
            charge(used_ns, stride(ge.prio_sum.load(Relaxed))),
        );
        let group_vtime = add(
            &self.group_vtime.0,
            charge(used_ns, stride(self.weight_sum.load(Relaxed))),
        );
        bound(&qe.pass, q_pass, vtime);
        bound(&ge.pass, g_pass, group_vtime);
        if policy == Policy::DecayingStride && qe.pinned.load(Relaxed) == 0 {
            self.apply_decay(qe, &ge.prio_sum, before, used_ns);
        }
    }

    /// The decay parameters for queries of group `g`: the global ones, with what the
    /// group sets itself in their place.
    fn group_decay(&self, g: usize) -> DecayParams {
        let ge = &self.groups()[g];
        let mut params = self.decay();
        let overrides = ge.decay_overrides.load(Relaxed);
        if overrides & OWN_DECAY_LAMBDA != 0 {
            params.lambda = f64::from_bits(ge.decay_lambda_bits.load(Relaxed));
        }
        if overrides & OWN_DECAY_START != 0 {
            params.d_start = ge.decay_start.load(Relaxed);
        }
        params
    }

    /// The CPU up to which a query of group `g` counts as short, µs
    /// ([`predict::short_threshold_us`] under the group's decay).
    pub fn short_threshold_us(&self, g: usize) -> f64 {
        predict::short_threshold_us(self.group_decay(g))
    }

    /// Where a query of group `g` predicted to use `cpu_us` of CPU starts
    /// ([`predict::start_policy`] under the group's priority range and decay).
    pub fn predicted_start(&self, g: usize, cpu_us: f64) -> StartPolicy {
        let ge = &self.groups()[g];
        let range = PriorityRange::new(ge.p0.load(Relaxed), ge.p_min.load(Relaxed));
        let params = self.group_decay(g);
        predict::start_policy(
            Some(cpu_us),
            range,
            params,
            predict::short_threshold_us(params),
        )
    }

    /// Lowers the query's priority if its CPU time crossed a quantum boundary.
    fn apply_decay(&self, qe: &QueryEntry, prio_sum: &AtomicU64, before: u64, used_ns: u64) {
        let quantum = self.quantum_ns.load(Relaxed);
        if before % quantum + used_ns < quantum {
            return; // still inside the same quantum
        }
        let range = PriorityRange {
            p0: qe.p0.load(Relaxed),
            p_min: qe.p_min.load(Relaxed),
        };
        if qe.priority.load(Relaxed) <= range.p_min {
            return; // already at the floor
        }
        let mut params = self.group_decay(qe.group.load(Relaxed) as usize);
        let own_start = qe.d_start.load(Relaxed);
        if own_start != GROUP_D_START {
            params.d_start = own_start;
        }
        let new = params.priority_after(range, (before + used_ns) / quantum);
        let old = qe.priority.fetch_min(new, Relaxed);
        if old > new {
            qe.stride.fetch_max(stride(new as u64), Relaxed);
            prio_sum.fetch_sub((old - new) as u64, Relaxed);
        }
    }
}
