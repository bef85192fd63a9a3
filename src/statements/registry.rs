//! The backend's registered statements, from admission to end: what each holds and
//! where it is in its life. `arrive` and `executor_started` (mod.rs) add and advance
//! them, `timed_run_ended` adds their runs' time, the executor hooks' questions read
//! them, and `ending` removes them.

use crate::backend_local::BackendLocal;
use crate::cpu;
use crate::parallel::Grant;
use pgrx::pg_sys;
use std::cell::{Cell, RefCell};

/// Where a registered statement is in its life. Before it is registered it waits in
/// the admission queue (inside [`arrive`](super::arrive)); once it joined, whether its
/// process holds a CPU slot or is paused is CPU scheduling's state (`cpu`); at its end
/// it is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Admitted, or exempt from admission: the executor is starting it, or runs it
    /// without pausing it (it writes, its transaction wrote, or its plan is tiny).
    Admitted,
    /// Takes part in CPU scheduling.
    Joined,
}

/// A top-level statement of this backend, registered from its admission to its end,
/// and the resource owner that was current when the executor started it (the portal's
/// owner).
pub(super) struct Statement {
    pub(super) desc: *const pg_sys::QueryDesc,
    pub(super) owner: pg_sys::ResourceOwner,
    pub(super) stage: Stage,
    /// Group slot the statement runs in.
    pub(super) group: usize,
    /// Whether it holds the process's admission (its lease), to give back or keep
    /// idle when it ends.
    pub(super) admitted: bool,
    /// Whether its admission reserved working memory, to give back when it ends.
    pub(super) reserved_memory: bool,
    /// Parallel workers its Gathers were granted, to give back when it ends.
    pub(super) workers: Grant,
    /// When it arrived and was admitted, for the tuner's trace.
    pub(super) arrival: cpu::Arrival,
    /// Whether its plan is too small for CPU scheduling (`cpu::is_tiny`): it never
    /// joins, and its end tells whether it really was.
    pub(super) tiny: bool,
    /// For a statement its history says is tiny: what its end records there.
    pub(super) by_history: Option<ByHistory>,
    /// Wall time its ExecutorRuns took so far, ns, measured for a tiny one, or one tiny
    /// by its history, only.
    pub(super) ran_ns: u64,
    /// The client's command that runs it, when that is a utility
    /// (`client_utility::command`); None for a statement the client sent itself.
    pub(super) command: Option<u64>,
    /// The process's count of registered statements that names it (`ProcEntry::registered`).
    pub(super) key: u32,
}

/// A statement whose fingerprint's history says its executions stay under half a slice
/// (`cpu::tiny_by_history`): it takes no slot before it has used a slice of CPU, and
/// the CPU of its ExecutorRuns is recorded into that history when it ends
/// (`cpu::record_unscheduled`), whether it took one or not.
#[derive(Clone, Copy)]
pub(super) struct ByHistory {
    /// Its query identifier and plan cost.
    pub(super) query_id: u64,
    pub(super) plan_cost: f64,
    /// The CPU its history predicted, µs.
    pub(super) predicted_us: f64,
    /// The CPU its ExecutorRuns used so far, ns: its own, as a scheduled statement's
    /// is charged only inside its runs, whatever else the backend ran meanwhile (an
    /// open cursor's other statements, a loop's body).
    pub(super) cpu_ns: u64,
}

/// The backend's registered statements: one, or a few open cursors.
pub(super) static REGISTERED: BackendLocal<RefCell<Vec<Statement>>> =
    BackendLocal::new(RefCell::new(Vec::new()));
/// How many of them are tiny: outside the list, so that the ExecutorRun of every other
/// statement learns with one load that it need not be timed.
pub(super) static TINY_REGISTERED: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));
/// How many are tiny by their history: their runs' CPU is measured (a system call each
/// way, which the runs of tiny plans do not pay).
pub(super) static BY_HISTORY_REGISTERED: BackendLocal<Cell<u32>> = BackendLocal::new(Cell::new(0));
/// The client command (`client_utility::command`) of the latest registered statement
/// that a command ran, and that statement's count: the last of a command's statements
/// to end forgets the runaway-query rules' requests up to it (`ending`), and no further
/// (a cursor declared by a later command keeps its own).
pub(super) static LAST_OF_COMMAND: BackendLocal<Cell<(u64, u32)>> =
    BackendLocal::new(Cell::new((0, 0)));
