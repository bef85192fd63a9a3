//! The `pg_stride.scheduler` view: one row of CPU slots, statement counts, scheduling
//! decisions and the decay in force.

use super::shared_access::require_shared;
use crate::{cpu, gucs, parallel};
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

/// One row describing the scheduler; the `pg_stride.scheduler` view.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn scheduler_state() -> TableIterator<
    'static,
    (
        name!(cpu_slots, i32),
        name!(slots_in_use, i32),
        name!(running, i64),
        name!(queued, i64),
        name!(paused, i64),
        name!(enabled, bool),
        name!(scheduler_pid, Option<i32>),
        name!(hint, f64),
        name!(parallel_mode, &'static str),
        name!(slice_ms, f64),
        name!(decisions, i64),
        name!(switches, i64),
        name!(lent_blocked, i64),
        name!(yield_requests, i64),
        name!(cpu_swaps, i64),
        name!(cpu_share_swaps, i64),
        name!(decay_lambda, Option<f64>),
        name!(decay_start, Option<i32>),
        name!(decay_tuned, bool),
        name!(tuner_pid, Option<i32>),
        name!(memory_budget_kb, i64),
        name!(memory_reserved_kb, i64),
        name!(memory_waiting_kb, i64),
    ),
> {
    let shared = require_shared();
    let (mut running, mut queued, mut paused) = (0i64, 0i64, 0i64);
    for (procno, entry) in shared.procs().iter().enumerate() {
        if shared.is_live(procno) {
            running += i64::from(entry.running.load(Ordering::Acquire));
            queued += i64::from(entry.queued.load(Ordering::Acquire));
            paused += i64::from(entry.paused.load(Ordering::Acquire));
        }
    }
    let (cpu_slots, slots_in_use, hint) = shared
        .sched()
        .map_or((0, 0, 0.0), |s| (s.cpu_slots(), s.running(), s.hint()));
    // Every slice ends in a decision (go on, or hand the slot over); the counts live
    // in the per-process records of the scheduling core.
    let (mut decisions, mut switches) = (0i64, 0i64);
    if let Some(sched) = shared.sched() {
        for p in 0..sched.capacity().max_procs {
            let snapshot = sched.proc_snapshot(pg_stride_sched::ProcId(p));
            decisions += snapshot.slices as i64;
            switches += snapshot.switches as i64;
        }
    }
    let parallel_mode = parallel::mode_name();
    let pid = |p: &std::sync::atomic::AtomicI32| match p.load(Ordering::Acquire) {
        0 => None,
        pid => Some(pid),
    };
    // The decay in force for groups without their own: configured or tuned.
    let decay = shared.sched().map(|s| s.decay());
    let memory = shared.read_admission(|queue, _| queue.memory);
    TableIterator::once((
        cpu_slots as i32,
        slots_in_use as i32,
        running,
        queued,
        paused,
        gucs::enabled(),
        pid(&shared.scheduler_pid),
        hint,
        parallel_mode,
        cpu::slice_ms(),
        decisions,
        switches,
        shared.lends_blocked.load(Ordering::Relaxed) as i64,
        shared.yield_requests.load(Ordering::Relaxed) as i64,
        shared.cpu_swaps.load(Ordering::Relaxed) as i64,
        shared.cpu_share_swaps.load(Ordering::Relaxed) as i64,
        decay.map(|d| d.lambda),
        decay.map(|d| d.d_start as i32),
        shared.tuner.choice().is_tuned(),
        pid(&shared.tuner.pid),
        memory.limit_kb as i64,
        memory.reserved_kb as i64,
        memory.waiting_kb as i64,
    ))
}

extension_sql!(
    r#"
CREATE VIEW pg_stride.scheduler AS
    SELECT * FROM pg_stride.scheduler_state();
COMMENT ON VIEW pg_stride.scheduler IS
    'pg_stride scheduler: CPU slots, running and queued statements, concurrency hint, scheduling decisions, decay parameters in force';
GRANT USAGE ON SCHEMA pg_stride TO PUBLIC;
GRANT SELECT ON pg_stride.scheduler TO PUBLIC;
"#,
    name = "scheduler_view",
    requires = [scheduler_state],
);
