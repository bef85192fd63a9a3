//! Decaying query priorities (wagner2021 §3.2).
//!
//! A query starts at priority `p0`. After it has received `d_start` quanta of CPU, every
//! further quantum multiplies its priority by `λ`, never below `p_min` (Eq. 2):
//!
//! ```text
//! p_{i+1} = p_i                      if i <  d_start
//!         = max(p_min, λ · p_i)      if i >= d_start
//! ```
//!
//! Short queries therefore finish while their priority is still high; long ones sink
//! towards `p_min`, which is what keeps them from starving. The paper fixes `p0 = 10^4`
//! and `p_min = 100` (§4) and tunes `λ` and `d_start`; the quantum is the target slice
//! (§3.2, "we set the update quantum t to t_max"). A resource group may set its own `p0`
//! and `p_min` ("per-user priority", §3.2 custom priorities (2)) and its own `λ` and
//! `d_start`; a query may instead be pinned to a static priority (§3.2 custom
//! priorities (1)).

/// Initial priority `p0` of the paper (§4).
pub const P0: u32 = 10_000;
/// Lowest priority `p_min` of the paper (§4).
pub const P_MIN: u32 = 100;

/// The decay hyperparameters, shared by all queries (the tuner changes `lambda` and
/// `d_start` at run time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecayParams {
    /// Multiplier per quantum once decay has started, in `[0, 1]`.
    pub lambda: f64,
    /// Number of quanta a query receives before its priority starts to decay.
    pub d_start: u32,
    /// CPU time of one quantum, in ns.
    pub quantum_ns: u64,
}

impl Default for DecayParams {
    /// `λ = 0.9` is the tuner's first starting value (§4); `d_start = 8` quanta of 2 ms
    /// lets queries of up to ~16 ms of CPU run undecayed.
    fn default() -> Self {
        DecayParams {
            lambda: 0.9,
            d_start: 8,
            quantum_ns: 2_000_000,
        }
    }
}

/// A query's priority bounds after its group's scaling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityRange {
    /// Initial priority.
    pub p0: u32,
    /// Lowest priority.
    pub p_min: u32,
}

impl PriorityRange {
    /// A range from `p0` down to `p_min`; both stay at least 1 and `p_min` at most `p0`.
    pub fn new(p0: u32, p_min: u32) -> Self {
        let p0 = p0.max(1);
        PriorityRange {
            p0,
            p_min: p_min.clamp(1, p0),
        }
    }
}

impl Default for PriorityRange {
    /// The paper's range (§4).
    fn default() -> Self {
        PriorityRange::new(P0, P_MIN)
    }
}

impl DecayParams {
    /// Priority of a query that has received `quanta` full quanta of CPU.
    ///
    /// Closed form of Eq. 2: `max(p_min, p0 · λ^(quanta - d_start))` once
    /// `quanta > d_start`. Being a pure function of the CPU received, it gives the same
    /// answer to every process of the query that computes it, in any order.
    pub fn priority_after(&self, range: PriorityRange, quanta: u64) -> u32 {
        let steps = quanta.saturating_sub(self.d_start as u64);
        if steps == 0 || self.lambda >= 1.0 {
            return range.p0;
        }
        // λ^steps underflows to 0 long before 2^20 steps for any λ < 1.
        let factor = self.lambda.max(0.0).powi(steps.min(1 << 20) as i32);
        let p = (range.p0 as f64 * factor) as u32;
        p.max(range.p_min).min(range.p0)
    }

    /// Number of full quanta in `cpu_ns`.
    #[inline]
    pub fn quanta(&self, cpu_ns: u64) -> u64 {
        cpu_ns / self.quantum_ns.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: PriorityRange = PriorityRange {
        p0: P0,
        p_min: P_MIN,
    };

    #[test]
    fn no_decay_before_d_start() {
        let d = DecayParams {
            lambda: 0.5,
            d_start: 3,
            quantum_ns: 1,
        };
        for q in 0..=3 {
            assert_eq!(d.priority_after(RANGE, q), P0);
        }
        assert_eq!(d.priority_after(RANGE, 4), P0 / 2);
        assert_eq!(d.priority_after(RANGE, 5), P0 / 4);
    }

    #[test]
    fn decay_stops_at_p_min() {
        let d = DecayParams {
            lambda: 0.5,
            d_start: 0,
            quantum_ns: 1,
        };
        assert_eq!(d.priority_after(RANGE, 1_000), P_MIN);
        assert_eq!(d.priority_after(RANGE, u64::MAX), P_MIN);
        let zero = DecayParams { lambda: 0.0, ..d };
        assert_eq!(zero.priority_after(RANGE, 1), P_MIN);
    }

    #[test]
    fn matches_the_recurrence() {
        let d = DecayParams {
            lambda: 0.93,
            d_start: 2,
            quantum_ns: 1,
        };
        let mut p = P0 as f64;
        for i in 0..200u64 {
            if i >= d.d_start as u64 {
                p = (0.93 * p).max(P_MIN as f64);
            }
            let closed = d.priority_after(RANGE, i + 1) as f64;
            assert!((closed - p).abs() <= 1.0, "quantum {i}: {closed} vs {p}");
        }
    }

    #[test]
    fn lambda_one_means_no_decay() {
        let d = DecayParams {
            lambda: 1.0,
            d_start: 0,
            quantum_ns: 1,
        };
        assert_eq!(d.priority_after(RANGE, 10_000), P0);
    }

    #[test]
    fn a_range_keeps_its_bounds_ordered_and_positive() {
        assert_eq!(
            PriorityRange::new(500, 20),
            PriorityRange { p0: 500, p_min: 20 }
        );
        assert_eq!(
            PriorityRange::new(50, 200),
            PriorityRange { p0: 50, p_min: 50 }
        );
        assert_eq!(PriorityRange::new(0, 0), PriorityRange { p0: 1, p_min: 1 });
        assert_eq!(PriorityRange::default(), RANGE);
    }
}
