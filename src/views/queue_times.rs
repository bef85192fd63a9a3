//! `pg_stride.queue_time_histogram()`: each resource group's queue times as a histogram
//! with cumulative buckets, in the shape of a Prometheus histogram (the exporter's
//! queries in `contrib/prometheus/queries.yaml` read it).

use super::shared_access::require_shared;
use crate::shmem;
use pg_stride_sched::histogram;
use pgrx::prelude::*;
use std::sync::atomic::Ordering;

/// The buckets of `pg_stride_sched::histogram` whose upper bounds (2^i µs) the histogram
/// reports, each bound counting the waits below it: 2^0 µs (statements admitted at once,
/// so that a quantile of mostly unqueued statements comes out near 0, as
/// `queue_time_p50_ms` does, instead of halfway to the next bound), then every other
/// power of two from 2^10 µs (1.02 ms) to 2^32 µs (71.6 min). The 40 buckets kept would
/// make 40 series per group in Prometheus, most of them always empty (waits under a
/// millisecond are scheduling noise; the longest `queue_timeout` is a day, and waits of
/// more than an hour are rare). With a factor of 4 between bounds, 13 bounds and +Inf
/// cover that range; `histogram_quantile` interpolates within a bucket, so its
/// quantiles are within a factor of 4 where the view's are within 2. Each bound is a
/// bucket boundary, so its count is exact.
const BOUNDS: [usize; 13] = [0, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32];

/// One row per resource group: the upper bounds of its queue-time buckets in seconds
/// (`le_seconds`, +Inf left out), the statements admitted after a wait below each bound
/// (`buckets`, cumulative), the sum of their waits in seconds, and their count (the +Inf
/// bucket: `admitted_total` of `pg_stride.groups`). Statements admitted at once count
/// under every bound, as they count in `queue_time_p50_ms` (histogram bucket 0 is
/// derived from the admissions).
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn queue_time_histogram() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(le_seconds, Vec<f64>),
        name!(buckets, Vec<i64>),
        name!(sum_seconds, f64),
        name!(count, i64),
    ),
> {
    let shared = require_shared();
    let pending = pending_admissions(shared);
    let le_seconds: Vec<f64> = BOUNDS.iter().map(|&i| (1u64 << i) as f64 / 1e6).collect();
    let mut rows: Vec<_> = shared
        .groups
        .groups()
        .into_iter()
        .map(|(slot, g)| {
            let c = shared.groups.counters(slot);
            let admitted = c.admitted.load(Ordering::Relaxed) + pending[slot];
            let counts = std::array::from_fn(|i| c.queue_histogram[i].load(Ordering::Relaxed));
            let (buckets, count) = histogram::cumulative(&counts, admitted, &BOUNDS);
            (
                g.name,
                le_seconds.clone(),
                buckets.into_iter().map(|n| n as i64).collect(),
                c.queue_time_us.load(Ordering::Relaxed) as f64 / 1e6,
                count as i64,
            )
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    TableIterator::new(rows)
}

/// Admissions that live processes counted and have not added to their group's counter
/// yet, by group slot: a group's admissions are its counter's plus these, as in
/// `pg_stride.groups`.
fn pending_admissions(shared: &shmem::Shared) -> [u64; shmem::MAX_GROUPS] {
    let mut pending = [0u64; shmem::MAX_GROUPS];
    for (procno, entry) in shared.procs().iter().enumerate() {
        if shared.is_live(procno) {
            if let Some((of, n)) = crate::admission::pending_admissions(shared, entry) {
                pending[of] += n;
            }
        }
    }
    pending
}

extension_sql!(
    r#"
COMMENT ON FUNCTION pg_stride.queue_time_histogram() IS
    'pg_stride resource groups'' queue times as a histogram: bucket upper bounds in seconds, cumulative counts of the statements admitted below each, sum of the waits in seconds, count of the statements admitted';
"#,
    name = "queue_time_histogram_comment",
    requires = [queue_time_histogram],
);
