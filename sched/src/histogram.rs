//! The queue-time histogram of a resource group: power-of-two buckets of µs, its
//! quantiles (`queue_time_p50_ms`, `queue_time_p99_ms` of `pg_stride.groups`) and its
//! cumulative counts at chosen bounds (`pg_stride.queue_time_histogram()`).
//!
//! Bucket `i > 0` counts waits of `[2^(i-1), 2^i)` µs, bucket 0 waits under 1 µs.
//! Statements admitted at once are not counted in bucket 0 when they are admitted: that
//! would be an atomic add on a line every backend shares, for every uncontended
//! statement. Bucket 0 is derived instead, as the admitted statements the other buckets
//! do not account for.

/// Number of buckets; the last one also takes every longer wait (2^38 µs ≈ 3 days).
pub const BUCKETS: usize = 40;

/// Bucket of a wait of `us` microseconds.
pub fn bucket(us: u64) -> usize {
    ((u64::BITS - us.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// The `q`-quantile, in µs, of the waits of `admitted` statements whose waits of 1 µs
/// or more are counted in `counts` (bucket 0 is ignored and derived, see the module
/// comment): the upper bound of the bucket it falls in, so within a factor of 2. `None`
/// without data.
pub fn quantile_us(counts: &[u64; BUCKETS], admitted: u64, q: f64) -> Option<u64> {
    let waited: u64 = counts[1..].iter().sum();
    let at_once = admitted.saturating_sub(waited);
    let total = waited + at_once;
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = at_once;
    if seen >= rank {
        return Some(0);
    }
    for (i, count) in counts.iter().enumerate().skip(1) {
        seen += count;
        if seen >= rank {
            return Some(1u64 << i);
        }
    }
    None
}

/// The cumulative counts of the waits of `admitted` statements (counted as for
/// [`quantile_us`], bucket 0 derived) at the bounds `bounds`: for each bucket index `i`
/// of `bounds`, the statements that waited less than 2^i µs, i.e. buckets `0..=i`; and
/// the total, which the last count never exceeds. `bounds` increase and stay below
/// `BUCKETS - 1` (the last bucket has no upper bound).
pub fn cumulative(counts: &[u64; BUCKETS], admitted: u64, bounds: &[usize]) -> (Vec<u64>, u64) {
    debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(bounds.iter().all(|&b| b < BUCKETS - 1));
    let waited: u64 = counts[1..].iter().sum();
    let at_once = admitted.saturating_sub(waited);
    let mut below = at_once;
    let mut next = 1;
    let at_bounds = bounds
        .iter()
        .map(|&bound| {
            while next <= bound {
                below += counts[next];
                next += 1;
            }
            below
        })
        .collect();
    (at_bounds, at_once + waited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(2), 2);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(4), 3);
        assert_eq!(bucket(1023), 10);
        assert_eq!(bucket(1024), 11);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_count_statements_admitted_at_once() {
        let mut counts = [0u64; BUCKETS];
        assert_eq!(quantile_us(&counts, 0, 0.5), None);
        // 10 admitted, none waited.
        assert_eq!(quantile_us(&counts, 10, 0.99), Some(0));
        // 10 admitted, 2 waited ~1.5 ms: the p50 is 0, the p99 the bucket's bound.
        counts[bucket(1500)] = 2;
        assert_eq!(quantile_us(&counts, 10, 0.5), Some(0));
        assert_eq!(quantile_us(&counts, 10, 0.99), Some(2048));
        // More waits counted than admissions (counters read a moment apart): no
        // negative bucket 0.
        assert_eq!(quantile_us(&counts, 1, 0.5), Some(2048));
    }

    #[test]
    fn quantile_rank_is_clamped() {
        let mut counts = [0u64; BUCKETS];
        counts[3] = 1;
        counts[5] = 1;
        assert_eq!(quantile_us(&counts, 2, 0.0), Some(8));
        assert_eq!(quantile_us(&counts, 2, 1.0), Some(32));
    }

    #[test]
    fn cumulative_counts_derive_bucket_0_and_add_up() {
        let mut counts = [0u64; BUCKETS];
        let bounds = [0, 10, 12];
        assert_eq!(cumulative(&counts, 0, &bounds), (vec![0, 0, 0], 0));
        // 5 admitted at once: under every bound.
        assert_eq!(cumulative(&counts, 5, &bounds), (vec![5, 5, 5], 5));
        // Waits of 1.5 ms (bucket 11, below 2^12 µs but not 2^10) and of 1 s (beyond the
        // last bound: only in the total); 1 µs waits are above the 2^0 bound.
        counts[bucket(1500)] = 2;
        counts[bucket(1_000_000)] = 1;
        counts[bucket(1)] = 1;
        assert_eq!(cumulative(&counts, 10, &bounds), (vec![6, 7, 9], 10));
        // A wait of exactly 2^10 µs is not below the 2^10 bound.
        let mut exact = [0u64; BUCKETS];
        exact[bucket(1024)] = 1;
        assert_eq!(cumulative(&exact, 1, &[10, 11]), (vec![0, 1], 1));
        // More waits counted than admissions (counters read a moment apart): no
        // negative bucket 0, and the total covers the waits.
        assert_eq!(cumulative(&counts, 1, &bounds), (vec![0, 1, 3], 4));
    }
}
