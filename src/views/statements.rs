//! The views of the statement histories that predict a statement's CPU:
//! `pg_stride.statements` (one row per fingerprint) and `pg_stride.prediction_quality`
//! (how good the predictions were).

use super::shared_access::require_shared;
use crate::{cpu, shmem};
use pg_stride_sched::predict::{self, ERROR_SPAN};
use pgrx::prelude::*;

/// One row per role and fingerprint (query identifier) with a history, in this database
/// (`shmem::history_scope`): the CPU of its scheduled
/// executions, whose decayed mean is its prediction, and its class: `tiny` when its
/// next execution would take no slot for its first slice in this session
/// (`cpu::history_runs_unscheduled`), else `short` or `long` under the server's decay
/// settings in force (the tuner's while it is on; a group with a `decay_start` of its
/// own classifies by that, as `pg_stride.activity` shows); the `pg_stride.statements`
/// view, readable by members of `pg_read_all_stats` (it shows every role's).
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn statements_state() -> TableIterator<
    'static,
    (
        name!(userid, pg_sys::Oid),
        name!(queryid, i64),
        name!(calls, i64),
        name!(mean_cpu_ms, f64),
        name!(stddev_cpu_ms, f64),
        name!(p95_cpu_ms, f64),
        name!(max_cpu_ms, f64),
        name!(class, &'static str),
        name!(last_seen_us, i64),
    ),
> {
    let shared = require_shared();
    let short_us = shared
        .sched()
        .map_or(f64::INFINITY, |s| predict::short_threshold_us(s.decay()));
    let database = crate::pg::database_oid();
    let histories: Vec<_> = shared.histories.read(|table| {
        table
            .histories()
            .filter(|h| shmem::history_database(h.scope) == database)
            .copied()
            .collect()
    });
    let rows = histories.into_iter().map(move |h| {
        (
            pg_sys::Oid::from(h.scope as u32),
            h.key as i64,
            h.executions.min(i64::MAX as u64) as i64,
            h.mean_us / 1e3,
            h.sd_us() / 1e3,
            h.p95_us() / 1e3,
            h.max_us / 1e3,
            if cpu::history_runs_unscheduled(&h) {
                "tiny"
            } else {
                match predict::Class::of(h.mean_us, short_us) {
                    predict::Class::Short => "short",
                    predict::Class::Long => "long",
                }
            },
            h.last_seen.min(i64::MAX as u64) as i64,
        )
    });
    TableIterator::new(rows.collect::<Vec<_>>())
}

/// How good the predictions were since the server started or `pg_stride.reset_stats()`,
/// counted as each scheduled statement ended, and each one tiny by its history;
/// the `pg_stride.prediction_quality` view.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn prediction_quality_state() -> TableIterator<
    'static,
    (
        name!(short_predicted_short, i64),
        name!(short_predicted_long, i64),
        name!(long_predicted_short, i64),
        name!(long_predicted_long, i64),
        name!(unpredicted, i64),
        name!(from_history, i64),
        name!(fingerprints, i64),
        name!(cost_calibrations, i64),
        name!(cpu_us_per_cost, Option<f64>),
        name!(log2_error, Vec<i64>),
    ),
> {
    let shared = require_shared();
    let row = shared.histories.read(|table| {
        let q = table.quality();
        let m = table.model();
        let n = |v: u64| v.min(i64::MAX as u64) as i64;
        (
            n(q.short_as_short),
            n(q.short_as_long),
            n(q.long_as_short),
            n(q.long_as_long),
            n(q.unpredicted),
            n(q.from_history),
            table.histories().count() as i64,
            n(m.samples),
            m.predict_us(1.0),
            q.log2_error.iter().map(|&v| n(v)).collect::<Vec<_>>(),
        )
    });
    TableIterator::new(std::iter::once(row))
}

// The view's comment names log2_error's elements: 1 to 17 for -8 to 8.
const _: () = assert!(ERROR_SPAN == 8);

extension_sql!(
    r#"
CREATE VIEW pg_stride.statements AS
    SELECT s.userid, s.queryid, s.calls, s.mean_cpu_ms, s.stddev_cpu_ms, s.p95_cpu_ms, s.max_cpu_ms,
           s.class,
           timestamptz '2000-01-01 00:00:00+00' + s.last_seen_us * interval '1 microsecond' AS last_seen
      FROM pg_stride.statements_state() s;
COMMENT ON VIEW pg_stride.statements IS
    'pg_stride: per role and query identifier in this database, the CPU of its executions that reached CPU scheduling (decayed over the last ~32); mean_cpu_ms is the prediction a next execution of that role starts from, class its class under pg_stride.decay_start; join pg_stat_statements on userid and queryid';
REVOKE ALL ON FUNCTION pg_stride.statements_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_stride.statements_state() TO pg_read_all_stats;
GRANT SELECT ON pg_stride.statements TO pg_read_all_stats;

CREATE VIEW pg_stride.prediction_quality AS
    SELECT * FROM pg_stride.prediction_quality_state();
COMMENT ON VIEW pg_stride.prediction_quality IS
    'pg_stride: how the predicted CPU of the scheduled statements that ended compared with what they used; short/long by the threshold of the statement''s group (decay_start quanta of pg_stride.slice); log2_error[i] counts statements whose log2(used / predicted) rounded to i - 9, the first and last element also everything beyond';
GRANT SELECT ON pg_stride.prediction_quality TO PUBLIC;
"#,
    name = "statements_views",
    requires = [statements_state, prediction_quality_state],
);
