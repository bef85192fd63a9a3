//! The `pg_stride.rule_hits` view: the runaway-query rules statements met lately.

use super::shared_access::require_shared;
use pgrx::prelude::*;

/// One row per recent hit of a runaway-query rule (the last 64), oldest first; the
/// `pg_stride.rule_hits` view. To a role that may not read the statistics of the
/// statement's role (pg::may_read_stats_of), a hit shows its process only, as
/// pg_stat_activity shows another role's backend without its times or state: when a
/// rule was met, which group it was in and what the rule measured would tell how long
/// another role's statement ran, and its query id what it ran, as pg_stat_statements
/// hides it.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn rule_hits_state() -> TableIterator<
    'static,
    (
        name!(at_us, Option<i64>),
        name!(pid, i32),
        name!(query_id, Option<i64>),
        name!(group_name, Option<String>),
        name!(rule, Option<String>),
        name!(action, Option<&'static str>),
        name!(dry_run, Option<bool>),
        name!(value, Option<i64>),
    ),
> {
    let rows = require_shared().rule_hits.recent().into_iter().map(|hit| {
        let visible = crate::pg::may_read_stats_of(pg_sys::Oid::from(hit.userid));
        (
            visible.then_some(hit.at_us),
            hit.pid,
            (visible && hit.query_id != 0).then_some(hit.query_id as i64),
            visible.then(|| hit.group()),
            visible.then(|| hit.rule.to_string()),
            visible.then_some(hit.rule.action.name()),
            visible.then_some(hit.dry_run),
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
