//! What the tuner sees of the workload: one [`TraceRecord`] per CPU-scheduled statement,
//! and the conversion of a window of them into a workload the simulator replays
//! (wagner2021 §4 "Tuning Process"; docs/design.md §9).
//!
//! The paper's tracker "only logs the execution time spent on each of the active
//! resource groups"; pg_stride records when each statement arrived (before admission),
//! when it was admitted and finished, and the CPU its processes used. Statements still
//! running when the window is read are included with the CPU they have used so far
//! (docs/design.md §9: leaving them out would keep exactly the long queries out of the trace).

use crate::sim::QuerySpec;
use crate::trace_ring::{Words, RECORD_WORDS};

// A record is exactly one trace-ring slot's payload.
const _: () = assert!(std::mem::size_of::<TraceRecord>() == RECORD_WORDS * 8);

/// One statement as the tracer saw it. Plain integers, `#[repr(C)]`, fixed size and
/// `Copy`, so the extension can keep records in a shared-memory ring: 152 bytes, and a
/// sequence word per slot (a seqlock, to detect torn or overwritten records).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// When the statement started, before admission (CLOCK_MONOTONIC ns).
    pub arrival_ns: u64,
    /// When it was admitted; [`TraceRecord::PENDING`] while it waits.
    pub admit_ns: u64,
    /// When it finished; [`TraceRecord::PENDING`] while it runs.
    pub finish_ns: u64,
    /// CPU of the leader and its parallel workers, ns (so far, while it runs).
    pub cpu_ns: u64,
    /// PostgreSQL's query identifier, 0 if none was computed. Not used by the search;
    /// kept so that isolated latencies could later be estimated per query shape
    /// (docs/design.md §9).
    pub query_id: u64,
    /// Resource group index.
    pub group: u32,
    /// Processes that worked for it (the most that were joined at once), at least 1.
    pub procs: u32,
    /// Pinned static priority; 0: decaying.
    pub pinned_priority: u32,
    /// [`TraceRecord::ERROR`], [`TraceRecord::CANCELED`].
    pub flags: u32,
    /// The role that ran it (PostgreSQL's current user at its start): the trace shows
    /// its query id and times to that role and to readers of all statistics only.
    pub userid: u32,
    /// Where the statement's time went beyond the CPU it was charged: what a replay in
    /// the simulator does not see (`bench/sim_gap.py`).
    pub acct: Accounting,
}

/// What a statement's processes did besides running charged slices, summed over the
/// leader and its parallel workers: the measurements behind the comparison of a real
/// run with its replay in the simulator, which knows only arrival, charged CPU and
/// processes. Times in ns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// All the CPU the processes used for the statement: the leader from its arrival
    /// (before admission) to its end, a parallel worker from its start (fork, attach,
    /// restoring the leader's state) to its end. Minus `cpu_ns`: CPU used outside CPU
    /// slots, which the slots do not bound and the simulator does not replay.
    pub cpu_total_ns: u64,
    /// Time the processes waited for a slot (paused at a yield point or before their
    /// first slice).
    pub paused_ns: u64,
    /// Of `paused_ns`, the time between a slot being handed to a process and the process
    /// running: the hand-off's latency (latch, wake-up, the kernel's scheduling).
    pub handoff_ns: u64,
    /// Wall time the processes held slots. Minus the CPU they used in them: time a slot
    /// holder did not run, either runnable (`held_runqueue_ns`) or asleep (a lock, the
    /// client, a Gather waiting for its workers).
    pub held_ns: u64,
    /// Of `held_ns`, the time the processes were runnable but waited for a CPU, because
    /// processes without a slot (or the rest of the machine) had it (the kernel's
    /// schedstat `run_delay`; 0 without schedstats).
    pub held_runqueue_ns: u64,
    /// The time the processes were runnable but waited for a CPU, in all: from their
    /// start for the statement (the leader's ExecutorStart, a worker's joining) to its
    /// end, holding a slot or not (the kernel's schedstat `run_delay`; 0 without
    /// schedstats). Minus `held_runqueue_ns` and `paused_runqueue_ns`: time they waited
    /// for a CPU while running without a slot (before the first check-in, after
    /// ExecutorRun), where the slots do not order them.
    pub runqueue_ns: u64,
    /// Of `runqueue_ns`, the part before each process's first slot, outside its pauses
    /// (ExecutorStart and the first chunk of tuples, for a leader); the rest of the time
    /// runnable without a slot comes after its last slot (ExecutorRun's end to
    /// ExecutorEnd).
    pub runqueue_before_slot_ns: u64,
    /// Of `paused_ns`, the time the processes were runnable but waited for a CPU: a
    /// process that gave its slot up, on its way to sleep while the receiver ran on their
    /// CPU.
    pub paused_runqueue_ns: u64,
    /// CPU of slices beyond twice the target slice, summed: work the yield points did
    /// not cut, during which a waiting query cannot get the slot.
    pub long_slice_ns: u64,
    /// When the leader first held a slot (CLOCK_MONOTONIC ns), [`TraceRecord::PENDING`]
    /// if it never did.
    pub first_slot_ns: u64,
    /// Parallel workers the plan asked for, over all its Gathers (`procs` counts the
    /// granted ones).
    pub workers_planned: u32,
    /// Hand-offs counted in `handoff_ns`.
    pub handoffs: u32,
}

impl TraceRecord {
    /// `admit_ns` / `finish_ns` of a statement that has not got there yet.
    pub const PENDING: u64 = u64::MAX;
    /// Flag: the statement ended with an error.
    pub const ERROR: u32 = 1;
    /// Flag: the statement was canceled.
    pub const CANCELED: u32 = 2;

    /// Admission time, if admitted.
    pub fn admitted(&self) -> Option<u64> {
        (self.admit_ns != Self::PENDING).then_some(self.admit_ns)
    }

    /// Finish time, if finished.
    pub fn finished(&self) -> Option<u64> {
        (self.finish_ns != Self::PENDING).then_some(self.finish_ns)
    }

    /// The record as the payload of a [`trace_ring`](crate::trace_ring) slot.
    pub fn to_words(&self) -> Words {
        [
            self.arrival_ns,
            self.admit_ns,
            self.finish_ns,
            self.cpu_ns,
            self.query_id,
            (u64::from(self.group) << 32) | u64::from(self.procs),
            (u64::from(self.pinned_priority) << 32) | u64::from(self.flags),
            self.acct.cpu_total_ns,
            self.acct.paused_ns,
            self.acct.handoff_ns,
            self.acct.held_ns,
            self.acct.held_runqueue_ns,
            self.acct.runqueue_ns,
            self.acct.runqueue_before_slot_ns,
            self.acct.paused_runqueue_ns,
            self.acct.long_slice_ns,
            self.acct.first_slot_ns,
            (u64::from(self.acct.workers_planned) << 32) | u64::from(self.acct.handoffs),
            u64::from(self.userid),
        ]
    }

    /// The record a [`TraceRecord::to_words`] payload holds.
    pub fn from_words(words: &Words) -> TraceRecord {
        let [arrival_ns, admit_ns, finish_ns, cpu_ns, query_id, group_procs, pinned_flags, cpu_total_ns, paused_ns, handoff_ns, held_ns, held_runqueue_ns, runqueue_ns, runqueue_before_slot_ns, paused_runqueue_ns, long_slice_ns, first_slot_ns, planned_handoffs, userid] =
            *words;
        TraceRecord {
            arrival_ns,
            admit_ns,
            finish_ns,
            cpu_ns,
            query_id,
            group: (group_procs >> 32) as u32,
            procs: group_procs as u32,
            pinned_priority: (pinned_flags >> 32) as u32,
            flags: pinned_flags as u32,
            userid: userid as u32,
            acct: Accounting {
                cpu_total_ns,
                paused_ns,
                handoff_ns,
                held_ns,
                held_runqueue_ns,
                runqueue_ns,
                runqueue_before_slot_ns,
                paused_runqueue_ns,
                long_slice_ns,
                first_slot_ns,
                workers_planned: (planned_handoffs >> 32) as u32,
                handoffs: planned_handoffs as u32,
            },
        }
    }
}

/// Class label of a replayed statement that had finished when the trace was read.
pub const FINISHED: &str = "finished";
/// Class label of a replayed statement that was still running (or waiting for a slot)
/// when the trace was read.
pub const RUNNING: &str = "running";

/// How a traced statement was seen when the trace was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Still running, or waiting for a slot: replayed with the CPU it had used, as load;
    /// the tuner's objective leaves it out (see [`super::Objective`]).
    Running,
    /// Finished, with its latency if known (a trace knows it; a workload file not).
    Finished {
        /// Finish minus arrival, ns.
        latency_ns: Option<u64>,
    },
}

/// A window of the trace, ready to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The traced statements as a workload, sorted by arrival.
    pub queries: Vec<QuerySpec>,
    /// How each was seen, in the same order.
    pub seen: Vec<Seen>,
}

impl Trace {
    /// The statements that arrived in `[start_ns, end_ns)`: arrival relative to
    /// `start_ns`, CPU demand = the CPU they used (so far, for those still running),
    /// their group, processes and pinned priority, class [`FINISHED`] or [`RUNNING`].
    ///
    /// Statements that used no CPU yet (still waiting for admission) are left out: they
    /// put no load on the slots. Errors and cancellations are replayed like the rest:
    /// the CPU they used competed with the others.
    pub fn from_records(records: &[TraceRecord], start_ns: u64, end_ns: u64) -> Trace {
        let mut picked: Vec<&TraceRecord> = records
            .iter()
            .filter(|r| (start_ns..end_ns).contains(&r.arrival_ns) && r.cpu_ns > 0)
            .collect();
        picked.sort_by_key(|r| r.arrival_ns);
        let seen = picked
            .iter()
            .map(|r| match r.finished() {
                Some(f) => Seen::Finished {
                    latency_ns: Some(f.saturating_sub(r.arrival_ns)),
                },
                None => Seen::Running,
            })
            .collect();
        let queries = picked
            .iter()
            .map(|r| QuerySpec {
                arrival_ns: r.arrival_ns - start_ns,
                cpu_ns: r.cpu_ns,
                group: r.group,
                class: if r.finished().is_some() {
                    FINISHED
                } else {
                    RUNNING
                }
                .to_string(),
                procs: r.procs.max(1),
                pinned_priority: Some(r.pinned_priority).filter(|&p| p > 0),
                fingerprint: r.query_id,
            })
            .collect();
        Trace { queries, seen }
    }

    /// A workload taken as a trace in which every query finished, latencies unknown
    /// (`pg_stride-sim tune`).
    pub fn from_workload(queries: Vec<QuerySpec>) -> Trace {
        let seen = vec![Seen::Finished { latency_ns: None }; queries.len()];
        Trace { queries, seen }
    }

    /// The `n` statements that arrived last.
    pub fn recent(&self, n: usize) -> Trace {
        let from = self.queries.len().saturating_sub(n);
        Trace {
            queries: self.queries[from..].to_vec(),
            seen: self.seen[from..].to_vec(),
        }
    }

    /// Traced statements.
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// True for a trace of no statements.
    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_goes_through_the_ring_unchanged() {
        let ring = crate::trace_ring::OwnedRing::new(4).unwrap();
        let record = TraceRecord {
            arrival_ns: 1,
            admit_ns: 2,
            finish_ns: TraceRecord::PENDING,
            cpu_ns: 4,
            query_id: u64::MAX - 5,
            group: 63,
            procs: 3,
            pinned_priority: 10_000,
            flags: TraceRecord::ERROR | TraceRecord::CANCELED,
            userid: 16_384,
            acct: Accounting {
                cpu_total_ns: 5,
                paused_ns: 6,
                handoff_ns: 7,
                held_ns: 8,
                held_runqueue_ns: 12,
                runqueue_ns: 13,
                runqueue_before_slot_ns: 15,
                paused_runqueue_ns: 14,
                long_slice_ns: 9,
                first_slot_ns: TraceRecord::PENDING,
                workers_planned: u32::MAX,
                handoffs: 11,
            },
        };
        let ticket = ring.push(&record.to_words()).unwrap();
        assert_eq!(TraceRecord::from_words(&ring.read(ticket).unwrap()), record);
    }

    fn rec(arrival_ms: u64, cpu_ms: u64, finish_ms: Option<u64>) -> TraceRecord {
        TraceRecord {
            arrival_ns: arrival_ms * 1_000_000,
            admit_ns: arrival_ms * 1_000_000,
            finish_ns: finish_ms.map_or(TraceRecord::PENDING, |f| f * 1_000_000),
            cpu_ns: cpu_ms * 1_000_000,
            query_id: 0,
            group: 1,
            procs: 1,
            pinned_priority: 0,
            flags: 0,
            userid: 0,
            acct: Accounting::default(),
        }
    }

    #[test]
    fn a_record_is_plain_and_fills_its_slot() {
        assert_eq!(std::mem::size_of::<TraceRecord>(), 152);
        assert_eq!(std::mem::align_of::<TraceRecord>(), 8);
        let r = rec(1, 2, None);
        assert_eq!((r.admitted(), r.finished()), (Some(1_000_000), None));
    }

    #[test]
    fn window_selects_by_arrival_and_keeps_running_statements() {
        let mut waiting = rec(1_500, 0, None);
        waiting.admit_ns = TraceRecord::PENDING;
        let mut parallel = rec(1_200, 30, Some(1_250));
        parallel.procs = 3;
        parallel.pinned_priority = 500;
        parallel.flags = TraceRecord::CANCELED;
        let records = [
            rec(999, 50, Some(1_100)), // arrived before the window
            rec(1_300, 40, None),      // still running, 40 ms so far
            parallel,
            waiting,                    // no CPU yet
            rec(2_000, 5, Some(2_010)), // at the window's end: outside
        ];
        let t = Trace::from_records(&records, 1_000_000_000, 2_000_000_000);
        let w = &t.queries;
        assert_eq!(w.len(), 2);
        assert_eq!(
            t.seen,
            [
                Seen::Finished {
                    latency_ns: Some(50_000_000)
                },
                Seen::Running
            ]
        );
        assert_eq!(
            (
                w[0].arrival_ns,
                w[0].cpu_ns,
                w[0].procs,
                w[0].pinned_priority
            ),
            (200_000_000, 30_000_000, 3, Some(500))
        );
        assert_eq!((w[0].class.as_str(), w[0].group), (FINISHED, 1));
        assert_eq!(
            (w[1].arrival_ns, w[1].cpu_ns, w[1].class.as_str()),
            (300_000_000, 40_000_000, RUNNING)
        );
        assert_eq!(w[1].pinned_priority, None);
    }
}
