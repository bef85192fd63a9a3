//! SQL functions behind pg_stride's views (docs/design.md §5). Each view is a plain SQL view
//! over a set-returning function that reads live shared memory.

use pgrx::prelude::*;

// PostgreSQL reserves schema names starting with "pg_" for itself; a superuser may
// create one with allow_system_table_mods, which the extension script turns on just for
// the CREATE SCHEMA that pgrx emits next and resets at the end (`finalize` below).
extension_sql!(
    "SET LOCAL allow_system_table_mods = on;",
    name = "allow_pg_schema_name",
    bootstrap
);
extension_sql!(
    "RESET allow_system_table_mods;",
    name = "reset_system_table_mods",
    finalize
);

#[pg_schema]
mod pg_stride {
    use crate::{gucs, shmem};
    use pg_stride_sched::tuner::{Check, TraceRecord};
    use pgrx::pg_sys::panic::ErrorReport;
    use pgrx::prelude::*;
    use std::sync::atomic::Ordering;

    /// One row per pool worker; the `pg_stride.pool` view.
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn pool_workers() -> TableIterator<
        'static,
        (
            name!(pid, i32),
            name!(database, pg_sys::Oid),
            name!(state, &'static str),
            name!(leader_pid, Option<i32>),
            name!(fragments, i64),
            name!(errors, i64),
            name!(last_setup_us, Option<f64>),
        ),
    > {
        TableIterator::new(crate::pool::workers().into_iter().map(|w| {
            (
                w.pid,
                w.database,
                w.state,
                w.leader_pid,
                w.fragments,
                w.errors,
                w.last_setup_us,
            )
        }))
    }

    /// Gathers that ran without the pool under `parallel_mode = pool`, by database and
    /// reason; the `pg_stride.pool_fallbacks` view.
    #[pg_extern(parallel_restricted)]
    fn pool_fallback_counts() -> TableIterator<
        'static,
        (
            name!(database, pg_sys::Oid),
            name!(reason, &'static str),
            name!(gathers, i64),
        ),
    > {
        TableIterator::new(crate::pool::fallbacks())
    }

    /// The pool's counters since the server started: Gathers pooled, tickets, fragments
    /// by outcome, workers started and retired, and the summed phase times of the
    /// fragments (`ns_*`).
    #[pg_extern(parallel_restricted)]
    fn pool_counters() -> TableIterator<'static, (name!(name, &'static str), name!(value, i64))> {
        TableIterator::new(crate::pool::counters())
    }

    /// The version of the loaded pg_stride library.
    #[pg_extern(parallel_safe)]
    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    /// One row describing the scheduler; the `pg_stride.scheduler` view.
    #[pg_extern(parallel_restricted)]
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
            name!(lent_overrun, i64),
            name!(yield_requests, i64),
            name!(cpu_swaps, i64),
            name!(cpu_share_swaps, i64),
            name!(decay_lambda, Option<f64>),
            name!(decay_start, Option<i32>),
            name!(decay_tuned, bool),
            name!(tuner_pid, Option<i32>),
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
        let parallel_mode = match gucs::PARALLEL_MODE.get() {
            gucs::ParallelMode::Off => "off",
            gucs::ParallelMode::Native => "native",
            gucs::ParallelMode::Pool => "pool",
        };
        let pid = |p: &std::sync::atomic::AtomicI32| match p.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        };
        // The decay in force for groups without their own: configured or tuned.
        let decay = shared.sched().map(|s| s.decay());
        TableIterator::once((
            cpu_slots as i32,
            slots_in_use as i32,
            running,
            queued,
            paused,
            gucs::ENABLED.get(),
            pid(&shared.scheduler_pid),
            hint,
            parallel_mode,
            gucs::SLICE_MS.get(),
            decisions,
            switches,
            shared.lends.blocked.load(Ordering::Relaxed) as i64,
            shared.lends.overrun.load(Ordering::Relaxed) as i64,
            shared.yield_requests.load(Ordering::Relaxed) as i64,
            shared.cpu_swaps.load(Ordering::Relaxed) as i64,
            shared.cpu_share_swaps.load(Ordering::Relaxed) as i64,
            decay.map(|d| d.lambda),
            decay.map(|d| d.d_start as i32),
            shared.tuner.choice().is_tuned(),
            pid(&shared.tuner.pid),
        ))
    }

    /// One row per resource group; the `pg_stride.groups` view.
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn groups_state() -> TableIterator<
        'static,
        (
            name!(name, String),
            name!(weight, i32),
            name!(max_concurrency, i32),
            name!(max_parallel_workers, Option<i32>),
            name!(priority_initial, Option<i32>),
            name!(priority_min, Option<i32>),
            name!(decay_lambda, Option<f64>),
            name!(decay_start, Option<i32>),
            name!(pinned, bool),
            name!(active, i64),
            name!(queued, i64),
            name!(admitted_total, i64),
            name!(timed_out_total, i64),
            name!(over_limit_total, i64),
            name!(queue_time_total_ms, f64),
            name!(queue_time_p50_ms, Option<f64>),
            name!(queue_time_p99_ms, Option<f64>),
            name!(cpu_time_ms, f64),
        ),
    > {
        let shared = require_shared();
        let mut live_cpu_ns = [0u64; shmem::MAX_GROUPS];
        if let Some(sched) = shared.sched() {
            for entry in shared.procs() {
                let q = entry.cpu_query.load(Ordering::Acquire);
                if let Some(s) = (q != 0)
                    .then(|| sched.query_snapshot(pg_stride_sched::QueryId(q - 1)))
                    .flatten()
                {
                    live_cpu_ns[(s.group.0 as usize).min(shmem::MAX_GROUPS - 1)] += s.cpu_ns;
                }
            }
        }
        let mut active = [0i64; shmem::MAX_GROUPS];
        // Admissions that processes counted and have not added to the group's counter.
        let mut pending = [0u64; shmem::MAX_GROUPS];
        let mut queued = [0i64; shmem::MAX_GROUPS];
        for (procno, entry) in shared.procs().iter().enumerate() {
            if shared.is_live(procno) {
                let slot =
                    (entry.group.load(Ordering::Acquire) as usize).min(shmem::MAX_GROUPS - 1);
                active[slot] += i64::from(entry.running.load(Ordering::Acquire));
                queued[slot] += i64::from(entry.queued.load(Ordering::Acquire));
                if let Some((of, n)) = crate::admission::pending_admissions(shared, entry) {
                    pending[of] += n;
                }
            }
        }
        let rows: Vec<_> = shared
            .groups
            .groups()
            .into_iter()
            .map(|(slot, g)| {
                let s = g.settings;
                let c = shared.groups.counters(slot);
                let admitted = c.admitted.load(Ordering::Relaxed) + pending[slot];
                let ms = |us: u64| us as f64 / 1000.0;
                (
                    g.name,
                    s.weight,
                    s.max_concurrency,
                    s.max_parallel_workers,
                    s.priority_initial,
                    s.priority_min,
                    s.decay_lambda,
                    s.decay_start,
                    s.pinned,
                    active[slot],
                    queued[slot],
                    admitted as i64,
                    c.timed_out.load(Ordering::Relaxed) as i64,
                    c.over_limit.load(Ordering::Relaxed) as i64,
                    ms(c.queue_time_us.load(Ordering::Relaxed)),
                    c.queue_time_quantile_us(admitted, 0.5).map(ms),
                    c.queue_time_quantile_us(admitted, 0.99).map(ms),
                    (c.cpu_ns.load(Ordering::Relaxed) + live_cpu_ns[slot]) as f64 / 1e6,
                )
            })
            .collect();
        TableIterator::new(rows)
    }

    /// One row per process that runs or waits to run a scheduled statement; the
    /// `pg_stride.activity` view adds what pg_stat_activity shows of it. Its times and
    /// its place in the schedule are NULL to a role that may not read the statistics
    /// of the process's role (pg::may_read_stats_of), as pg_stat_activity does.
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn activity_state() -> TableIterator<
        'static,
        (
            name!(pid, i32),
            name!(group_name, String),
            name!(state, &'static str),
            name!(statements, i32),
            name!(queued_since_us, Option<i64>),
            name!(admitted_at_us, Option<i64>),
            name!(priority, Option<i32>),
            name!(pass, Option<i64>),
            name!(cpu_time_ms, Option<f64>),
            name!(paused_time_ms, Option<f64>),
            name!(processes, Option<i32>),
            name!(workers_planned, i32),
            name!(workers_granted, i32),
            name!(admission_lent, bool),
        ),
    > {
        let shared = require_shared();
        let names: std::collections::HashMap<usize, String> = shared
            .groups
            .groups()
            .into_iter()
            .map(|(slot, g)| (slot, g.name))
            .collect();
        let mut rows = Vec::new();
        for (procno, entry) in shared.procs().iter().enumerate() {
            let running = entry.running.load(Ordering::Acquire);
            let queued = entry.queued.load(Ordering::Acquire);
            if (running == 0 && queued == 0) || !shared.is_live(procno) {
                continue;
            }
            let slot = entry.group.load(Ordering::Acquire) as usize;
            let nonzero = |v: i64| (v != 0).then_some(v);
            let query = match entry.cpu_query.load(Ordering::Acquire) {
                0 => None,
                q => shared
                    .sched()
                    .and_then(|s| s.query_snapshot(pg_stride_sched::QueryId(q - 1))),
            };
            let visible = crate::pg::may_read_stats_of(crate::pg::proc_role(procno));
            let shown = |v: Option<i64>| v.filter(|_| visible);
            let query = query.filter(|_| visible);
            let state = if queued > 0 {
                "queued"
            } else if entry.paused.load(Ordering::Acquire) != 0 {
                "paused"
            } else {
                "running"
            };
            rows.push((
                entry.pid.load(Ordering::Acquire),
                names.get(&slot).cloned().unwrap_or_default(),
                state,
                running as i32,
                shown(if queued > 0 {
                    nonzero(entry.queued_since.load(Ordering::Relaxed))
                } else {
                    None
                }),
                shown(nonzero(entry.admitted_at.load(Ordering::Relaxed))),
                query.map(|q| q.priority as i32),
                query.map(|q| q.pass as i64),
                query.map(|q| q.cpu_ns as f64 / 1e6),
                visible.then(|| entry.paused_us.load(Ordering::Relaxed) as f64 / 1e3),
                query.map(|q| q.members as i32),
                entry.workers_planned.load(Ordering::Relaxed) as i32,
                entry.workers_granted.load(Ordering::Relaxed) as i32,
                entry.lease.is_lent(),
            ));
        }
        TableIterator::new(rows)
    }

    /// One row per finished statement in the trace (`pg_stride.trace = on`, or the
    /// tuner on), oldest first; the `pg_stride.trace` view. Times are CLOCK_MONOTONIC
    /// readings turned into TimestampTz µs by today's offset between the two clocks.
    /// A statement's query id and times are NULL to a role that may not read the
    /// statistics of the statement's role (pg::may_read_stats_of), as
    /// pg_stat_statements does.
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn trace_records() -> TableIterator<
        'static,
        (
            name!(arrival_us, Option<i64>),
            name!(admitted_ms, Option<f64>),
            name!(finished_ms, Option<f64>),
            name!(first_slot_ms, Option<f64>),
            name!(userid, pg_sys::Oid),
            name!(query_id, Option<i64>),
            name!(group_name, String),
            name!(processes, i32),
            name!(workers_planned, i32),
            name!(cpu_ms, Option<f64>),
            name!(cpu_total_ms, Option<f64>),
            name!(paused_ms, Option<f64>),
            name!(handoff_ms, Option<f64>),
            name!(handoffs, Option<i64>),
            name!(held_ms, Option<f64>),
            name!(held_runqueue_ms, Option<f64>),
            name!(runqueue_ms, Option<f64>),
            name!(runqueue_before_slot_ms, Option<f64>),
            name!(paused_runqueue_ms, Option<f64>),
            name!(long_slice_ms, Option<f64>),
            name!(failed, bool),
        ),
    > {
        let shared = require_shared();
        let offset_us = crate::pg::now_timestamp() - (crate::pg::monotonic_ns() / 1_000) as i64;
        let mut records: Vec<_> = crate::cpu::read_window(shared, 0, 0)
            .records
            .into_iter()
            .filter(|r| r.finished().is_some())
            .collect();
        records.sort_by_key(|r| r.arrival_ns);
        let mut visible_roles = std::collections::HashMap::new();
        let rows: Vec<_> = records
            .into_iter()
            .map(|r| {
                let userid = pg_sys::Oid::from(r.userid);
                let visible = *visible_roles
                    .entry(r.userid)
                    .or_insert_with(|| crate::pg::may_read_stats_of(userid));
                let ms = |ns: u64| visible.then_some(ns as f64 / 1e6);
                let since = |t: u64| ms(t.saturating_sub(r.arrival_ns));
                let a = r.acct;
                (
                    visible.then_some(offset_us + (r.arrival_ns / 1_000) as i64),
                    since(r.admit_ns),
                    since(r.finish_ns),
                    (a.first_slot_ns != TraceRecord::PENDING)
                        .then(|| since(a.first_slot_ns))
                        .flatten(),
                    userid,
                    visible.then_some(r.query_id as i64),
                    shared.groups.name_of(r.group as usize),
                    r.procs as i32,
                    a.workers_planned as i32,
                    ms(r.cpu_ns),
                    ms(a.cpu_total_ns),
                    ms(a.paused_ns),
                    ms(a.handoff_ns),
                    visible.then_some(i64::from(a.handoffs)),
                    ms(a.held_ns),
                    ms(a.held_runqueue_ns),
                    ms(a.runqueue_ns),
                    ms(a.runqueue_before_slot_ns),
                    ms(a.paused_runqueue_ns),
                    ms(a.long_slice_ns),
                    r.flags & TraceRecord::ERROR != 0,
                )
            })
            .collect();
        TableIterator::new(rows)
    }

    /// One row per recent refresh of the tuner, oldest first; the `pg_stride.tuner`
    /// view.
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn tuner_state() -> TableIterator<
        'static,
        (
            name!(refreshed_at_us, i64),
            name!(action, &'static str),
            name!(statements, i32),
            name!(finished, i32),
            name!(records_lost, i64),
            name!(simulations, i32),
            name!(elapsed_ms, f64),
            name!(cpu_ms, f64),
            name!(old_lambda, f64),
            name!(old_decay_start, i32),
            name!(best_lambda, Option<f64>),
            name!(best_decay_start, Option<i32>),
            name!(new_lambda, f64),
            name!(new_decay_start, i32),
            name!(observed_mean_slowdown, Option<f64>),
            name!(predicted_mean_before, Option<f64>),
            name!(predicted_mean_after, Option<f64>),
            name!(predicted_short_mean_before, Option<f64>),
            name!(predicted_short_mean_after, Option<f64>),
            name!(adopted, bool),
            name!(reason, String),
        ),
    > {
        let rows = require_shared().tuner.history().into_iter().map(|row| {
            let r = row.refresh;
            (
                row.at,
                match r.check {
                    Check::Search => "search",
                    Check::Fallback => "shift check",
                },
                r.queries as i32,
                r.finished as i32,
                row.lost as i64,
                r.simulations as i32,
                row.elapsed_us as f64 / 1e3,
                row.cpu_us as f64 / 1e3,
                r.old.lambda,
                r.old.d_start as i32,
                r.best.map(|b| b.lambda),
                r.best.map(|b| b.d_start as i32),
                r.new.lambda,
                r.new.d_start as i32,
                r.observed,
                r.predicted_old.map(|o| o.mean),
                r.predicted_best.map(|o| o.mean),
                r.predicted_old.map(|o| o.short_mean),
                r.predicted_best.map(|o| o.short_mean),
                r.adopted,
                r.reason.to_string(),
            )
        });
        TableIterator::new(rows.collect::<Vec<_>>())
    }

    /// One row per NUMA node of this server's CPUs, and a row with a NULL node for what
    /// is on none; the `pg_stride.numa` view. CPU time counts what was charged to
    /// queries while `pg_stride.numa = stats`, by the node of the CPU each charge was
    /// made on; shared memory is PostgreSQL's main segment, by the postmaster's
    /// `numa_maps` (pages it has not mapped itself count on no node).
    #[pg_extern(parallel_restricted)]
    #[allow(clippy::type_complexity)]
    fn numa_state() -> TableIterator<
        'static,
        (
            name!(node, Option<i32>),
            name!(cpus, Option<String>),
            name!(cpu_count, Option<i32>),
            name!(cpu_time_ms, Option<f64>),
            name!(memory_total_kb, Option<i64>),
            name!(memory_free_kb, Option<i64>),
            name!(shared_memory_bytes, Option<i64>),
            name!(cpu_slots, Option<i32>),
            name!(slots_in_use, Option<i32>),
            name!(queries_homed, Option<i32>),
            name!(waiting, Option<i32>),
        ),
    > {
        use pg_stride_sched::numa::{format_cpu_list, Topology};
        let shared = require_shared();
        let placement = crate::numa::shared_memory_placement();
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut rows = Vec::new();
        let mut on_listed_nodes = 0u64;
        let slots = shared.sched().map(super::node_slot_state);
        crate::numa::with_machine(|machine| {
            let Some(m) = machine else { return };
            // Slots by node: split (`numa = bind`) over the topology's nodes, or all on
            // the one node there is; otherwise they belong to no node.
            let slots = slots.filter(|s| s.len() == m.topology.nodes.len());
            // Free memory changes: read it now (a spec's fake nodes have none).
            let fresh = (!m.from_spec)
                .then(|| Topology::from_sysfs(std::path::Path::new("/sys")).ok())
                .flatten();
            let mut shared_counter_shown = false;
            for (index, node) in m.topology.nodes.iter().enumerate() {
                let node_slots = slots.as_ref().map(|s| s[index]);
                // Nodes numbered MAX_NODES - 1 and above share a counter: shown once.
                let cpu_ns = if shmem::NodeCounters::slot(node.id) < shmem::MAX_NODES - 1 {
                    Some(shared.nodes.cpu_ns(node.id))
                } else if !shared_counter_shown {
                    shared_counter_shown = true;
                    Some(shared.nodes.cpu_ns(node.id))
                } else {
                    None
                };
                let memory = fresh
                    .as_ref()
                    .and_then(|t| t.nodes.iter().find(|n| n.id == node.id))
                    .unwrap_or(node);
                let bytes = placement.as_ref().map(|p| p.on_node(node.id));
                on_listed_nodes += bytes.unwrap_or(0);
                rows.push((
                    Some(node.id as i32),
                    Some(format_cpu_list(&node.cpus)),
                    Some(node.cpus.len() as i32),
                    cpu_ns.map(ms),
                    memory.mem_total_kb.map(|kb| kb as i64),
                    memory.mem_free_kb.map(|kb| kb as i64),
                    bytes.map(|b| b as i64),
                    node_slots.map(|s| s.slots as i32),
                    node_slots.map(|s| s.running as i32),
                    node_slots.map(|s| s.homed as i32),
                    node_slots.map(|s| s.waiting as i32),
                ));
            }
        });
        // On no listed node: CPU charged on a CPU of no node, and the pages of the
        // segment not resident (or on a node the topology does not list), so that each
        // column adds up over the rows.
        rows.push((
            None,
            None,
            None,
            Some(ms(shared.nodes.elsewhere_ns())),
            None,
            None,
            placement
                .as_ref()
                .map(|p| p.size.saturating_sub(on_listed_nodes) as i64),
            None,
            None,
            None,
            None,
        ));
        TableIterator::new(rows)
    }

    /// Zeroes the cumulative counters of every group and the per-node CPU times.
    #[pg_extern(volatile, parallel_unsafe)]
    fn reset_stats() {
        let shared = require_shared();
        for (slot, _) in shared.groups.groups() {
            shared.groups.counters(slot).reset();
        }
        for entry in shared.procs() {
            entry.admitted_pending.store(0, Ordering::Relaxed);
        }
        shared.nodes.reset();
    }

    /// The shared region, or an error telling the DBA how to load pg_stride properly.
    fn require_shared() -> &'static shmem::Shared {
        match shmem::shared() {
            Some(shared) => shared,
            None => {
                ErrorReport::new(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    "pg_stride must be loaded via \"shared_preload_libraries\"",
                    "pg_stride.scheduler_state",
                )
                .set_hint("Add pg_stride to shared_preload_libraries in postgresql.conf and restart the server.")
                .report(PgLogLevel::ERROR);
                unreachable!("an ERROR report does not return")
            }
        }
    }
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
    requires = [pg_stride::scheduler_state],
);

extension_sql!(
    r#"
CREATE VIEW pg_stride.groups AS
    SELECT * FROM pg_stride.groups_state() ORDER BY name;
COMMENT ON VIEW pg_stride.groups IS
    'pg_stride resource groups: settings (NULL = the server-wide setting) and statement counts';
GRANT SELECT ON pg_stride.groups TO PUBLIC;
"#,
    name = "groups_view",
    requires = [pg_stride::groups_state],
);

// TimestampTz counts microseconds from 2000-01-01 00:00 UTC.
extension_sql!(
    r#"
CREATE VIEW pg_stride.activity AS
    SELECT s.pid,
           s.group_name AS "group",
           s.state,
           s.statements,
           timestamptz '2000-01-01 00:00:00+00' + s.queued_since_us * interval '1 microsecond' AS queued_since,
           timestamptz '2000-01-01 00:00:00+00' + s.admitted_at_us * interval '1 microsecond' AS admitted_at,
           s.priority,
           s.pass,
           s.cpu_time_ms,
           s.paused_time_ms,
           s.processes,
           s.workers_planned,
           s.workers_granted,
           s.admission_lent,
           a.usename,
           a.datname,
           a.query
      FROM pg_stride.activity_state() s
      LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.pid;
COMMENT ON VIEW pg_stride.activity IS
    'pg_stride: one row per backend running or waiting to run a scheduled statement; query text as pg_stat_activity shows it';
GRANT SELECT ON pg_stride.activity TO PUBLIC;
REVOKE ALL ON FUNCTION pg_stride.reset_stats() FROM PUBLIC;
"#,
    name = "activity_view",
    requires = [pg_stride::activity_state, pg_stride::reset_stats],
);

extension_sql!(
    r#"
CREATE VIEW pg_stride.tuner AS
    SELECT timestamptz '2000-01-01 00:00:00+00' + t.refreshed_at_us * interval '1 microsecond' AS refreshed_at,
           t.action, t.statements, t.finished, t.records_lost, t.simulations,
           t.elapsed_ms, t.cpu_ms,
           t.old_lambda, t.old_decay_start, t.best_lambda, t.best_decay_start,
           t.new_lambda, t.new_decay_start,
           t.observed_mean_slowdown,
           t.predicted_mean_before, t.predicted_mean_after,
           t.predicted_short_mean_before, t.predicted_short_mean_after,
           t.adopted, t.reason
      FROM pg_stride.tuner_state() t
     ORDER BY t.refreshed_at_us;
COMMENT ON VIEW pg_stride.tuner IS
    'pg_stride tuner: one row per recent refresh (search or shift check), with the decay parameters before and after and the predicted mean slowdowns';
GRANT SELECT ON pg_stride.tuner TO PUBLIC;
"#,
    name = "tuner_view",
    requires = [pg_stride::tuner_state],
);

extension_sql!(
    r#"
CREATE VIEW pg_stride.trace AS
    SELECT timestamptz '2000-01-01 00:00:00+00' + t.arrival_us * interval '1 microsecond' AS arrival,
           t.admitted_ms, t.first_slot_ms, t.finished_ms, t.userid, t.query_id, t.group_name,
           t.processes, t.workers_planned, t.cpu_ms, t.cpu_total_ms, t.paused_ms,
           t.handoff_ms, t.handoffs, t.held_ms, t.held_runqueue_ms, t.runqueue_ms,
           t.runqueue_before_slot_ms, t.paused_runqueue_ms, t.long_slice_ms, t.failed
      FROM pg_stride.trace_records() WITH ORDINALITY t
     ORDER BY t.ordinality;
COMMENT ON VIEW pg_stride.trace IS
    'pg_stride trace: the most recent CPU-scheduled statements that finished while pg_stride.trace (or the tuner) was on, with their times after arrival, CPU in and outside CPU slots, and waits for slots; query ids and times of other roles'' statements only for members of pg_read_all_stats';
GRANT SELECT ON pg_stride.trace TO PUBLIC;
"#,
    name = "trace_view",
    requires = [pg_stride::trace_records],
);

extension_sql!(
    r#"
CREATE VIEW pg_stride.numa AS
    SELECT * FROM pg_stride.numa_state() ORDER BY node NULLS LAST;
COMMENT ON VIEW pg_stride.numa IS
    'pg_stride NUMA nodes: CPUs, CPU time charged to queries per node (pg_stride.numa = stats or bind), memory, bytes of the main shared-memory segment per node, and CPU slots per node (split with pg_stride.numa = bind); the row with a NULL node holds what is on none';
GRANT SELECT ON pg_stride.numa TO PUBLIC;
"#,
    name = "numa_view",
    requires = [pg_stride::numa_state],
);

extension_sql!(
    r#"
CREATE VIEW pg_stride.pool AS
    SELECT w.pid, d.datname, w.state, w.leader_pid, w.fragments, w.errors, w.last_setup_us
      FROM pg_stride.pool_workers() w
      LEFT JOIN pg_database d ON d.oid = w.database
     ORDER BY d.datname, w.pid;
COMMENT ON VIEW pg_stride.pool IS
    'pg_stride pool workers (pg_stride.parallel_mode = pool): state (starting, idle, busy, retiring), the leader of the current or last fragment, fragments served and failed, and the last fragment''s set-up time in microseconds';
GRANT SELECT ON pg_stride.pool TO PUBLIC;
CREATE VIEW pg_stride.pool_fallbacks AS
    SELECT d.datname, f.reason, f.gathers
      FROM pg_stride.pool_fallback_counts() f
      LEFT JOIN pg_database d ON d.oid = f.database
     ORDER BY d.datname, f.reason;
COMMENT ON VIEW pg_stride.pool_fallbacks IS
    'Gathers that ran with PostgreSQL''s own parallel workers under pg_stride.parallel_mode = pool, by database and reason, since the server started (datname NULL: databases beyond the first 16, or dropped)';
GRANT SELECT ON pg_stride.pool_fallbacks TO PUBLIC;
"#,
    name = "pool_views",
    requires = [pg_stride::pool_workers, pg_stride::pool_fallback_counts],
);

/// One node's CPU slots, as the `pg_stride.numa` view shows them.
#[derive(Clone, Copy)]
struct NodeSlots {
    slots: u32,
    running: u32,
    homed: u32,
    /// Processes waiting for a slot whose query is homed on the node.
    waiting: u32,
}

/// The CPU slots of each node the scheduler splits them over (one entry when not split).
fn node_slot_state(sched: &pg_stride_sched::SchedShared) -> Vec<NodeSlots> {
    sched
        .node_loads()
        .iter()
        .zip(sched.waiting_by_node())
        .map(|(l, waiting)| NodeSlots {
            slots: l.slots,
            running: l.running,
            homed: l.homed,
            waiting,
        })
        .collect()
}
