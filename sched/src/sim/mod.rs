//! Discrete-event simulator over the shared scheduler (wagner2021 §4 "self-simulation",
//! §5 workloads).
//!
//! The simulator drives a heap copy of [`crate::SchedShared`] through the same calls the
//! extension makes — `register_query`, `join`, `acquire`, `end_slice`, `release`,
//! `leave` — with simulated processes and a simulated clock, so every decision it
//! reports is one the extension would make. Queries are split into slices of the target
//! length (adaptive slices make them regular, §3.1); several processes of one query share
//! its remaining work like parallel workers share a scan.
//!
//! * [`workload`] — query specs, CSV reading and writing, the paper's workload generator
//!   and a heavy-tailed mix of repeating statements.
//! * [`engine`] — the event loop.
//! * [`report`] — slowdown statistics per query class.
//! * [`numa`] — NUMA nodes: slots labelled with nodes, a remote penalty, affine
//!   (`numa = bind`) or oblivious placement, and what they did.

pub mod engine;
pub mod numa;
pub mod report;
pub mod workload;

pub use engine::{
    simulate, simulate_run, simulate_with, OnTick, QueryResult, SimConfig, SimRun, StartMode,
};
pub use numa::{NodeUsage, NumaPlacement, NumaReport, NumaSim};
pub use report::{summarize, ClassSummary};
pub use workload::{
    generate, generate_heavy_tail, parse_csv, to_csv, HeavyTail, QuerySpec, Shape,
};
