//! The `pg_stride.groups` view: each resource group's settings, statement counts, queue
//! times and CPU time.

use super::shared_access::require_shared;
use crate::shmem;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

/// One row per resource group; the `pg_stride.groups` view.
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn groups_state() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(weight, i32),
        name!(max_concurrency, i32),
        name!(max_queued, Option<i32>),
        name!(queue_timeout, Option<i32>),
        name!(memory_budget, Option<i32>),
        name!(reject_oversized, bool),
        name!(max_parallel_workers, Option<i32>),
        name!(priority_initial, Option<i32>),
        name!(priority_min, Option<i32>),
        name!(decay_lambda, Option<f64>),
        name!(decay_start, Option<i32>),
        name!(pinned, bool),
        name!(rules, String),
        name!(rules_dry_run, bool),
        name!(active, i64),
        name!(queued, i64),
        name!(admitted_total, i64),
        name!(timed_out_total, i64),
        name!(rejected_total, i64),
        name!(over_limit_total, i64),
        name!(queue_time_total_ms, f64),
        name!(queue_time_p50_ms, Option<f64>),
        name!(queue_time_p99_ms, Option<f64>),
        name!(cpu_time_ms, f64),
        name!(memory_reserved_kb, i64),
        name!(memory_waiting_kb, i64),
        name!(rule_hits_total, i64),
    ),
> {
    let shared = require_shared();
    let mut active = [0i64; shmem::MAX_GROUPS];
    // Admissions that processes counted and have not added to the group's counter.
    let mut pending = [0u64; shmem::MAX_GROUPS];
    let mut queued = [0i64; shmem::MAX_GROUPS];
    for (procno, entry) in shared.procs().iter().enumerate() {
        if shared.is_live(procno) {
            let slot = (entry.group.load(Ordering::Acquire) as usize).min(shmem::MAX_GROUPS - 1);
            active[slot] += i64::from(entry.running.load(Ordering::Acquire));
            queued[slot] += i64::from(entry.queued.load(Ordering::Acquire));
            if let Some((of, n)) = crate::admission::pending_admissions(shared, entry) {
                pending[of] += n;
            }
        }
    }
    let memory = shared.read_admission(|queue, _| queue.groups.map(|g| g.memory));
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
                s.max_queued,
                s.queue_timeout,
                s.memory_budget,
                s.reject_oversized,
                s.max_parallel_workers,
                s.priority_initial,
                s.priority_min,
                s.decay_lambda,
                s.decay_start,
                s.pinned,
                s.rules.to_string(),
                s.rules_dry_run,
                active[slot],
                queued[slot],
                admitted as i64,
                c.timed_out.load(Ordering::Relaxed) as i64,
                c.rejected.load(Ordering::Relaxed) as i64,
                c.over_limit.load(Ordering::Relaxed) as i64,
                ms(c.queue_time_us.load(Ordering::Relaxed)),
                c.queue_time_quantile_us(admitted, 0.5).map(ms),
                c.queue_time_quantile_us(admitted, 0.99).map(ms),
                c.cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
                memory[slot].reserved_kb as i64,
                memory[slot].waiting_kb as i64,
                c.rule_hits.load(Ordering::Relaxed) as i64,
            )
        })
        .collect();
    TableIterator::new(rows)
}

extension_sql!(
    r#"
CREATE VIEW pg_stride.groups AS
    SELECT * FROM pg_stride.groups_state() ORDER BY name;
COMMENT ON VIEW pg_stride.groups IS
    'pg_stride resource groups: settings (NULL = the server-wide setting) and statement counts';
GRANT SELECT ON pg_stride.groups TO PUBLIC;
"#,
    name = "groups_view",
    requires = [groups_state],
);
