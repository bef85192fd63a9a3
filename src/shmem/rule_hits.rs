//! The recent hits of runaway-query rules, for the `pg_stride.rule_hits` view: a ring
//! of the last [`RULE_HITS`] that the scheduler worker wrote, under the `RuleHits` lock
//! (a hit is rare; readers copy the ring out).

use super::locks::{LockId, ShmemLock};
use pg_stride_sched::rules::Rule;
use std::cell::UnsafeCell;

/// Hits kept; older ones are overwritten.
pub const RULE_HITS: usize = 64;

/// One hit: a rule a running statement met.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RuleHit {
    /// When it was seen (TimestampTz, µs).
    pub at_us: i64,
    pub pid: i32,
    /// The statement's role, for who may see its query id.
    pub userid: u32,
    /// The statement's query id (0 = not computed).
    pub query_id: u64,
    /// Its group, by name (`len` bytes): the group's slot may hold another one later.
    group: [u8; 64],
    group_len: u8,
    pub rule: Rule,
    /// What the statement measured when the rule was met.
    pub value: u64,
    /// The action was not taken, only logged (`rules_dry_run`).
    pub dry_run: bool,
}

impl RuleHit {
    const EMPTY: RuleHit = RuleHit {
        at_us: 0,
        pid: 0,
        userid: 0,
        query_id: 0,
        group: [0; 64],
        group_len: 0,
        rule: Rule::NONE,
        value: 0,
        dry_run: false,
    };

    pub fn new(
        at_us: i64,
        (pid, userid): (i32, u32),
        query_id: u64,
        group: &str,
        rule: Rule,
        value: u64,
        dry_run: bool,
    ) -> RuleHit {
        let mut name = [0u8; 64];
        let len = group.len().min(name.len());
        name[..len].copy_from_slice(&group.as_bytes()[..len]);
        RuleHit {
            at_us,
            pid,
            userid,
            query_id,
            group: name,
            group_len: len as u8,
            rule,
            value,
            dry_run,
        }
    }

    pub fn group(&self) -> String {
        String::from_utf8_lossy(&self.group[..self.group_len as usize]).into_owned()
    }
}

/// The ring.
#[repr(C)]
pub struct RuleHits {
    ring: UnsafeCell<([RuleHit; RULE_HITS], u64)>,
}

impl RuleHits {
    /// Initialises an empty ring in place. Caller: shared-memory initialisation.
    ///
    /// # Safety
    /// `at` points to writable, unused memory for a `RuleHits`.
    pub unsafe fn init(at: *mut RuleHits) {
        // SAFETY: the caller's promise.
        unsafe {
            at.write(RuleHits {
                ring: UnsafeCell::new(([RuleHit::EMPTY; RULE_HITS], 0)),
            })
        };
    }

    pub fn record(&self, hit: RuleHit) {
        let _guard = ShmemLock::exclusive(LockId::RuleHits);
        // SAFETY: the lock makes this process the only one touching the ring.
        let (ring, next) = unsafe { &mut *self.ring.get() };
        ring[(*next % RULE_HITS as u64) as usize] = hit;
        *next += 1;
    }

    /// The hits kept, oldest first.
    pub fn recent(&self) -> Vec<RuleHit> {
        let _guard = ShmemLock::shared(LockId::RuleHits);
        // SAFETY: the lock keeps the writer out while this copies.
        let (ring, next) = unsafe { &*self.ring.get() };
        let first = next.saturating_sub(RULE_HITS as u64);
        (first..*next)
            .map(|i| ring[(i % RULE_HITS as u64) as usize])
            .collect()
    }
}
