//! Parallel workers by the concurrency hint (psaroudakis2013 §6; docs/design.md §1).
//!
//! When a scheduled statement starts, each Gather and Gather Merge of its plan may
//! launch no more workers than the hint — the recent average of free CPU slots, sampled
//! by the scheduler worker —, the slots free at that moment (the slots less those held,
//! or wanted by other statements that are executing or queued, whichever is more, and
//! less the leader's own when it takes part in the scan) and what is left of its
//! group's `max_parallel_workers`. A statement predicted short (`pg_stride.predict`) gets
//! none while another holds a slot or waits: starting workers would cost about what
//! they save.
//! Under load the system is already busy and extra workers would only wait for slots;
//! on a quiet server the planned degree is granted. The grant is reserved against the
//! group's cap until the statement ends.
//!
//! The plan handed to ExecutorStart may belong to the plan cache and be executed again
//! later (docs/design.md §4 rule 6): when a grant is lower than planned, the statement runs a
//! copy of the plan with the lower worker counts, made in the memory context of its
//! QueryDesc, and the cached plan keeps its own.

use crate::gucs::Setting;
use crate::{pg, plan_costs, plan_tree, shmem};
use pg_stride_sched::shared::Demand;
use pg_stride_sched::{GroupId, SchedShared};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::PostgresGucEnum;

/// What a statement's Gathers planned and were granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// Workers the plan asked for, over all its Gathers.
    pub planned: u32,
    /// Workers granted and reserved against the group's cap.
    pub granted: u32,
}

/// The workers reserved for a statement's Gathers, each Gather's count in the order
/// [`for_each_gather`] meets them.
pub struct Reservation {
    pub grant: Grant,
    /// Each Gather's grant, where one is lower than planned; empty when all got theirs.
    lowered: Vec<i32>,
}

/// Reserves, against the cap of group slot `group`, the workers the Gathers of `desc`'s
/// plan may launch; `None` for a plan without Gathers, or with `parallel_mode = off`.
/// Its caller skips plans that do not need parallel mode, which have no Gather.
/// `predict`: whether statements are predicted (`pg_stride.predict`), so that one
/// predicted short gets no workers under load.
/// Raises no error: the caller records the grant, to give it back however the
/// statement ends, before [`apply`] may raise one.
pub fn reserve_workers(
    shared: &shmem::Shared,
    desc: *const pg_sys::QueryDesc,
    group: usize,
    predict: bool,
) -> Option<Reservation> {
    if PARALLEL_MODE.get() == ParallelMode::Off {
        return None;
    }
    let sched = shared.sched()?;
    // SAFETY: ExecutorStart's QueryDesc has a valid PlannedStmt.
    let stmt = unsafe { (*desc).plannedstmt };
    let mut planned = Vec::new();
    // SAFETY: `stmt` is a valid PlannedStmt; the walk only reads it.
    unsafe {
        for_each_gather(stmt, |workers, leader_runs| {
            planned.push((*workers, leader_runs))
        })
    };
    if planned.is_empty() {
        return None;
    }
    let elsewhere = shared.statements_elsewhere();
    let predicted_short = predict && predicted_short(shared, sched, stmt, group);
    let granted: Vec<i32> = planned
        .iter()
        .map(|&(n, leader_runs)| {
            let demand = Demand {
                leader_runs,
                elsewhere,
                predicted_short,
            };
            sched.reserve_workers(GroupId(group as u32), n.max(0) as u32, demand) as i32
        })
        .collect();
    let grant = Grant {
        planned: planned.iter().map(|&(n, _)| n.max(0) as u32).sum(),
        granted: granted.iter().map(|&n| n as u32).sum(),
    };
    let all = granted.iter().eq(planned.iter().map(|(n, _)| n));
    Some(Reservation {
        grant,
        lowered: if all { Vec::new() } else { granted },
    })
}

/// Whether the statement of `stmt` in group slot `group` is predicted short
/// (`pg_stride_sched::predict`): then, under load, its Gathers get no workers. Asked only
/// with `pg_stride.predict` on.
// Out of line, so that bench/instructions.py can count its instructions.
#[inline(never)]
fn predicted_short(
    shared: &shmem::Shared,
    sched: &SchedShared,
    stmt: *const pg_sys::PlannedStmt,
    group: usize,
) -> bool {
    // SAFETY: ExecutorStart's PlannedStmt.
    let (query_id, cost) = unsafe { pg::query_id_and_cost(stmt) };
    let short_us = sched.short_threshold_us(group);
    shared
        .histories
        .predict(query_id, plan_costs::at_defaults(cost))
        .is_some_and(|p| p.cpu_us <= short_us)
}

/// Makes `desc` run with the workers `reservation` granted: where a grant is lower than
/// planned, a copy of the plan with the lower counts. Call before ExecutorStart builds
/// the plan state. May raise an error (out of memory).
pub fn apply(desc: *mut pg_sys::QueryDesc, reservation: Reservation) {
    if reservation.lowered.is_empty() {
        return;
    }
    // SAFETY: ExecutorStart's QueryDesc has a valid PlannedStmt. The copy is made in the
    // context that holds the QueryDesc, so it lives as long as the statement;
    // copyObjectImpl copies the whole tree, so the walk below meets its Gathers in the
    // same order as `reserve_workers` met the original's.
    unsafe {
        let context = pg_sys::GetMemoryChunkContext(desc.cast());
        let previous = pg_sys::CurrentMemoryContext;
        pg_sys::CurrentMemoryContext = context;
        let copy = pg_sys::copyObjectImpl((*desc).plannedstmt.cast()).cast::<pg_sys::PlannedStmt>();
        pg_sys::CurrentMemoryContext = previous;
        let mut grants = reservation.lowered.into_iter();
        for_each_gather(copy, |workers, _| {
            if let Some(n) = grants.next() {
                *workers = n;
            }
        });
        (*desc).plannedstmt = copy;
    }
}

/// Whether the Gathers of a parallel plan granted `grant` may launch workers: those
/// granted, or as planned with `parallel_mode = off`. A plan granted none runs as a
/// serial one, its leader alone.
pub fn may_launch_workers(grant: Grant) -> bool {
    grant.granted > 0 || PARALLEL_MODE.get() == ParallelMode::Off
}

/// Gives back the workers a statement of group slot `group` reserved.
pub fn return_workers(shared: &shmem::Shared, group: usize, grant: Grant) {
    if let Some(sched) = shared.sched().filter(|_| grant.granted > 0) {
        sched.return_workers(GroupId(group as u32), grant.granted);
    }
}

/// Calls `f` with the worker count of every Gather and Gather Merge of `stmt` — those
/// a Stride Gather stands for included —, in a fixed order (plan_tree::for_each_plan),
/// and whether the leader runs the plan below it too (parallel_leader_participation,
/// unless the Gather is single-copy), taking a CPU slot of its own.
///
/// # Safety
/// `stmt` is a valid PlannedStmt; `f` may change the counts and nothing else.
unsafe fn for_each_gather(stmt: *mut pg_sys::PlannedStmt, mut f: impl FnMut(&mut i32, bool)) {
    use pg_sys::NodeTag::*;
    // SAFETY: the caller's promise; a Plan's tag tells its type.
    unsafe {
        let participates = pg_sys::parallel_leader_participation;
        plan_tree::for_each_plan(stmt, &mut |slot| {
            let plan = plan_tree::stride_gather_inner(*slot).unwrap_or(*slot);
            match (*plan).type_ {
                T_Gather => {
                    let gather = plan.cast::<pg_sys::Gather>();
                    f(
                        &mut (*gather).num_workers,
                        participates && !(*gather).single_copy,
                    )
                }
                T_GatherMerge => f(
                    &mut (*plan.cast::<pg_sys::GatherMerge>()).num_workers,
                    participates,
                ),
                _ => {}
            }
        });
    }
}

// ---- The parallel mode ----

/// `pg_stride.parallel_mode`: who decides how many parallel workers a Gather launches.
#[derive(PostgresGucEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParallelMode {
    /// PostgreSQL alone, as planned.
    #[name = c"off"]
    Off,
    /// PostgreSQL's own parallel workers, as many as the concurrency hint and the
    /// group's `max_parallel_workers` grant.
    #[name = c"native"]
    Native,
    /// As `native`, with the parallel part of each Gather run by pg_stride's pool
    /// workers where it can (src/pool, docs/design.md §6); native workers otherwise.
    #[name = c"pool"]
    Pool,
}

static PARALLEL_MODE: Setting<ParallelMode> =
    Setting::new(GucSetting::<ParallelMode>::new(ParallelMode::Native));

/// Whether `pg_stride.parallel_mode` is `pool`, read without converting the ordinal:
/// asked by the executor hook for every statement, outside pgrx's error boundary.
pub fn pool_mode() -> bool {
    PARALLEL_MODE.raw() == ParallelMode::Pool as i32
}

/// `pg_stride.parallel_mode`'s value, as SHOW gives it.
pub fn mode_name() -> &'static str {
    match PARALLEL_MODE.get() {
        ParallelMode::Off => "off",
        ParallelMode::Native => "native",
        ParallelMode::Pool => "pool",
    }
}

/// Registers `pg_stride.parallel_mode`. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_enum_guc(
        c"pg_stride.parallel_mode",
        c"Who decides how many parallel workers each Gather launches.",
        c"off: PostgreSQL, as planned; native: no more than the concurrency hint and the group's max_parallel_workers grant; pool: as native, run by pg_stride's pool workers where possible.",
        PARALLEL_MODE.inner(),
        GucContext::Suset,
        GucFlags::default(),
    );
}
