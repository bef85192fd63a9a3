//! pg_stride's scheduling decisions, with no PostgreSQL types: stride scheduling,
//! decaying priorities, adaptive slices and the concurrency hint. The extension places
//! the shared-memory structure defined here into PostgreSQL's shared memory; the
//! simulator and the tests run the very same code on a heap copy.
//!
//! * [`stride`] — fixed-point stride and pass arithmetic (wagner2021 §2.1).
//! * [`decay`] — decaying priorities (wagner2021 §3.2).
//! * [`slice`](mod@slice) — adaptive slice length per process (wagner2021 §3.1).
//! * [`stall`] — telling a slot holder kept off its CPU from one that runs.
//! * [`pin_word`] — the word naming the CPU a process is pinned to, safe against ABA.
//! * [`hint`] — concurrency hint and worker grant rule (psaroudakis2013 §6).
//! * [`predict`] — a statement's CPU predicted from its fingerprint's history, and its start.
//! * [`admission`] — admission limits, queue and leases (wagner2021 §2.3).
//! * [`groups`] — resource-group settings, their limits and directory slots.
//! * [`group_tag`] — the group a statement names in a comment before its first word.
//! * [`fingerprint`] — a statement's fingerprint from its text, constants left out.
//! * [`long_runs`] — the statements planned tiny that ran long, shared by every backend.
//! * [`histogram`] — the queue-time histogram, its quantiles and cumulative counts.
//! * [`shared`] — the lock-free shared-memory scheduler ([`SchedShared`]).
//! * [`sim`] — discrete-event simulator and workload generator over [`SchedShared`].
//! * [`trace_ring`] — the lock-free ring of per-statement records the tuner reads.
//! * [`tuner`] — the self-tuner's trace records and search over [`sim`] (wagner2021 §4).
//! * [`numa`] — NUMA topology and placement rules (psaroudakis2016).
//! * [`pool`](mod@pool) — the pool's checked server releases and worker-slot caps.
//! * [`retry`] — when the groups loader tries a failed read of its table again.
//!
//! # How the extension drives the shared form
//!
//! One [`SchedShared`] region lives in PostgreSQL's shared memory. It holds only integers
//! and atomics, addressed by index — processes by `pgprocno` ([`ProcId`]), statements by
//! query entry ([`QueryId`]), resource groups by [`GroupId`] — so it works in every
//! forked backend. Callers pass time in (CPU ns of a slice), so the simulator and tests
//! are deterministic.
//!
//! | when | call | notes |
//! |---|---|---|
//! | `shmem_request_hook` | [`SchedShared::region_size`] | for `RequestAddinShmemSpace` |
//! | `shmem_startup_hook` | [`SchedShared::init_in`] if new, else [`SchedShared::attach`] | under `AddinShmemInitLock` |
//! | group loaded / changed | [`SchedShared::configure_group`] | registration lock held |
//! | ExecutorStart | [`SchedShared::register_query`], [`SchedShared::join`], [`SchedShared::acquire`] | registration lock for `register_query` only |
//! | parallel worker start | [`SchedShared::join`] (leader's entry), [`SchedShared::acquire`] | no lock |
//! | tuple countdown hits 0 | [`SliceClock::chunk_done`]; on [`Checkpoint::SliceEnd`], [`SchedShared::end_slice`] | lock-free; no switch = charge + 3 loads |
//! | paused ([`Turn::Wait`]) | latch loop until [`SchedShared::is_running`] | serves interrupts meanwhile |
//! | before blocking (lock, I/O, client) | [`SchedShared::release`], later [`SchedShared::acquire`] | psaroudakis2013 §5 |
//! | ExecutorEnd | [`SchedShared::release`], [`SchedShared::leave`], [`SchedShared::unregister_query`] | registration lock for `unregister_query` |
//! | error, cancel, dead process | [`SchedShared::leave`] (then `unregister_query`) | passes on a held slot, withdraws a wait |
//! | `cpu_slots` GUC reload | [`SchedShared::set_cpu_slots`] (`numa = bind`: [`SchedShared::set_node_slots`]), then [`SchedShared::dispatch`] until `None` | lowering takes effect at slice ends |
//! | ExecutorStart, `numa = bind` | [`SchedShared::choose_home`] into [`QueryOptions::home`] | the query's processes take that node's slots |
//! | paused at home for k slices | [`SchedShared::allow_steal`], then [`SchedShared::dispatch`] until `None` | psaroudakis2016 §4 stealing |
//! | scheduler worker, every 50 ms | [`SchedShared::sample_hint`], [`SchedShared::sample_node_util`], [`SchedShared::dispatch`] | hint = EMA of free slots |
//! | Gather start / end | [`SchedShared::reserve_workers`] / [`SchedShared::return_workers`] | hint and group cap |
//! | tuner | [`tuner::Trace::from_records`], [`tuner::Tuner::refresh`], [`SchedShared::set_decay`] | same decision code |
//!
//! Every call that hands a slot to another process returns that process
//! ([`Outcome::wake`], or the `Option<ProcId>` of `release`, `leave`, `dispatch`): the
//! caller sets its latch afterwards, holding nothing.
//!
//! ```
//! use pg_stride_sched::*;
//!
//! // Postmaster: size the region, then initialise it in the first process
//! // (ShmemInitStruct); other processes `attach` to the same pointer.
//! let cap = Capacity { max_procs: 8, max_queries: 4, max_groups: 2 };
//! let config = SchedConfig { cpu_slots: 1, ..Default::default() };
//! let region = OwnedRegion::new(cap, &config).unwrap(); // here: on the heap
//! let sched: &SchedShared = &region;
//!
//! // ExecutorStart (registration lock held): register the statement, the leader joins.
//! let q = sched.register_query(GroupId(0), QueryOptions::default()).unwrap();
//! let (leader, worker) = (ProcId(0), ProcId(1));
//! sched.join(leader, q).unwrap();
//! assert_eq!(sched.acquire(leader).turn, Turn::Run);
//!
//! // A parallel worker joins the leader's entry and asks for a slot: none is free.
//! sched.join(worker, q).unwrap();
//! let out = sched.acquire(worker);
//! assert_eq!(out.turn, Turn::Wait); // latch-wait until sched.is_running(worker)
//!
//! // Yield point: the leader ends a 2 ms slice; someone waits, so it hands over.
//! let out = sched.end_slice(leader, 2_000_000);
//! assert_eq!((out.turn, out.wake), (Turn::Wait, Some(worker))); // SetLatch(worker)
//! assert!(sched.is_running(worker));
//!
//! // ExecutorEnd: release (charging the CPU since the last check-in), leave, unregister.
//! // On error or for a dead process, `leave` alone passes on any slot.
//! assert_eq!(sched.release(worker, 300_000), Some(leader)); // SetLatch(leader)
//! assert_eq!(sched.leave(worker), None);
//! assert_eq!(sched.leave(leader), None);
//! sched.unregister_query(q).unwrap();
//! ```

pub mod decay;
pub mod fingerprint;
pub mod group_tag;
pub mod groups;
pub mod hint;
pub mod histogram;
pub mod ids;
pub mod long_runs;
pub mod memory;
pub mod numa;
pub mod pin_word;
pub mod pool;
pub mod predict;
pub mod retry;
pub mod rules;
pub mod shared;
pub mod sim;
pub mod slice;
pub mod stall;
pub mod stride;
pub mod trace_ring;
pub mod tuner;

pub use decay::DecayParams;
pub use groups::GroupSettings;
pub use ids::{GroupId, ProcId, QueryId};
pub use shared::{
    Capacity, GroupConfig, Outcome, OwnedRegion, Policy, QueryOptions, SchedConfig, SchedError,
    SchedShared, Turn, MAX_GROUPS,
};
pub use slice::{Checkpoint, SliceClock};
pub mod admission;
