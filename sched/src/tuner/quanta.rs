//! The distribution of a trace's per-query quanta: where the d_start candidates come
//! from, the p95 that caps them, and the median the shift detector compares.

use crate::sim::QuerySpec;

/// Morsels (quanta of CPU, the slices the scheduler hands out) per traced query, sorted.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantaProfile {
    morsels: Vec<u64>,
    total: u64,
}

impl QuantaProfile {
    /// The profile of `workload` for quanta of `quantum_ns`. A query's morsels are its
    /// CPU in quanta, rounded up: its last, partial slice is a morsel too.
    pub fn new(workload: &[QuerySpec], quantum_ns: u64) -> Self {
        let quantum = quantum_ns.max(1);
        let mut morsels: Vec<u64> = workload
            .iter()
            .map(|q| q.cpu_ns.div_ceil(quantum))
            .collect();
        morsels.sort_unstable();
        let total = morsels.iter().sum();
        QuantaProfile { morsels, total }
    }

    /// Queries in the profile.
    pub fn len(&self) -> usize {
        self.morsels.len()
    }

    /// True for a profile of no queries.
    pub fn is_empty(&self) -> bool {
        self.morsels.is_empty()
    }

    /// Median morsels per query (the mean of the middle two for an even count); 0 for
    /// an empty profile.
    pub fn median(&self) -> f64 {
        let n = self.morsels.len();
        match n {
            0 => 0.0,
            _ if n % 2 == 1 => self.morsels[n / 2] as f64,
            _ => (self.morsels[n / 2 - 1] + self.morsels[n / 2]) as f64 / 2.0,
        }
    }

    /// Nearest-rank 95th percentile of morsels per query; 0 for an empty profile.
    pub fn p95(&self) -> u64 {
        let n = self.morsels.len();
        if n == 0 {
            return 0;
        }
        let rank = (0.95 * n as f64).ceil() as usize;
        self.morsels[rank.clamp(1, n) - 1]
    }

    /// The smallest `d_start` that leaves at least `share` of all traced morsels
    /// undecayed, where a query's first `d_start` morsels run undecayed (wagner2021 §4:
    /// "the minimal values that ensure that 5 %, 10 %, …, 35 % of the tracked morsels
    /// are executed without decay … computed by sorting the tracked queries by their
    /// duration").
    ///
    /// Undecayed morsels `U(d) = Σ min(m_i, d)` grow piecewise linearly in `d`: between
    /// the k-th and (k+1)-th smallest query it is the morsels of the k smallest plus `d`
    /// for each of the `n - k` others, so one pass over the sorted queries finds `d`.
    pub fn d_start_leaving(&self, share: f64) -> u32 {
        let target = share.clamp(0.0, 1.0) * self.total as f64;
        let n = self.morsels.len();
        let mut below = 0u64; // morsels of the queries smaller than the current one
        for (k, &m) in self.morsels.iter().enumerate() {
            let rest = (n - k) as f64;
            if below as f64 + rest * m as f64 >= target {
                let d = ((target - below as f64) / rest).ceil().max(0.0);
                return d.min(u32::MAX as f64) as u32;
            }
            below += m;
        }
        self.morsels
            .last()
            .map_or(0, |&m| m.min(u32::MAX as u64) as u32)
    }

    /// The d_start starting values of the search: [`Self::d_start_leaving`] each share,
    /// capped at `cap`, without duplicates, ascending.
    pub fn d_start_candidates(&self, shares: &[f64], cap: u32) -> Vec<u32> {
        let mut out: Vec<u32> = shares
            .iter()
            .map(|&s| self.d_start_leaving(s).min(cap))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(cpu_ms: &[u64]) -> QuantaProfile {
        let w: Vec<QuerySpec> = cpu_ms
            .iter()
            .map(|&ms| QuerySpec {
                arrival_ns: 0,
                cpu_ns: ms * 1_000_000,
                group: 0,
                class: String::new(),
                procs: 1,
                pinned_priority: None,
                fingerprint: 0,
            })
            .collect();
        QuantaProfile::new(&w, 2_000_000)
    }

    /// Undecayed morsels at `d`, counted directly.
    fn undecayed(p: &QuantaProfile, d: u32) -> u64 {
        p.morsels.iter().map(|&m| m.min(d as u64)).sum()
    }

    #[test]
    fn morsels_round_up_and_quantiles() {
        let p = profile(&[1, 2, 3, 200, 10]);
        assert_eq!(p.morsels, vec![1, 1, 2, 5, 100]);
        assert_eq!((p.len(), p.median(), p.p95()), (5, 2.0, 100));
        assert_eq!(profile(&[2, 4, 6, 8]).median(), 2.5);
        let empty = profile(&[]);
        assert!(empty.is_empty());
        assert_eq!(
            (empty.median(), empty.p95(), empty.d_start_leaving(0.2)),
            (0.0, 0, 0)
        );
    }

    #[test]
    fn d_start_is_the_smallest_that_leaves_the_share() {
        // 3 short queries of 4 morsels, one of 100: 112 morsels.
        let p = profile(&[8, 8, 8, 200]);
        // 5 %: 5.6 morsels → d = 2 (4 · 2 = 8 ≥ 5.6, 4 · 1 = 4 < 5.6).
        assert_eq!(p.d_start_leaving(0.05), 2);
        // 35 %: 39.2 morsels → beyond the short ones (12), then 12 + d ≥ 39.2 → d = 28.
        assert_eq!(p.d_start_leaving(0.35), 28);
        assert_eq!(p.d_start_leaving(0.0), 0);
        assert_eq!(p.d_start_leaving(1.0), 100);
        for pct in 1..=100 {
            let share = pct as f64 / 100.0;
            let d = p.d_start_leaving(share);
            let need = share * 112.0;
            assert!(undecayed(&p, d) as f64 >= need, "{share}: {d}");
            assert!(
                d == 0 || (undecayed(&p, d - 1) as f64) < need,
                "{share}: {d}"
            );
        }
    }

    #[test]
    fn candidates_for_the_papers_shares_are_capped_and_distinct() {
        let p = profile(&[8, 8, 8, 200]);
        let shares = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35];
        assert_eq!(
            p.d_start_candidates(&shares, 1_000),
            vec![2, 3, 5, 11, 16, 22, 28]
        );
        assert_eq!(p.d_start_candidates(&shares, 10), vec![2, 3, 5, 10]);
    }
}
