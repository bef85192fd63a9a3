//! Adaptive slice length (wagner2021 §3.1, "adaptive morsel execution").
//!
//! A process checks in with the scheduler every `N` tuples. Reading the CPU clock is a
//! system call, so it is read only when such a chunk of `N` tuples is done, never per
//! tuple; the tuple countdown itself lives in the caller. [`SliceClock`] picks `N` so
//! that a slice — the CPU time between two scheduler check-ins — is close to the target
//! `t_max` (2 ms by default):
//!
//! * **startup**: chunks of `C0 = 16, 32, 64, …` tuples; the next, doubled chunk is run
//!   inside the same slice only if its expected time `2·t_{i-1}` fits into what is left
//!   of the target (`t_max − Σ t_k`). When it does not, the slice ends and the last
//!   chunk's throughput becomes the first estimate `T`.
//! * **default**: one chunk of `T · t_max` tuples per slice; its measured throughput
//!   `T̂` updates the estimate `T' = α·T̂ + (1 − α)·T` with `α = 0.8`.
//!
//! The paper's shutdown state (photo finish of the last morsels) needs the remaining
//! tuple count of a pipeline, which a PostgreSQL scan does not know; it is left out.

/// First startup chunk, `C0` (§3.1).
pub const C0: u32 = 16;
/// Weight of the newest throughput measurement, `α` (§3.1).
pub const ALPHA: f64 = 0.8;
/// Default target slice `t_max`, in ns (§3.1).
pub const DEFAULT_TARGET_NS: u64 = 2_000_000;
/// Upper bound on a chunk, so that a nonsense estimate cannot pin a process for long.
pub const MAX_CHUNK: u32 = 1 << 30;

/// What the caller does after a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// Startup is still growing chunks inside this slice: run the next chunk without
    /// checking in.
    Continue,
    /// The slice is over: check in with the scheduler (`SchedShared::end_slice`),
    /// charging `used_ns` of CPU.
    SliceEnd {
        /// CPU time of the whole slice.
        used_ns: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Startup { spent_ns: u64 },
    Steady { tuples_per_ns: f64 },
}

/// Per-process chunk sizing; local state, not shared.
#[derive(Clone, Debug)]
pub struct SliceClock {
    target_ns: u64,
    chunk: u32,
    phase: Phase,
}

impl SliceClock {
    /// A clock in the startup state aiming at slices of `target_ns`.
    pub fn new(target_ns: u64) -> Self {
        SliceClock {
            target_ns: target_ns.max(1),
            chunk: C0,
            phase: Phase::Startup { spent_ns: 0 },
        }
    }

    /// Tuples to process before the next call to [`SliceClock::chunk_done`].
    #[inline]
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// The target slice, in ns.
    pub fn target_ns(&self) -> u64 {
        self.target_ns
    }

    /// Changes the target slice (a `pg_stride.slice` reload); the throughput estimate is
    /// kept.
    pub fn set_target_ns(&mut self, target_ns: u64) {
        self.target_ns = target_ns.max(1);
        if let Phase::Steady { tuples_per_ns } = self.phase {
            self.chunk = self.steady_chunk(tuples_per_ns);
        }
    }

    /// Back to startup: the work changed (another query, another scan) and the old
    /// throughput says nothing about it.
    pub fn restart(&mut self) {
        *self = SliceClock::new(self.target_ns);
    }

    /// The chunk of [`SliceClock::chunk`] tuples took `elapsed_ns` of CPU.
    pub fn chunk_done(&mut self, elapsed_ns: u64) -> Checkpoint {
        match self.phase {
            Phase::Startup { spent_ns } => {
                let spent_ns = spent_ns + elapsed_ns;
                let left = self.target_ns.saturating_sub(spent_ns);
                if elapsed_ns.saturating_mul(2) <= left && self.chunk < MAX_CHUNK / 2 {
                    self.chunk *= 2;
                    self.phase = Phase::Startup { spent_ns };
                    Checkpoint::Continue
                } else {
                    self.measure(self.chunk, elapsed_ns);
                    Checkpoint::SliceEnd { used_ns: spent_ns }
                }
            }
            Phase::Steady { .. } => {
                self.measure(self.chunk, elapsed_ns);
                Checkpoint::SliceEnd {
                    used_ns: elapsed_ns,
                }
            }
        }
    }

    /// The slice ends early, `tuples` into the current chunk, after `elapsed_ns` of CPU
    /// since the last check-in (the holder was asked to yield): returns the slice's CPU
    /// time. The partial chunk still measures the throughput, unless it is empty.
    pub fn cut(&mut self, tuples: u32, elapsed_ns: u64) -> u64 {
        let spent_ns = match self.phase {
            Phase::Startup { spent_ns } => spent_ns + elapsed_ns,
            Phase::Steady { .. } => elapsed_ns,
        };
        if tuples > 0 {
            self.measure(tuples, elapsed_ns);
        } else if let Phase::Startup { .. } = self.phase {
            // Nothing measured yet: start the next slice's startup afresh.
            self.phase = Phase::Startup { spent_ns: 0 };
        }
        spent_ns
    }

    /// `tuples` took `elapsed_ns`: the first throughput estimate `T` after startup, or
    /// the next `T' = α·T̂ + (1 − α)·T`; the next slice is one chunk of `T' · t_max`.
    fn measure(&mut self, tuples: u32, elapsed_ns: u64) {
        let measured = tuples as f64 / elapsed_ns.max(1) as f64;
        let estimate = match self.phase {
            Phase::Startup { .. } => measured,
            Phase::Steady { tuples_per_ns } => ALPHA * measured + (1.0 - ALPHA) * tuples_per_ns,
        };
        self.phase = Phase::Steady {
            tuples_per_ns: estimate,
        };
        self.chunk = self.steady_chunk(estimate);
    }

    fn steady_chunk(&self, tuples_per_ns: f64) -> u32 {
        (tuples_per_ns * self.target_ns as f64).clamp(1.0, MAX_CHUNK as f64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs chunks at `ns_per_tuple` until a slice ends; returns the chunk sizes run and
    /// the slice's CPU time.
    fn one_slice(clock: &mut SliceClock, ns_per_tuple: u64) -> (Vec<u32>, u64) {
        let mut chunks = Vec::new();
        loop {
            let n = clock.chunk();
            chunks.push(n);
            if let Checkpoint::SliceEnd { used_ns } = clock.chunk_done(n as u64 * ns_per_tuple) {
                return (chunks, used_ns);
            }
        }
    }

    #[test]
    fn startup_doubles_from_c0_within_the_budget() {
        let mut clock = SliceClock::new(2_000_000);
        // 1 µs per tuple: 16+32+...+512 = 1008 tuples (1.008 ms); the next chunk of
        // 1024 would take 1.024 ms > 0.992 ms left.
        let (chunks, used) = one_slice(&mut clock, 1_000);
        assert_eq!(chunks, vec![16, 32, 64, 128, 256, 512]);
        assert_eq!(used, 1_008_000);
        // Default state: one chunk of T · t_max = 2000 tuples.
        assert_eq!(clock.chunk(), 2_000);
    }

    #[test]
    fn steady_slices_hit_the_target() {
        let mut clock = SliceClock::new(2_000_000);
        one_slice(&mut clock, 300);
        for _ in 0..5 {
            let (chunks, used) = one_slice(&mut clock, 300);
            assert_eq!(chunks.len(), 1);
            assert!((used as i64 - 2_000_000).abs() <= 300, "slice of {used} ns");
        }
    }

    #[test]
    fn follows_a_throughput_change_with_ema() {
        let mut clock = SliceClock::new(2_000_000);
        one_slice(&mut clock, 100); // T = 0.01 tuples/ns
        assert_eq!(clock.chunk(), 20_000);
        // The work gets 4x slower: T̂ = 0.0025, T' = 0.8·0.0025 + 0.2·0.01 = 0.004.
        one_slice(&mut clock, 400);
        assert_eq!(clock.chunk(), 8_000);
        for _ in 0..10 {
            one_slice(&mut clock, 400);
        }
        assert!((clock.chunk() as i64 - 5_000).abs() <= 1);
    }

    #[test]
    fn a_slow_first_chunk_ends_the_slice_at_once() {
        let mut clock = SliceClock::new(2_000_000);
        assert_eq!(
            clock.chunk_done(3_000_000),
            Checkpoint::SliceEnd { used_ns: 3_000_000 }
        );
        assert_eq!(clock.chunk(), 10); // 16 tuples per 3 ms, scaled to 2 ms
    }

    #[test]
    fn a_cut_slice_charges_its_cpu_and_keeps_measuring() {
        let mut clock = SliceClock::new(2_000_000);
        // T = 0.01 tuples/ns: chunks of 20 000. Asked to yield 5 000 tuples (0.5 ms)
        // into the chunk, at the same speed:
        one_slice(&mut clock, 100);
        assert_eq!(clock.cut(5_000, 500_000), 500_000);
        assert_eq!(clock.chunk(), 20_000);
        // Cut during startup: the startup's CPU is charged, and its throughput kept.
        let mut clock = SliceClock::new(2_000_000);
        assert_eq!(clock.chunk_done(16_000), Checkpoint::Continue);
        assert_eq!(clock.cut(10, 10_000), 26_000);
        // 10 tuples per 10 µs, scaled to 2 ms.
        assert_eq!(clock.chunk(), 2_000);
        // Cut before any tuple of a startup: nothing measured, startup again.
        let mut clock = SliceClock::new(2_000_000);
        assert_eq!(clock.cut(0, 7_000), 7_000);
        assert_eq!(clock.chunk(), C0);
        assert_eq!(clock.chunk_done(16_000), Checkpoint::Continue);
    }

    #[test]
    fn restart_and_retarget() {
        let mut clock = SliceClock::new(2_000_000);
        one_slice(&mut clock, 100);
        clock.set_target_ns(1_000_000);
        assert_eq!(clock.chunk(), 10_000);
        clock.restart();
        assert_eq!(clock.chunk(), C0);
        assert_eq!(clock.target_ns(), 1_000_000);
    }
}
