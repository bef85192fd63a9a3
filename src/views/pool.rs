//! The pool's views: `pg_stride.pool` (its workers), `pg_stride.pool_fallbacks` (Gathers
//! that ran without it) and the counters of `pg_stride.pool_counters()`.

use super::shared_access::require_shared;
use pgrx::prelude::*;

/// One row per pool worker; the `pg_stride.pool` view. Its leader, errors and set-up
/// time are NULL to a role that may not read the statistics of the role the worker
/// serves (pg::may_read_stats_of), as pg_stat_activity hides a parallel worker's
/// leader.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn pool_workers() -> TableIterator<
    'static,
    (
        name!(pid, i32),
        name!(database, pg_sys::Oid),
        name!(state, &'static str),
        name!(leader_pid, Option<i32>),
        name!(fragments, i64),
        name!(errors, Option<i64>),
        name!(last_setup_us, Option<f64>),
    ),
> {
    require_shared();
    TableIterator::new(crate::pool::workers().into_iter().map(|w| {
        let visible = crate::pg::may_read_stats_of(w.serves);
        (
            w.pid,
            w.database,
            w.state,
            w.leader_pid.filter(|_| visible),
            w.fragments,
            Some(w.errors).filter(|_| visible),
            w.last_setup_us.filter(|_| visible),
        )
    }))
}

/// Gathers that ran without the pool under `parallel_mode = pool`, by database and
/// reason; the `pg_stride.pool_fallbacks` view.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
fn pool_fallback_counts() -> TableIterator<
    'static,
    (
        name!(database, pg_sys::Oid),
        name!(reason, &'static str),
        name!(gathers, i64),
    ),
> {
    require_shared();
    TableIterator::new(crate::pool::fallbacks())
}

/// The pool's counters since the server started: Gathers pooled, tickets, fragments
/// by outcome, workers started and retired, and the summed phase times of the
/// fragments (`ns_*`).
#[pg_extern(parallel_restricted, schema = "pg_stride")]
fn pool_counters() -> TableIterator<'static, (name!(name, &'static str), name!(value, i64))> {
    require_shared();
    TableIterator::new(crate::pool::counters())
}

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
    requires = [pool_workers, pool_fallback_counts],
);
