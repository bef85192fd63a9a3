//! Concurrency hint (psaroudakis2013 §6).
//!
//! Every 50 ms the scheduler worker samples the number of free CPU slots and folds it
//! into an exponential moving average with weight `a = 0.5`:
//!
//! ```text
//! free = max(0, cpu_slots − active)
//! hint = a · free + (1 − a) · hint
//! ```
//!
//! Because the average remembers all past samples, it is reset to the slot count when it
//! climbs above 90 % of it (the paper's threshold). A partitionable operation — for
//! pg_stride, a Gather deciding how many parallel workers to launch — creates at most
//! `hint` tasks: under high concurrency the system is already busy and extra workers only
//! add overhead, while at low concurrency the full degree is granted.

/// Weight of the newest sample, `a` (§6).
pub const HINT_ALPHA: f64 = 0.5;
/// Sampling interval of the paper, in ms (§6).
pub const HINT_INTERVAL_MS: u64 = 50;
/// Above this fraction of the slot count the average is reset to the slot count (§6).
pub const HINT_RESET_FRACTION: f64 = 0.9;

/// The next hint after sampling `free` free slots out of `slots`.
pub fn next_hint(previous: f64, free: u32, slots: u32, alpha: f64) -> f64 {
    let hint = alpha * free as f64 + (1.0 - alpha) * previous;
    if hint > HINT_RESET_FRACTION * slots as f64 {
        slots as f64
    } else {
        hint
    }
}

/// What [`grant_workers`] adds to the hint before truncating it to whole slots.
pub const GRANT_ROUNDING: f64 = 0.25;

/// The grant rule for one Gather: the workers it planned, limited by the hint in whole
/// slots (rounded up from three quarters), by the slots free right now (`free_now`: not
/// counting the asking statement, which holds none at ExecutorStart, less the one its
/// leader takes when it scans beside its workers) and by what is left of its group's
/// parallel-worker cap.
///
/// The hint counts statements, not processes (see `SchedShared::sample_hint`): its
/// samples counted the asking client's own earlier statements, one slot each, and none
/// of their workers. A client alone on two slots therefore reads one free, the slot
/// beside its own, and gets a worker for it; on a server where statements outnumber
/// the slots, the hint stays below 1 and no Gather gets a worker, even in the moments
/// between statements when slots are free: parallel workers then only take CPU from
/// other statements, and cost their start-up. Not truncated: the average only comes
/// back to a whole number from below, and truncated, one sample that caught another
/// statement would cost a client alone a worker for the 53 samples (2.6 s) the average
/// takes to climb back; it is back above three quarters after the next sample. Not
/// rounded from one half either: under four clients on two slots, one sample that
/// caught three of them between statements would open a 50-ms window of grants.
pub fn grant_workers(requested: u32, hint: f64, free_now: u32, group_room: u32) -> u32 {
    let by_hint = if hint.is_finite() && hint > 0.0 {
        (hint + GRANT_ROUNDING).floor().min(u32::MAX as f64) as u32
    } else {
        0
    };
    requested.min(by_hint).min(free_now).min(group_room)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ema_with_equal_weight() {
        // 16 slots, hint 8, 4 free: 0.5·4 + 0.5·8 = 6.
        assert_eq!(next_hint(8.0, 4, 16, HINT_ALPHA), 6.0);
        // Converges towards a steady sample.
        let mut h = 16.0;
        for _ in 0..30 {
            h = next_hint(h, 2, 16, HINT_ALPHA);
        }
        assert!((h - 2.0).abs() < 1e-6);
    }

    #[test]
    fn resets_to_slot_count_above_90_percent() {
        // 0.5·16 + 0.5·14 = 15 > 14.4: reset to 16.
        assert_eq!(next_hint(14.0, 16, 16, HINT_ALPHA), 16.0);
        // 0.5·14 + 0.5·14 = 14 <= 14.4: kept.
        assert_eq!(next_hint(14.0, 14, 16, HINT_ALPHA), 14.0);
    }

    #[test]
    fn grant_is_the_minimum_of_plan_hint_free_slots_and_cap() {
        assert_eq!(grant_workers(4, 6.7, 16, 10), 4);
        assert_eq!(grant_workers(8, 6.7, 16, 10), 6);
        assert_eq!(grant_workers(8, 6.8, 16, 10), 7);
        assert_eq!(grant_workers(8, 6.7, 16, 2), 2);
        assert_eq!(grant_workers(8, 6.7, 3, 10), 3);
        assert_eq!(grant_workers(8, f64::NAN, 16, 10), 0);
    }

    #[test]
    fn a_lone_client_is_not_refused_for_its_own_slot() {
        // Two slots, one client looping a parallel query: the samples see its
        // statement, one slot, and not its workers; the hint stays between 1 and 2.
        let mut h = 2.0;
        for busy in [true, true, false, true, true, true, false, true] {
            h = next_hint(h, if busy { 1 } else { 2 }, 2, HINT_ALPHA);
            assert!(grant_workers(2, h, 1, 10) == 1, "hint {h}");
        }
    }

    #[test]
    fn one_sample_of_another_statement_costs_a_lone_client_one_grant_at_most() {
        // A client alone on two slots, always executing (long statements back to back):
        // one sample also catches another statement, and the next one gives the worker
        // back.
        let mut h = next_hint(1.0, 0, 2, HINT_ALPHA);
        assert_eq!(grant_workers(2, h, 1, 10), 0, "hint {h}");
        h = next_hint(h, 1, 2, HINT_ALPHA);
        assert_eq!(grant_workers(2, h, 1, 10), 1, "hint {h}");
        // Two in a row: two samples to get it back.
        h = next_hint(next_hint(1.0, 0, 2, HINT_ALPHA), 0, 2, HINT_ALPHA);
        h = next_hint(h, 1, 2, HINT_ALPHA);
        assert_eq!(grant_workers(2, h, 1, 10), 0, "hint {h}");
        h = next_hint(h, 1, 2, HINT_ALPHA);
        assert_eq!(grant_workers(2, h, 1, 10), 1, "hint {h}");
    }

    #[test]
    fn more_statements_than_slots_get_no_workers() {
        // Four clients on two slots: every sample reads no slot free, and a Gather gets
        // no worker even at a moment when a slot happens to be free.
        let mut h = 2.0;
        for _ in 0..10 {
            h = next_hint(h, 0, 2, HINT_ALPHA);
        }
        assert!(h < 0.01);
        assert_eq!(grant_workers(2, h, 1, 10), 0);
        // One sample that caught three of them between statements opens no window.
        assert_eq!(grant_workers(2, next_hint(h, 1, 2, HINT_ALPHA), 1, 10), 0);
        assert_eq!(grant_workers(2, 0.0, 2, 10), 0);
    }

    #[test]
    fn a_busy_server_grants_nothing() {
        // Every slot held now: no worker, whatever the hint says.
        assert_eq!(grant_workers(2, 0.2, 0, 10), 0);
        assert_eq!(grant_workers(2, 8.0, 0, 10), 0);
    }
}
