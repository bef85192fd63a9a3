//! The views of statements: `pg_stride.activity` (those running or waiting to run now)
//! and `pg_stride.trace` (those that finished, from the trace).

use super::shared_access::require_shared;
use pg_stride_sched::admission::WaitState;
use pg_stride_sched::tuner::TraceRecord;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

/// One row per process that runs or waits to run a scheduled statement; the
/// `pg_stride.activity` view adds what pg_stat_activity shows of it. Everything but
/// its pid is NULL to a role that may not read the statistics of the process's role
/// (pg::may_read_stats_of), as pg_stat_activity hides all but a backend's identity,
/// except in the process's own row.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn activity_state() -> TableIterator<
    'static,
    (
        name!(pid, i32),
        name!(group_name, Option<String>),
        name!(state, Option<&'static str>),
        name!(statements, Option<i32>),
        name!(queued_since_us, Option<i64>),
        name!(admitted_at_us, Option<i64>),
        name!(priority, Option<i32>),
        name!(pass, Option<i64>),
        name!(cpu_time_ms, Option<f64>),
        name!(paused_time_ms, Option<f64>),
        name!(processes, Option<i32>),
        name!(workers_planned, Option<i32>),
        name!(workers_granted, Option<i32>),
        name!(admission_lent, Option<bool>),
        name!(memory_kb, Option<i64>),
        name!(cpu_group, Option<String>),
        name!(predicted_cpu_ms, Option<f64>),
        name!(class, Option<&'static str>),
    ),
> {
    let shared = require_shared();
    let names: std::collections::HashMap<usize, String> = shared
        .groups
        .groups()
        .into_iter()
        .map(|(slot, g)| (slot, g.name))
        .collect();
    // Memory each process's statement reserved, or asks for while it waits.
    let memory: Vec<u64> = shared.read_admission(|_, waiters| {
        waiters
            .iter()
            .map(|w| match w.state {
                WaitState::Queued => w.need_kb,
                _ => w.reserved_kb,
            })
            .collect()
    });
    let mut rows = Vec::new();
    for (procno, entry) in shared.procs().iter().enumerate() {
        let running = entry.running.load(Ordering::Acquire);
        let queued = entry.queued.load(Ordering::Acquire);
        if (running == 0 && queued == 0) || !shared.is_live(procno) {
            continue;
        }
        let slot = entry.group.load(Ordering::Acquire) as usize;
        let nonzero = |v: i64| (v != 0).then_some(v);
        let query = shared.query_of(entry);
        // Its own backend is shown to a session whatever role it SET: the session
        // may go back to the one it logged in as.
        let visible = crate::pg::my_procno() == Some(procno)
            || crate::pg::may_read_stats_of(crate::pg::proc_role(procno));
        let shown = |v: Option<i64>| v.filter(|_| visible);
        let query = query.filter(|_| visible);
        let prediction = entry.prediction().filter(|_| visible && query.is_some());
        let state = if queued > 0 {
            "queued"
        } else if entry.paused.load(Ordering::Acquire) != 0 {
            "paused"
        } else {
            "running"
        };
        rows.push((
            entry.pid.load(Ordering::Acquire),
            visible.then_some(names.get(&slot).cloned().unwrap_or_default()),
            visible.then_some(state),
            visible.then_some(running as i32),
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
            visible.then_some(entry.workers_planned.load(Ordering::Relaxed) as i32),
            visible.then_some(entry.workers_granted.load(Ordering::Relaxed) as i32),
            visible.then_some(entry.lease.is_lent()),
            visible.then_some(memory.get(procno).map_or(0, |&kb| kb as i64)),
            query.and_then(|q| names.get(&(q.group.0 as usize)).cloned()),
            prediction.map(|(cpu_us, _)| cpu_us as f64 / 1e3),
            prediction.map(|(_, short)| if short { "short" } else { "long" }),
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
#[pg_extern(parallel_restricted, schema = "pg_stride")]
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
        name!(group_name, Option<String>),
        name!(processes, Option<i32>),
        name!(workers_planned, Option<i32>),
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
        name!(failed, Option<bool>),
    ),
> {
    let shared = require_shared();
    let offset_us = crate::pg::now_timestamp() - (crate::os::monotonic_ns() / 1_000) as i64;
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
                // The group a statement ended in, and whether it failed, would tell
                // others that a runaway-query rule moved or cancelled it, as its times
                // tell how long it ran: hidden alike.
                visible.then(|| shared.groups.name_of(r.group as usize)),
                visible.then_some(r.procs as i32),
                visible.then_some(a.workers_planned as i32),
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
                visible.then_some(r.flags & TraceRecord::ERROR != 0),
            )
        })
        .collect();
    TableIterator::new(rows)
}

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
           s.memory_kb,
           s.cpu_group,
           s.predicted_cpu_ms,
           s.class,
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
    // pgrx finds a `requires` item by the end of its path; reset_stats is in views/mod.rs.
    requires = [activity_state, views::pg_stride::reset_stats],
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
    requires = [trace_records],
);
