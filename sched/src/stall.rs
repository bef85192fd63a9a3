//! Telling a slot holder that is kept off its CPU from one that runs.
//!
//! With slot holders pinned to CPUs of their own, a holder shares its CPU with whatever
//! else the kernel runs there: a backend parsing and planning outside the slots, the
//! client, a kernel thread. EEVDF gives each its share, so a holder of a short query can
//! wait milliseconds behind such a process while a holder of a decayed analytical query
//! runs undisturbed on the other CPU — the opposite of what the priorities say. The
//! lower-priority holder can see it: at its slice ends it samples the CPU clock of each
//! holder of a higher priority, and one whose clock and check-in count stayed the same
//! for [`STALL_NS`] is stalled. The lower-priority holder then swaps CPUs with it, if it
//! had its own CPU to itself meanwhile (it ran at least three quarters of the time): a
//! stalled holder moved onto a CPU that another process keeps busy as well would only
//! stall there.
//!
//! Why a clock that does not move, rather than one that moves slowly: the kernel
//! brings another process's CPU clock up to date only at its context switches and at
//! the scheduler tick (every 4 ms at 250 Hz), so a holder that runs all the time shows
//! steps of a tick and nothing in between. A holder that ran for none of a window
//! longer than a tick, though, shows no step in it. Unchanged check-ins exclude a holder
//! that paused in between: it checks in when it gets its slot back.
//!
//! A holder that shares its CPU rather than loses it — EEVDF alternating it with a
//! kernel thread that has milliseconds of work, a few milliseconds each — keeps
//! reaching its slice ends, only later: its clock moves, slowly. That holder measures
//! it itself, exactly, with its own thread clock: at each slice end it publishes the
//! share of the slice's wall-clock time it ran ([`ran_permille`]), unless it blocked
//! during the slice (I/O, a lock: not the run queue). A lower-priority holder that ran
//! its own last slice nearly alone swaps CPUs with a higher one whose fresh share is
//! below a threshold the caller sets (two thirds in the extension;
//! [`contended`]).

/// What a holder of a higher priority looked like at a slice end of the observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderSample {
    /// Process number of the holder.
    pub procno: usize,
    /// Its operating-system pid: a process number is reused by the next backend.
    pub pid: i32,
    /// When the sample was taken, ns of a monotonic clock.
    pub at_ns: u64,
    /// The holder's CPU time then, ns, as the kernel last accounted it.
    pub cpu_ns: u64,
    /// The holder's check-in count then.
    pub checkins: u32,
    /// The observer's own thread CPU time then, ns (exact: its own clock).
    pub observer_cpu_ns: u64,
}

/// How long a holder's clock must stay still for it to be stalled: more than a
/// scheduler tick at 250 Hz and above.
pub const STALL_NS: u64 = 5_000_000;

/// Whether the holder looks the same in `now` as in `first`: the same process, the same
/// CPU time and no check-in.
pub fn unchanged(first: &HolderSample, now: &HolderSample) -> bool {
    first.procno == now.procno
        && first.pid == now.pid
        && first.cpu_ns == now.cpu_ns
        && first.checkins == now.checkins
}

/// Whether the observer should swap CPUs with the holder, first sampled unchanged as
/// `first` and now as `now`: it has been stalled for [`STALL_NS`], while the observer
/// ran at least three quarters of that time.
pub fn should_swap(first: &HolderSample, now: &HolderSample) -> bool {
    let window = now.at_ns.saturating_sub(first.at_ns);
    let observer_ran = now.observer_cpu_ns.saturating_sub(first.observer_cpu_ns);
    unchanged(first, now)
        && window >= STALL_NS
        && observer_ran.saturating_mul(4) >= window.saturating_mul(3)
}

/// An observer that ran at least this share of its own last slice, in ‰, had its CPU
/// to itself: moving a contended holder there helps it.
pub const CLEAR_PERMILLE: u32 = 900;

/// How old a published share may be and still count, at least: a few slices of the
/// default 2 ms, and five of longer ones. A holder that has not reached a slice end for
/// longer is judged by its clock ([`should_swap`]).
pub const SHARE_FRESH_NS: u64 = 10_000_000;

/// The share of `wall_ns` of wall-clock time during which a process used `cpu_ns` of
/// CPU, in ‰ (at most 1000; 1000 for an empty interval).
pub fn ran_permille(cpu_ns: u64, wall_ns: u64) -> u32 {
    if wall_ns == 0 {
        return 1000;
    }
    (u128::from(cpu_ns) * 1000 / u128::from(wall_ns)).min(1000) as u32
}

/// A holder's share of its last slice as it published it: the share it ran, ‰, and
/// when (0: nothing published).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub ran_permille: u32,
    pub at_ns: u64,
}

/// When a share counts against a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareRule {
    /// A share below this, in ‰, is kept off its CPU (0: the rule is off).
    pub below_permille: u32,
    /// How old a share may be.
    pub fresh_ns: u64,
}

impl ShareRule {
    /// The rule for `below_permille` with slices of `slice_ns`.
    pub fn new(below_permille: u32, slice_ns: u64) -> ShareRule {
        ShareRule {
            below_permille,
            fresh_ns: slice_ns.saturating_mul(5).max(SHARE_FRESH_NS),
        }
    }
}

/// Whether an observer that ran `own_permille` of its last slice should swap CPUs with
/// a holder of a higher priority whose published share is `theirs`: fresh, and below
/// the rule's threshold; `now_ns` on the clock of `theirs.at_ns`.
pub fn contended(theirs: Share, rule: ShareRule, own_permille: u32, now_ns: u64) -> bool {
    theirs.at_ns != 0
        && now_ns.saturating_sub(theirs.at_ns) <= rule.fresh_ns
        && theirs.ran_permille < rule.below_permille
        && own_permille >= CLEAR_PERMILLE
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A sample at `at_ms` of a holder with `cpu_ms`, the observer having run `own_ms`.
    fn sample(at_ms: f64, cpu_ms: f64, own_ms: f64) -> HolderSample {
        HolderSample {
            procno: 3,
            pid: 100,
            at_ns: (at_ms * 1e6) as u64,
            cpu_ns: (cpu_ms * 1e6) as u64,
            checkins: 7,
            observer_cpu_ns: (own_ms * 1e6) as u64,
        }
    }

    /// Whether a holder first sampled at 0 ms with 10 ms of CPU (the observer at 0 ms)
    /// is to be swapped at `later`.
    fn swaps_at(later: HolderSample) -> bool {
        should_swap(&sample(0.0, 10.0, 0.0), &later)
    }

    #[test]
    fn a_clock_still_for_longer_than_a_tick_is_a_stall() {
        assert!(swaps_at(sample(5.0, 10.0, 5.0)));
        assert!(!swaps_at(sample(4.9, 10.0, 4.9)));
        // One tick's step means it ran, however little the step says.
        assert!(!swaps_at(sample(9.0, 14.0, 9.0)));
    }

    #[test]
    fn only_an_observer_that_had_its_cpu_to_itself_swaps() {
        assert!(swaps_at(sample(8.0, 10.0, 6.0)));
        assert!(!swaps_at(sample(8.0, 10.0, 5.9)));
    }

    #[test]
    fn another_process_or_a_check_in_between_is_no_stall() {
        let (a, b) = (sample(0.0, 10.0, 0.0), sample(6.0, 10.0, 6.0));
        assert!(unchanged(&a, &b) && should_swap(&a, &b));
        for other in [
            HolderSample { pid: 101, ..b },
            HolderSample { procno: 4, ..b },
            HolderSample { checkins: 8, ..b },
        ] {
            assert!(!unchanged(&a, &other) && !should_swap(&a, &other));
        }
    }

    #[test]
    fn the_share_of_a_slice_a_holder_ran() {
        assert_eq!(ran_permille(2_000_000, 4_000_000), 500);
        assert_eq!(ran_permille(2_000_000, 2_000_000), 1000);
        // The two clocks are read a little apart: never above the whole.
        assert_eq!(ran_permille(2_000_100, 2_000_000), 1000);
        assert_eq!(ran_permille(0, 0), 1000);
        assert_eq!(ran_permille(u64::MAX, u64::MAX), 1000);
    }

    #[test]
    fn a_fresh_low_share_beside_a_clear_observer_is_contended() {
        let now = 100_000_000;
        let share = |ran_permille, age| Share {
            ran_permille,
            at_ns: now - age,
        };
        let rule = ShareRule::new(670, 2_000_000);
        assert!(contended(share(500, 1_000_000), rule, 950, now));
        assert!(contended(share(669, SHARE_FRESH_NS), rule, 900, now));
        // Ran the threshold or more: left alone; a threshold of 0 swaps nobody.
        assert!(!contended(share(670, 1_000_000), rule, 1000, now));
        assert!(!contended(
            share(0, 1_000_000),
            ShareRule::new(0, 2_000_000),
            1000,
            now
        ));
        // The observer shares its own CPU: moving there would not help.
        assert!(!contended(share(300, 1_000_000), rule, 899, now));
        // Stale, or never published.
        assert!(!contended(share(300, SHARE_FRESH_NS + 1), rule, 1000, now));
        assert!(!contended(
            Share {
                ran_permille: 300,
                at_ns: 0
            },
            rule,
            1000,
            now
        ));
    }

    #[test]
    fn longer_slices_keep_a_share_fresh_for_five_of_them() {
        assert_eq!(ShareRule::new(670, 2_000_000).fresh_ns, SHARE_FRESH_NS);
        assert_eq!(ShareRule::new(670, 10_000_000).fresh_ns, 50_000_000);
        let now = 100_000_000;
        let old = Share {
            ran_permille: 300,
            at_ns: now - 40_000_000,
        };
        assert!(contended(old, ShareRule::new(670, 10_000_000), 1000, now));
        assert!(!contended(old, ShareRule::new(670, 2_000_000), 1000, now));
    }

    proptest! {
        /// A share is a share, and the observer's own must be clear.
        #[test]
        fn shares_stay_in_range_and_a_busy_observer_never_swaps(
            cpu in 0u64..1 << 40, wall in 0u64..1 << 40, their in 0u32..=1000,
            below in 0u32..=1000, own in 0u32..CLEAR_PERMILLE, now in 0u64..1 << 40,
            age in 0u64..1 << 30,
        ) {
            prop_assert!(ran_permille(cpu, wall) <= 1000);
            let theirs = Share { ran_permille: their, at_ns: now.saturating_sub(age) };
            prop_assert!(!contended(theirs, ShareRule::new(below, 2_000_000), own, now));
        }

        /// A holder whose clock moved is never stalled, whatever the window; and clocks
        /// read out of order (a sample from before the first) never make a stall by
        /// underflow.
        #[test]
        fn a_moving_clock_or_a_backward_window_is_never_a_stall(
            at in 0u64..1 << 40, window in 0u64..1 << 32, step in 1u64..1 << 24,
        ) {
            let first = HolderSample {
                procno: 1, pid: 9, at_ns: at, cpu_ns: at, checkins: 0, observer_cpu_ns: at,
            };
            let moved = HolderSample {
                at_ns: at + window, cpu_ns: at + step, observer_cpu_ns: at + window, ..first
            };
            prop_assert!(!should_swap(&first, &moved));
            let back = HolderSample { at_ns: at.saturating_sub(window), ..first };
            prop_assert!(!should_swap(&first, &back));
        }
    }
}
