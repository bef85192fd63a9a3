//! The concurrency hint and parallel-worker grants (psaroudakis2013 §6) on the shared
//! region: the scheduler worker samples, every backend starting a Gather asks.

use std::sync::atomic::Ordering::*;

use super::SchedShared;
use crate::hint::{grant_workers, next_hint};
use crate::ids::GroupId;

/// What else wants the CPU slots when a Gather asks for workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// The leader scans beside its workers: it takes one of the free slots itself.
    pub leader_runs: bool,
    /// Statements of other processes executing or queued now. Slots are free for this
    /// Gather only beyond the larger of these and the slots held: between statements
    /// (parse, plan, ExecutorStart, the client's round trip) a busy server's slots look
    /// free for a moment, and a worker granted then would only wait for one.
    pub elsewhere: u32,
    /// The statement is predicted short ([`crate::predict`]): under load (a slot held, or
    /// another statement executing or queued) it gets no workers, whose start-up would
    /// cost about what they save and whose slots others need.
    pub predicted_short: bool,
}

impl SchedShared {
    /// Folds the current number of free slots into the hint with weight `alpha` (the
    /// paper's `a`, [`crate::hint::HINT_ALPHA`]), `statements` being the number of
    /// statements executing or queued now. The scheduler worker calls this every
    /// [`crate::hint::HINT_INTERVAL_MS`]; only it writes the hint.
    ///
    /// A slot is free when no statement wants it: the parallel workers a statement was
    /// granted are not counted against it, so that a client alone on the server finds
    /// the slots beside its own statement free, however many workers its previous
    /// statements ran with; and a server with more statements than slots reads none free,
    /// however briefly its slots look free between two statements. The grant bounds the
    /// workers by the slots held at that moment as well ([`Demand`]).
    pub fn sample_hint(&self, alpha: f64, statements: u32) -> f64 {
        let slots = self.cpu_slots();
        let free = slots.saturating_sub(statements);
        let hint = next_hint(self.hint(), free, slots, alpha);
        self.hint_bits.store(hint.to_bits(), Relaxed);
        hint
    }

    /// The current hint: recent average of free CPU slots.
    pub fn hint(&self) -> f64 {
        f64::from_bits(self.hint_bits.load(Relaxed))
    }

    /// Number of parallel workers a Gather of group `g` that planned `requested` may
    /// launch: limited by the hint, the slots free now (see [`Demand`]) and the group's
    /// `max_workers`, and reserved against
    /// the group's cap until [`SchedShared::return_workers`].
    pub fn reserve_workers(&self, g: GroupId, requested: u32, demand: Demand) -> u32 {
        if demand.predicted_short && (demand.elsewhere > 0 || self.running() > 0) {
            return 0;
        }
        let ge = self.group(g);
        let cap = ge.max_workers.load(Relaxed);
        let hint = self.hint();
        let free_now = self
            .cpu_slots()
            .saturating_sub(self.running().max(demand.elsewhere))
            .saturating_sub(u32::from(demand.leader_runs));
        let mut in_use = ge.workers_in_use.load(Relaxed);
        loop {
            let grant = grant_workers(requested, hint, free_now, cap.saturating_sub(in_use));
            if grant == 0 {
                return 0;
            }
            match ge
                .workers_in_use
                .compare_exchange_weak(in_use, in_use + grant, AcqRel, Relaxed)
            {
                Ok(_) => return grant,
                Err(now) => in_use = now,
            }
        }
    }

    /// Returns workers reserved by [`SchedShared::reserve_workers`] (the Gather ended,
    /// or launched fewer than granted).
    pub fn return_workers(&self, g: GroupId, n: u32) {
        let ge = self.group(g);
        let _ = ge
            .workers_in_use
            .fetch_update(AcqRel, Relaxed, |v| Some(v.saturating_sub(n)));
    }

    /// Workers currently reserved by group `g`.
    pub fn workers_in_use(&self, g: GroupId) -> u32 {
        self.group(g).workers_in_use.load(Relaxed)
    }
}
