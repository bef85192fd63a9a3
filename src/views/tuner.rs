//! The `pg_stride.tuner` view: the tuner's recent refreshes.

use super::shared_access::require_shared;
use pg_stride_sched::tuner::Check;
use pgrx::prelude::*;

/// One row per recent refresh of the tuner, oldest first; the `pg_stride.tuner`
/// view.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
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
    requires = [tuner_state],
);
