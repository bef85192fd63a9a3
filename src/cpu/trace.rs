//! The tuner's trace (wagner2021 §4 "Tracking"; docs/design.md §9): a record per
//! CPU-scheduled statement in a shared-memory ring, written by the backend that
//! registered the statement's query when it ends, and the tuner's reading of a window
//! of it together with the statements still running.
//!
//! Only statements that joined CPU scheduling are traced: a statement that ends before
//! its first check-in never competes for a slot, so the scheduler's parameters do not
//! touch it, and the simulator leaves it out the same way.

use super::priority::priority_range;
use crate::{os, shmem};
use pg_stride_sched::shared::QuerySnapshot;
use pg_stride_sched::trace_ring::Missing;
use pg_stride_sched::tuner::{Accounting, TraceRecord};
use pg_stride_sched::QueryId;
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// When a statement arrived (before admission) and was admitted, CLOCK_MONOTONIC ns,
/// and, while statements are traced, the thread CPU clock and run delay at its arrival.
#[derive(Clone, Copy, Debug, Default)]
pub struct Arrival {
    pub arrival_ns: u64,
    pub admit_ns: u64,
    pub cpu_ns: Option<u64>,
    pub run_delay_ns: Option<u64>,
}

impl Arrival {
    /// A statement arrives now; it is admitted when the caller sets `admit_ns`.
    ///
    /// The CPU clocks are read only for the trace: the thread CPU clock is a system call
    /// (the vDSO serves only the wall clocks), as costly as the rest of what pg_stride
    /// does for a short OLTP statement.
    pub fn now() -> Arrival {
        let arrival_ns = os::monotonic_ns();
        let traced = enabled();
        Arrival {
            arrival_ns,
            admit_ns: arrival_ns,
            cpu_ns: traced.then(os::thread_cpu_ns),
            run_delay_ns: traced.then(os::thread_run_delay_ns),
        }
    }
}

/// What the statement's record says beyond its query entry's snapshot.
pub struct Ended {
    pub arrival: Arrival,
    pub query_id: u64,
    /// Processes that worked for it: the leader and its granted parallel workers.
    pub procs: u32,
    /// The static priority it ran with, if its group is pinned.
    pub pinned_priority: Option<u32>,
    /// Whether it ended with an error (cancel and timeouts included).
    pub failed: bool,
    /// What its processes measured.
    pub acct: Accounting,
}

/// Whether statements are traced: `pg_stride.trace` or the tuner is on.
pub fn enabled() -> bool {
    super::settings::tuner_on() || super::settings::traces()
}

/// Appends the record of a statement that ends, while statements are traced.
/// `snapshot` is its query entry as it leaves it.
pub fn record_end(shared: &shmem::Shared, ended: &Ended, snapshot: &QuerySnapshot) {
    // A statement that arrived before tracing was switched on has no CPU total.
    if !enabled() || ended.arrival.cpu_ns.is_none() {
        return;
    }
    let Some(ring) = shared.trace() else { return };
    let record = TraceRecord {
        arrival_ns: ended.arrival.arrival_ns,
        admit_ns: ended.arrival.admit_ns,
        finish_ns: os::monotonic_ns(),
        cpu_ns: snapshot.cpu_ns,
        query_id: ended.query_id,
        group: snapshot.group.0,
        procs: ended.procs.max(1),
        pinned_priority: ended.pinned_priority.unwrap_or(0),
        flags: if ended.failed { TraceRecord::ERROR } else { 0 },
        // SAFETY: a process-local read; the statement's role, as pg_stat_statements
        // takes it at ExecutorEnd.
        userid: u32::from(unsafe { pg_sys::GetUserId() }),
        acct: ended.acct,
    };
    // A record dropped because its slot was still being written is counted by the
    // ring and reported by the tuner.
    let _ = ring.push(&record.to_words());
}

fn pinned_priority(shared: &shmem::Shared, group: usize) -> u32 {
    shared
        .groups
        .settings_of(group)
        .filter(|s| s.pinned)
        .map_or(0, |s| priority_range(&s).p0)
}

/// A window of the trace as the tuner reads it.
pub struct Window {
    /// Statements that arrived in the window: finished ones from the ring, running
    /// ones with the CPU they used so far.
    pub records: Vec<TraceRecord>,
    /// Records written since `from_ticket` that were overwritten before this reading.
    pub overwritten: u64,
    /// Records the ring's writers dropped so far (a slot still being written), in all.
    pub dropped: u64,
    /// The ring's head at this reading: pass it as `from_ticket` next time.
    pub next_ticket: u64,
}

/// Reads the statements that arrived since `start_ns` (CLOCK_MONOTONIC): the ring's
/// records and the statements still running. `from_ticket` is the previous reading's
/// `next_ticket`, to count records lost in between.
pub fn read_window(shared: &shmem::Shared, start_ns: u64, from_ticket: u64) -> Window {
    let mut records = Vec::new();
    let (mut overwritten, mut dropped) = (0, 0);
    let mut next_ticket = from_ticket;
    if let Some(ring) = shared.trace() {
        let head = ring.head();
        next_ticket = head;
        dropped = ring.lost();
        for ticket in head.saturating_sub(ring.capacity())..head {
            match ring.read(ticket) {
                Ok(words) => {
                    let r = TraceRecord::from_words(&words);
                    if r.arrival_ns >= start_ns {
                        records.push(r);
                    }
                }
                // Written after its slot was read, or still being written: the next
                // reading has it.
                Err(Missing::NotYetWritten | Missing::Incomplete) => {}
                Err(Missing::Overwritten) if ticket >= from_ticket => overwritten += 1,
                Err(Missing::Overwritten) => {}
            }
        }
        // Tickets that were overwritten before this reading reached their slots.
        overwritten += head
            .saturating_sub(ring.capacity())
            .saturating_sub(from_ticket);
    }
    records.extend(running(shared, start_ns));
    Window {
        records,
        overwritten,
        dropped,
        next_ticket,
    }
}

/// The CPU-scheduled statements running now that arrived since `start_ns`, with the CPU
/// they used so far and no finish time.
fn running(shared: &shmem::Shared, start_ns: u64) -> Vec<TraceRecord> {
    let Some(sched) = shared.sched() else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for (procno, entry) in shared.procs().iter().enumerate() {
        let query = entry.cpu_query.load(Ordering::Acquire);
        if query == 0 || !shared.is_live(procno) {
            continue;
        }
        let arrival_ns = entry.query_arrival_ns.load(Ordering::Relaxed);
        let Some(snapshot) = sched.query_snapshot(QueryId(query - 1)) else {
            continue;
        };
        if arrival_ns < start_ns {
            continue;
        }
        records.push(TraceRecord {
            arrival_ns,
            admit_ns: entry.query_admit_ns.load(Ordering::Relaxed),
            finish_ns: TraceRecord::PENDING,
            cpu_ns: snapshot.cpu_ns,
            query_id: 0,
            group: snapshot.group.0,
            procs: 1 + entry.workers_granted.load(Ordering::Relaxed),
            pinned_priority: pinned_priority(shared, snapshot.group.0 as usize),
            flags: 0,
            userid: 0,
            acct: Accounting::default(),
        });
    }
    records
}
