//! The statements planned tiny that ran long, shared by every backend of the server.
//!
//! A plan is an estimate: a statement whose plan is tiny may read far more than its plan
//! says (stale or correlated statistics, a function that returns more rows than it
//! declares). Such a statement runs outside admission and CPU scheduling until its
//! fingerprint has run long [`LONG_RUNS`] times, anywhere on the server, each within
//! [`LIFETIME_S`] of the one before; from then on, for [`LIFETIME_S`], every backend
//! admits and schedules it. Shared, so that a new connection, or an application that
//! opens one per request, does not start over: a table kept per backend would let such
//! a statement escape admission for ever, one session at a time. Limited in time, so
//! that what no longer holds (statistics brought up to date by ANALYZE) is forgotten: a
//! statement still misestimated then escapes admission for two more runs. What counts
//! as a long run is the caller's (the extension also asks that it touched far more
//! blocks than planned, so that runs slowed by a cold cache or a busy CPU do not count).
//!
//! Asked for every statement whose plan is tiny, so the common case must cost next to
//! nothing. No fingerprint is looked at unless the statement's relation has its bit set
//! in a 64-bit word of the relations of scheduled fingerprints
//! ([`LongRuns::may_be_scheduled`]): one load, 0 until something ran long. Only then is
//! the statement's text fingerprinted and the table searched. The word may keep the bit
//! of an entry that expired until [`LongRuns::sweep`] or a replacement clears it.
//!
//! Lock-free: every field is an atomic, so that the table can live in shared memory
//! beside processes that may die at any instruction. An entry is its key (the relation's
//! bit in its low six bits, so that the two cannot disagree) and its count and time,
//! one word each; a new statement claims an entry by a compare-and-swap of the key.
//! Races can miscount, always towards scheduling sooner: a run counted for the
//! statement that replaced the one that ran, or a replaced statement's count kept for
//! its successor. A relation's bit can be set that no scheduled entry needs
//! (fingerprints computed for nothing), or be missing for one, until the next sweep or
//! the next long run of its statement ([`LongRuns::ran_long`] on an entry already
//! scheduled). A new statement's entry is searched for from a place its key gives, so
//! that backends counting the first runs of the same statement at once find the same
//! entry.

use std::sync::atomic::{AtomicU64, Ordering};

/// Entries of the table. A new statement takes one as `LongRuns::place_for` chooses: a
/// free one if there is any, never a scheduled one while another counts a first run.
pub const ENTRIES: usize = 64;

/// Long runs after which a fingerprint is scheduled: two, so that one run slowed by
/// something other than its plan does not schedule it.
pub const LONG_RUNS: u32 = 2;

/// Seconds a fingerprint stays scheduled after its last long run made it so, and within
/// which a long run must follow the one before to count with it: ten minutes, a few of
/// autovacuum's rounds, which ANALYZE a table whose rows changed.
pub const LIFETIME_S: u32 = 600;

#[repr(C)]
struct Entry {
    /// The statement's key ([`key`]); 0 marks an empty entry.
    key: AtomicU64,
    /// Long runs counted (up to [`LONG_RUNS`]) in the low half, when the last one was
    /// counted in the high half (the callers' seconds): [`State`].
    state: AtomicU64,
}

/// An entry's count and time, as one word.
#[derive(Clone, Copy)]
struct State {
    runs: u32,
    at: u32,
}

impl State {
    fn of(word: u64) -> State {
        State {
            runs: word as u32,
            at: (word >> 32) as u32,
        }
    }

    fn word(self) -> u64 {
        (u64::from(self.at) << 32) | u64::from(self.runs)
    }

    /// Whether a time `at` is less than [`LIFETIME_S`] before `now`. A time a little
    /// after `now` (another process's clock read a moment later) is recent too.
    fn recent(at: u32, now: u32) -> bool {
        (now.wrapping_sub(at) as i32) < LIFETIME_S as i32
    }

    /// Whether the entry is scheduled at `now`.
    fn live(self, now: u32) -> bool {
        self.runs >= LONG_RUNS && State::recent(self.at, now)
    }

    /// The state after one more long run at `now`: counted with the runs before if the
    /// last one is recent, from one again otherwise; a live entry's stays as it is.
    fn after_run(self, now: u32) -> State {
        if self.live(now) {
            self
        } else if self.runs > 0 && self.runs < LONG_RUNS && State::recent(self.at, now) {
            State {
                runs: self.runs + 1,
                at: now,
            }
        } else {
            State { runs: 1, at: now }
        }
    }
}

impl Entry {
    fn state(&self) -> State {
        State::of(self.state.load(Ordering::Acquire))
    }

    fn holds(&self, key: u64) -> bool {
        self.key.load(Ordering::Acquire) == key
    }
}

/// A statement's key: its fingerprint and its relation key in one word, so that an
/// entry is claimed, and found, by one atomic; its low six bits are the relation's bit
/// number ([`relation_bit`]). Never 0.
fn key(relation: u32, fingerprint: u64) -> u64 {
    let mixed = fingerprint ^ u64::from(relation).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    match (mixed << 6) | u64::from(relation % 64) {
        0 => 64,
        key => key,
    }
}

/// The bit of the relation of the statement with key `key` in the relations' word.
fn key_bit(key: u64) -> u64 {
    1 << (key % 64)
}

/// The table. All zero is empty, so shared memory zeroed at start-up is a valid table.
/// On a cache line of its own: its word is read by every statement planned tiny.
#[repr(C, align(64))]
pub struct LongRuns {
    /// The bits ([`relation_bit`]) of the relations of the scheduled entries, and maybe
    /// of some that expired since.
    relations: AtomicU64,
    entries: [Entry; ENTRIES],
}

/// The bit of relation key `relation` (a relation's OID, 0 for a statement that reads
/// none) in [`LongRuns::may_be_scheduled`]'s word.
fn relation_bit(relation: u32) -> u64 {
    1 << (relation % 64)
}

impl LongRuns {
    /// An empty table (the same as all zero bytes).
    pub const fn new() -> Self {
        LongRuns {
            relations: AtomicU64::new(0),
            entries: [const {
                Entry {
                    key: AtomicU64::new(0),
                    state: AtomicU64::new(0),
                }
            }; ENTRIES],
        }
    }

    /// Whether any statement may have a scheduled fingerprint: false, the common case,
    /// means none has, without looking at its relation key.
    #[inline]
    pub fn any_scheduled(&self) -> bool {
        self.relations.load(Ordering::Relaxed) != 0
    }

    /// Whether a statement with relation key `relation` may have a scheduled
    /// fingerprint: false means it has none, without looking at its fingerprint.
    #[inline]
    pub fn may_be_scheduled(&self, relation: u32) -> bool {
        self.relations.load(Ordering::Relaxed) & relation_bit(relation) != 0
    }

    /// Whether fingerprint `fingerprint`, with relation key `relation`, is scheduled at
    /// `now` (seconds of a clock every process shares). The relation tells apart
    /// statements of the same text that read other tables (another schema first on the
    /// search path).
    pub fn is_scheduled(&self, relation: u32, fingerprint: u64, now: u32) -> bool {
        let key = key(relation, fingerprint);
        self.entries
            .iter()
            .any(|e| e.holds(key) && e.state().live(now))
    }

    /// A statement with fingerprint `fingerprint` and relation key `relation` was
    /// planned tiny and ran long, at `now` (seconds): counts the run, and once it has
    /// [`LONG_RUNS`] of them, each within [`LIFETIME_S`] of the one before, the
    /// fingerprint is scheduled for [`LIFETIME_S`].
    pub fn ran_long(&self, relation: u32, fingerprint: u64, now: u32) {
        let key = key(relation, fingerprint);
        // Twice at most: a backend that lost the race for an entry looks again, and
        // likely finds the entry the winner made for the same statement.
        for _ in 0..2 {
            if let Some(entry) = self.entries.iter().find(|e| e.holds(key)) {
                self.count(entry, key, now);
                return;
            }
            let entry = &self.entries[self.place_for(key, now)];
            let (old_key, old_state) = (
                entry.key.load(Ordering::Acquire),
                entry.state.load(Ordering::Acquire),
            );
            if old_key == key {
                // Claimed for this statement since the search above.
                self.count(entry, key, now);
                return;
            }
            if entry
                .key
                .compare_exchange(old_key, key, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // The replaced statement's count goes, unless a backend counted a run
                // of this one (or of the replaced one) since it was read: that count
                // stays, for this statement.
                let _ =
                    entry
                        .state
                        .compare_exchange(old_state, 0, Ordering::AcqRel, Ordering::Acquire);
                if State::of(old_state).runs >= LONG_RUNS {
                    self.sweep(now);
                }
                self.count(entry, key, now);
                return;
            }
        }
    }

    /// The entry a new statement with key `key` takes at `now`: searching from the place
    /// its key gives, the first that is empty or whose last run is not recent; else the
    /// one counting a first run that is oldest; else, every entry being scheduled, the
    /// one at that place.
    fn place_for(&self, key: u64, now: u32) -> usize {
        let start = (key / 64) as usize % ENTRIES;
        let places = || (0..ENTRIES).map(|i| (start + i) % ENTRIES);
        places()
            .find(|&i| {
                let state = self.entries[i].state();
                state.runs == 0 || !State::recent(state.at, now)
            })
            .or_else(|| {
                places()
                    .filter(|&i| self.entries[i].state().runs < LONG_RUNS)
                    .max_by_key(|&i| now.wrapping_sub(self.entries[i].state().at))
            })
            .unwrap_or(start)
    }

    /// Counts a long run at `now` into `entry`, which holds key `key`.
    fn count(&self, entry: &Entry, key: u64, now: u32) {
        let before = entry
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(State::of(word).after_run(now).word())
            })
            .map_or_else(State::of, State::of);
        let after = before.after_run(now);
        if after.live(now) {
            // Also for an entry scheduled already: its statement ran unadmitted, so its
            // bit may have been lost to a race (see the module's comment).
            self.relations.fetch_or(key_bit(key), Ordering::AcqRel);
        } else if before.runs >= LONG_RUNS {
            // It had expired: its bit, and others', may be cleared.
            self.sweep(now);
        }
    }

    /// Sets the relations' word from the entries scheduled at `now`, clearing the bits
    /// of those that expired or were replaced. Then sets, without clearing, the bits of
    /// the entries scheduled now: one scheduled while the word was computed, whose bit
    /// the compare-and-swap may have cleared, is seen by this second look. Called after
    /// an entry was replaced or expired, and now and then by the caller.
    pub fn sweep(&self, now: u32) {
        let bits = || {
            self.entries
                .iter()
                .filter(|e| e.state().live(now))
                .fold(0, |word, e| word | key_bit(e.key.load(Ordering::Acquire)))
        };
        let before = self.relations.load(Ordering::Acquire);
        let _ =
            self.relations
                .compare_exchange(before, bits(), Ordering::AcqRel, Ordering::Acquire);
        self.relations.fetch_or(bits(), Ordering::AcqRel);
    }
}

impl Default for LongRuns {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u32 = 1000;

    impl LongRuns {
        fn scheduled(&self, now: u32) -> usize {
            self.entries.iter().filter(|e| e.state().live(now)).count()
        }
    }

    #[test]
    fn nothing_is_scheduled_until_a_fingerprint_ran_long_twice() {
        let table = LongRuns::new();
        assert!(!table.any_scheduled() && !table.may_be_scheduled(0));
        table.ran_long(16384, 7, NOW);
        assert!(!table.any_scheduled() && !table.is_scheduled(16384, 7, NOW));
        table.ran_long(16384, 7, NOW);
        assert!(table.is_scheduled(16384, 7, NOW) && table.may_be_scheduled(16384));
        assert!(!table.is_scheduled(16384, 8, NOW));
        // The same text reading another table first is another statement.
        assert!(!table.is_scheduled(16385, 7, NOW));
        // Another relation with another bit needs no fingerprint looked at.
        assert!(!table.may_be_scheduled(16385));
        assert_eq!(table.scheduled(NOW), 1);
    }

    #[test]
    fn a_fingerprint_expires_and_counts_from_one_again() {
        let table = LongRuns::new();
        table.ran_long(3, 7, NOW);
        table.ran_long(3, 7, NOW + 10);
        assert!(table.is_scheduled(3, 7, NOW + 10 + LIFETIME_S - 1));
        let later = NOW + 10 + LIFETIME_S;
        assert!(!table.is_scheduled(3, 7, later));
        table.ran_long(3, 7, later);
        assert!(!table.is_scheduled(3, 7, later));
        // Its expiry cleared its bit.
        assert!(!table.may_be_scheduled(3));
        table.ran_long(3, 7, later + 1);
        assert!(table.is_scheduled(3, 7, later + 1) && table.may_be_scheduled(3));
    }

    #[test]
    fn two_long_runs_far_apart_do_not_schedule_a_fingerprint() {
        let table = LongRuns::new();
        table.ran_long(3, 7, NOW);
        table.ran_long(3, 7, NOW + LIFETIME_S);
        assert!(!table.is_scheduled(3, 7, NOW + LIFETIME_S));
        table.ran_long(3, 7, NOW + LIFETIME_S + 5);
        assert!(table.is_scheduled(3, 7, NOW + LIFETIME_S + 5));
    }

    #[test]
    fn the_clock_may_wrap_and_a_time_just_ahead_is_recent() {
        let table = LongRuns::new();
        table.ran_long(3, 7, u32::MAX - 1);
        table.ran_long(3, 7, u32::MAX);
        assert!(table.is_scheduled(3, 7, 5));
        assert!(!table.is_scheduled(3, 7, u32::MAX.wrapping_add(LIFETIME_S)));
        // Another process's clock read a second later scheduled it: live, not expired.
        let skewed = LongRuns::new();
        skewed.ran_long(3, 7, NOW + 1);
        skewed.ran_long(3, 7, NOW + 1);
        assert!(skewed.is_scheduled(3, 7, NOW));
        skewed.ran_long(3, 7, NOW);
        assert!(skewed.is_scheduled(3, 7, NOW + 1) && skewed.may_be_scheduled(3));
    }

    #[test]
    fn a_sweep_clears_the_bits_of_expired_entries_only() {
        let table = LongRuns::new();
        table.ran_long(3, 7, 0);
        table.ran_long(3, 7, 0);
        table.ran_long(4, 8, 500);
        table.ran_long(4, 8, 500);
        table.sweep(LIFETIME_S + 1);
        assert!(!table.may_be_scheduled(3) && table.may_be_scheduled(4));
        table.relations.store(0, Ordering::Relaxed);
        table.sweep(LIFETIME_S + 1);
        assert!(table.may_be_scheduled(4));
    }

    #[test]
    fn an_expired_entry_is_replaced_before_a_scheduled_one_and_its_bit_cleared() {
        let table = LongRuns::new();
        // Fingerprint 1 (relation 3) is scheduled at 0, the others at 500.
        for fingerprint in 1..=ENTRIES as u64 {
            let (relation, at) = if fingerprint == 1 { (3, 0) } else { (4, 500) };
            table.ran_long(relation, fingerprint, at);
            table.ran_long(relation, fingerprint, at);
        }
        assert_eq!(table.scheduled(500), ENTRIES);
        // At 601 only 1 has expired: a new statement takes its entry wherever its own
        // search starts.
        table.ran_long(4, 1000, LIFETIME_S + 1);
        assert!(!table.is_scheduled(3, 1, LIFETIME_S + 1));
        assert!((2..=ENTRIES as u64).all(|f| table.is_scheduled(4, f, LIFETIME_S + 1)));
        assert!(!table.may_be_scheduled(3) && table.may_be_scheduled(4));
    }

    #[test]
    fn a_new_fingerprint_replaces_one_not_scheduled_before_a_scheduled_one() {
        let table = LongRuns::new();
        table.ran_long(5, 1, NOW);
        table.ran_long(5, 1, NOW);
        // Far more once-long fingerprints than entries: the scheduled one stays.
        for fingerprint in 2..(3 * ENTRIES as u64) {
            table.ran_long(6, fingerprint, NOW);
        }
        assert!(table.is_scheduled(5, 1, NOW) && table.may_be_scheduled(5));
    }

    #[test]
    fn a_full_table_replaces_a_scheduled_fingerprint_and_clears_its_bit() {
        let table = LongRuns::new();
        for fingerprint in 1..=ENTRIES as u64 {
            let relation = if fingerprint == 1 { 3 } else { 4 };
            table.ran_long(relation, fingerprint, NOW);
            table.ran_long(relation, fingerprint, NOW);
        }
        assert_eq!(table.scheduled(NOW), ENTRIES);
        assert!(table.may_be_scheduled(3));
        // A new statement whose search starts at entry 0 replaces its statement.
        let fingerprint = (1000..)
            .find(|&f| (key(4, f) / 64).is_multiple_of(ENTRIES as u64))
            .unwrap();
        let first = table.entries[0].key.load(Ordering::Relaxed);
        table.ran_long(4, fingerprint, NOW);
        assert_eq!(
            table.entries[0].key.load(Ordering::Relaxed),
            key(4, fingerprint)
        );
        assert_ne!(first, key(4, fingerprint));
        assert_eq!(table.scheduled(NOW), ENTRIES - 1);
        assert_eq!(table.may_be_scheduled(3), key_bit(first) != relation_bit(3));
    }

    #[test]
    fn two_statements_whose_searches_start_at_one_place_do_not_evict_each_other() {
        let table = LongRuns::new();
        let place = |f| (key(3, f) / 64) % ENTRIES as u64;
        let other = (2..).find(|&f| place(f) == place(1)).unwrap();
        for fingerprint in [1, other, 1, other] {
            table.ran_long(3, fingerprint, NOW);
        }
        assert!(table.is_scheduled(3, 1, NOW) && table.is_scheduled(3, other, NOW));
        // Nor does a one-off long run of a third: it takes an empty entry.
        let table = LongRuns::new();
        let third = (other + 1..).find(|&f| place(f) == place(1)).unwrap();
        for fingerprint in [1, third, 1] {
            table.ran_long(3, fingerprint, NOW);
        }
        assert!(table.is_scheduled(3, 1, NOW));
    }

    #[test]
    fn a_full_table_of_first_runs_replaces_the_oldest() {
        let table = LongRuns::new();
        for fingerprint in 1..=ENTRIES as u64 {
            table.ran_long(5, fingerprint, NOW + fingerprint as u32);
        }
        let at = NOW + ENTRIES as u32 + 1;
        table.ran_long(5, 1000, at);
        table.ran_long(5, 1000, at);
        assert!(table.is_scheduled(5, 1000, at));
        // Fingerprint 2's run was kept, 1's, the oldest, forgotten.
        table.ran_long(5, 2, at);
        table.ran_long(5, 1, at);
        assert!(table.is_scheduled(5, 2, at) && !table.is_scheduled(5, 1, at));
    }

    #[test]
    fn all_zero_bytes_are_an_empty_table() {
        // SAFETY: every field is an atomic integer, for which all zero bytes are valid.
        let zeroed: LongRuns = unsafe { std::mem::zeroed() };
        assert!(!zeroed.any_scheduled() && zeroed.scheduled(NOW) == 0);
        zeroed.ran_long(1, 1, NOW);
        zeroed.ran_long(1, 1, NOW);
        assert!(zeroed.is_scheduled(1, 1, NOW));
    }

    #[test]
    fn a_scheduled_statement_that_ran_long_again_sets_its_lost_bit() {
        let table = LongRuns::new();
        table.ran_long(9, 42, NOW);
        table.ran_long(9, 42, NOW);
        table.relations.store(0, Ordering::Relaxed);
        assert!(!table.may_be_scheduled(9));
        table.ran_long(9, 42, NOW);
        assert!(table.may_be_scheduled(9) && table.is_scheduled(9, 42, NOW));
    }

    #[test]
    fn threads_counting_the_same_statements_at_once_schedule_them_with_their_bits() {
        // Eight statements each run long once in each of four threads, at once: each is
        // counted in one entry (their searches start at the same place), so each is
        // scheduled, and with no long run after, a sweep leaves every bit it needs.
        for _ in 0..50 {
            let table = LongRuns::new();
            let barrier = std::sync::Barrier::new(4);
            std::thread::scope(|scope| {
                for _ in 0..4 {
                    let (table, barrier) = (&table, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        for fingerprint in 1..=8u64 {
                            table.ran_long((fingerprint % 3) as u32, fingerprint, NOW);
                        }
                    });
                }
            });
            table.sweep(NOW);
            for fingerprint in 1..=8u64 {
                let relation = (fingerprint % 3) as u32;
                assert!(
                    table.is_scheduled(relation, fingerprint, NOW),
                    "{fingerprint}"
                );
                assert!(table.may_be_scheduled(relation));
            }
        }
    }

    proptest! {
        /// Whatever ran long before, at the same time: a fingerprint that then runs
        /// long twice is scheduled, and its relation's bit is set; after one run it is
        /// not; no more entries are scheduled than there are.
        #[test]
        fn twice_in_a_row_is_scheduled(
            others in proptest::collection::vec((1u64..500, 0u32..200), 0..200),
            relation in 0u32..200,
        ) {
            let table = LongRuns::new();
            for &(fingerprint, rel) in &others {
                table.ran_long(rel, fingerprint, NOW);
            }
            let fingerprint = 1_000_000;
            table.ran_long(relation, fingerprint, NOW);
            prop_assert!(!table.is_scheduled(relation, fingerprint, NOW));
            table.ran_long(relation, fingerprint, NOW);
            prop_assert!(table.is_scheduled(relation, fingerprint, NOW));
            prop_assert!(table.may_be_scheduled(relation));
            prop_assert!(table.scheduled(NOW) <= ENTRIES);
        }
    }
}
