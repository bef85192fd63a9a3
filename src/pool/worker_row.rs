//! A row of the `pg_stride.pool` view, on every major.

use pgrx::pg_sys;

/// One pool worker, as the `pg_stride.pool` view shows it.
pub struct WorkerRow {
    pub pid: i32,
    pub database: pg_sys::Oid,
    /// `starting`, `idle`, `busy` or `retiring`.
    pub state: &'static str,
    /// The leader of the fragment it runs, or ran last.
    pub leader_pid: Option<i32>,
    pub fragments: i64,
    pub errors: i64,
    /// The last fragment's set-up, ticket posted → plan fragment started (µs).
    pub last_setup_us: Option<f64>,
    /// The authenticated user of the leaders it serves (InvalidOid: none yet): whose
    /// statistics its leader, errors and set-up time are.
    pub serves: pg_sys::Oid,
}
