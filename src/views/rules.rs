//! The `pg_stride.rule_hits` view: the runaway-query rules statements met lately.

use super::shared_access::require_shared;
use pgrx::prelude::*;

/// One row per recent hit of a runaway-query rule (the last 64), oldest first; the
/// `pg_stride.rule_hits` view. The query id and the value measured are NULL to a role
/// that may not read the statistics of the statement's role (pg::may_read_stats_of), as
/// pg_stat_statements hides another role's query ids and pg_stat_activity its times.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn rule_hits_state() -> TableIterator<
    'static,
    (
        name!(at_us, i64),
        name!(pid, i32),
        name!(query_id, Option<i64>),
        name!(group_name, String),
        name!(rule, String),
        name!(action, &'static str),
        name!(dry_run, bool),
        name!(value, Option<i64>),
    ),
> {
    let rows = require_shared().rule_hits.recent().into_iter().map(|hit| {
        let visible = crate::pg::may_read_stats_of(pg_sys::Oid::from(hit.userid));
        (
            hit.at_us,
            hit.pid,
            (visible && hit.query_id != 0).then_some(hit.query_id as i64),
            hit.group(),
            hit.rule.to_string(),
            hit.rule.action.name(),
            hit.dry_run,
            visible.then_some(hit.value.min(i64::MAX as u64) as i64),
        )
    });
    TableIterator::new(rows.collect::<Vec<_>>())
}

// TimestampTz counts microseconds from 2000-01-01 00:00 UTC.
extension_sql!(
    r#"
CREATE VIEW pg_stride.rule_hits AS
    SELECT timestamptz '2000-01-01 00:00:00+00' + h.at_us * interval '1 microsecond' AS at,
           h.pid, h.query_id, h.group_name AS "group", h.rule, h.action, h.dry_run, h.value
      FROM pg_stride.rule_hits_state() h;
COMMENT ON VIEW pg_stride.rule_hits IS
    'pg_stride: the last 64 runaway-query rules that statements met (value: µs of CPU or elapsed time, rows or temporary bytes when the rule was met)';
GRANT SELECT ON pg_stride.rule_hits TO PUBLIC;
"#,
    name = "rule_hits_view",
    requires = [rule_hits_state],
);
