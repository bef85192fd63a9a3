//! Resource-group settings: their limits, their validation, and how the shared group
//! directory assigns groups to its slots (docs/design.md §1, §5).
//!
//! The limits below are the only definition of the settings' ranges: the SQL functions
//! validate with [`validate`], and a test of the extension checks that the CHECK
//! constraints of `pg_stride.resource_groups` accept and reject exactly at them.

use crate::rules::Rules;
use crate::shared::MAX_GROUPS;

/// Name of the group every session belongs to unless it is assigned another; it always
/// exists and always has slot 0 of the directory.
pub const DEFAULT_GROUP: &str = "default";

/// Longest group name in bytes: a PostgreSQL name (NAMEDATALEN - 1).
pub const MAX_NAME_LEN: usize = 63;

/// The inclusive range of one integer setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub name: &'static str,
    pub min: i64,
    pub max: i64,
}

/// CPU share against other groups.
pub const WEIGHT: Limit = Limit {
    name: "weight",
    min: 1,
    max: 10_000,
};
/// Statements admitted at once (0 = no group limit); PostgreSQL's MAX_BACKENDS.
pub const MAX_CONCURRENCY: Limit = Limit {
    name: "max_concurrency",
    min: 0,
    max: 262_143,
};
/// Statements of the group waiting for admission at once (0 = no group bound).
pub const MAX_QUEUED: Limit = Limit {
    name: "max_queued",
    min: 0,
    max: 262_143,
};
/// Longest wait for admission in ms (0 = none); a day at most.
pub const QUEUE_TIMEOUT: Limit = Limit {
    name: "queue_timeout",
    min: 0,
    max: 86_400_000,
};
/// Working memory the group's admitted statements reserve at once, kB (0 = no group
/// budget); as a kB setting of PostgreSQL, up to INT_MAX.
pub const MEMORY_BUDGET: Limit = Limit {
    name: "memory_budget",
    min: 0,
    max: i32::MAX as i64,
};
/// Parallel workers the group's statements hold at once; max_worker_processes' maximum.
pub const MAX_PARALLEL_WORKERS: Limit = Limit {
    name: "max_parallel_workers",
    min: 0,
    max: 262_143,
};
/// A query's initial priority: up to 100 times the paper's p0 (wagner2021 §3.2).
pub const PRIORITY_INITIAL: Limit = Limit {
    name: "priority_initial",
    min: 1,
    max: 1_000_000,
};
/// The lowest priority a query decays to.
pub const PRIORITY_MIN: Limit = Limit {
    name: "priority_min",
    min: 1,
    max: 1_000_000,
};
/// Slices of CPU before decay starts.
pub const DECAY_START: Limit = Limit {
    name: "decay_start",
    min: 0,
    max: 1_000_000,
};
/// The decay factor λ, a fraction.
pub const DECAY_LAMBDA_RANGE: (f64, f64) = (0.0, 1.0);

/// Every integer setting's limit, for tests that compare them with the SQL table.
pub const INTEGER_LIMITS: [Limit; 9] = [
    WEIGHT,
    MAX_CONCURRENCY,
    MAX_QUEUED,
    QUEUE_TIMEOUT,
    MEMORY_BUDGET,
    MAX_PARALLEL_WORKERS,
    PRIORITY_INITIAL,
    PRIORITY_MIN,
    DECAY_START,
];

/// A group's settings, as in `pg_stride.resource_groups`. `None` falls back to the
/// server-wide setting.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct GroupSettings {
    /// CPU share against other groups.
    pub weight: i32,
    /// Statements of the group admitted at once; 0 = no limit beyond the global one.
    pub max_concurrency: i32,
    /// Statements of the group that may wait for admission at once (0 = no bound);
    /// `None` = `pg_stride.max_queued` alone bounds them.
    pub max_queued: Option<i32>,
    /// Longest wait for admission, ms (0 = none); `None` = the session's
    /// `pg_stride.queue_timeout` alone. With both, the shorter non-zero one applies.
    pub queue_timeout: Option<i32>,
    /// Working memory the group's admitted statements may reserve at once, kB (0 = no
    /// group budget); `None` = only `pg_stride.memory_budget`.
    pub memory_budget: Option<i32>,
    /// A statement needing more memory than a budget it is under fails at once
    /// (SQLSTATE 53200) instead of running alone when the budget is otherwise empty.
    pub reject_oversized: bool,
    /// Parallel workers the group's statements may hold at once; `None` = no cap.
    pub max_parallel_workers: Option<i32>,
    pub priority_initial: Option<i32>,
    pub priority_min: Option<i32>,
    pub decay_lambda: Option<f64>,
    pub decay_start: Option<i32>,
    /// Statements keep `priority_initial` instead of decaying.
    pub pinned: bool,
    /// Runaway-query rules checked against the group's running statements.
    pub rules: Rules,
    /// The rules' actions are only logged and recorded, as what would have happened.
    pub rules_dry_run: bool,
}

impl GroupSettings {
    /// A new group's settings, and `default`'s until altered.
    pub const DEFAULT: GroupSettings = GroupSettings {
        weight: 100,
        max_concurrency: 0,
        max_queued: None,
        queue_timeout: None,
        memory_budget: None,
        reject_oversized: false,
        max_parallel_workers: None,
        priority_initial: None,
        priority_min: None,
        decay_lambda: None,
        decay_start: None,
        pinned: false,
        rules: Rules::EMPTY,
        rules_dry_run: false,
    };
}

impl GroupSettings {
    /// The wait for admission allowed, in ms (0 = no limit), given the session's
    /// `pg_stride.queue_timeout`: the shorter of the two that are set.
    pub fn queue_timeout_ms(&self, session_ms: i32) -> i32 {
        match (self.queue_timeout.unwrap_or(0), session_ms) {
            (0, s) => s.max(0),
            (g, s) if s <= 0 => g,
            (g, s) => g.min(s),
        }
    }
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings::DEFAULT
    }
}

fn check(limit: Limit, value: Option<i32>) -> Result<(), String> {
    match value {
        Some(v) if !(limit.min..=limit.max).contains(&i64::from(v)) => Err(format!(
            "{} = {v} is outside the valid range {} .. {}",
            limit.name, limit.min, limit.max
        )),
        _ => Ok(()),
    }
}

/// Checks every setting against its range; the error names the first one out of range.
pub fn validate(s: &GroupSettings) -> Result<(), String> {
    check(WEIGHT, Some(s.weight))?;
    check(MAX_CONCURRENCY, Some(s.max_concurrency))?;
    check(MAX_QUEUED, s.max_queued)?;
    check(MEMORY_BUDGET, s.memory_budget)?;
    check(QUEUE_TIMEOUT, s.queue_timeout)?;
    check(MAX_PARALLEL_WORKERS, s.max_parallel_workers)?;
    check(PRIORITY_INITIAL, s.priority_initial)?;
    check(PRIORITY_MIN, s.priority_min)?;
    if let Some(l) = s.decay_lambda {
        let (lo, hi) = DECAY_LAMBDA_RANGE;
        // NaN is in no range: `contains` is false for it.
        if !(lo..=hi).contains(&l) {
            return Err(format!(
                "decay_lambda = {l} is outside the valid range {lo} .. {hi}"
            ));
        }
    }
    check(DECAY_START, s.decay_start)?;
    if let (Some(p0), Some(p_min)) = (s.priority_initial, s.priority_min) {
        if p_min > p0 {
            return Err(format!(
                "priority_min = {p_min} is greater than priority_initial = {p0}"
            ));
        }
    }
    Ok(())
}

/// Where the groups of a new reading of the table go in the directory.
#[derive(Debug, PartialEq, Eq)]
pub struct Assignment {
    /// For each slot, the index (in the new reading) of the group it holds; slot 0 is
    /// `default`'s and holds `None` unless the reading has a row for `default`.
    pub slots: Vec<Option<usize>>,
    /// Slots given to a group that was not in the directory: their counters start anew.
    pub fresh: Vec<usize>,
    /// Groups of the reading that found no slot (indexes into the reading).
    pub dropped: Vec<usize>,
}

/// Assigns the groups named `new` (a new reading of the table) to directory slots,
/// given the names the slots hold now (`current[i]`, `None` = free). A group keeps its
/// slot, so its counters and the statements running in it stay with it; `default`
/// always has slot 0; a new group takes the lowest slot that is free now, not given in
/// this assignment, and not `in_use` by a running statement (one of a dropped group
/// that still finishes). Groups beyond [`MAX_GROUPS`] are dropped.
pub fn assign_slots(
    current: &[Option<&str>],
    new: &[&str],
    in_use: impl Fn(usize) -> bool,
) -> Assignment {
    let size = MAX_GROUPS as usize;
    let mut slots: Vec<Option<usize>> = vec![None; size];
    let mut taken = vec![false; size];
    taken[0] = true;
    let mut pending = Vec::new();
    for (i, name) in new.iter().enumerate() {
        if *name == DEFAULT_GROUP {
            slots[0] = Some(i);
            continue;
        }
        match current
            .iter()
            .take(size)
            .position(|c| *c == Some(*name))
            .filter(|&s| s != 0 && !taken[s])
        {
            Some(s) => {
                slots[s] = Some(i);
                taken[s] = true;
            }
            None => pending.push(i),
        }
    }
    let mut fresh = Vec::new();
    let mut dropped = Vec::new();
    for i in pending {
        let free = (1..size)
            .find(|&s| !taken[s] && current.get(s).copied().flatten().is_none() && !in_use(s));
        match free {
            Some(s) => {
                slots[s] = Some(i);
                taken[s] = true;
                fresh.push(s);
            }
            None => dropped.push(i),
        }
    }
    Assignment {
        slots,
        fresh,
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_first_setting_out_of_range() {
        assert!(validate(&GroupSettings::DEFAULT).is_ok());
        let bad = GroupSettings {
            weight: 0,
            max_concurrency: -1,
            ..GroupSettings::DEFAULT
        };
        assert_eq!(
            validate(&bad).unwrap_err(),
            "weight = 0 is outside the valid range 1 .. 10000"
        );
        for limit in INTEGER_LIMITS {
            for (value, ok) in [
                (limit.min, true),
                (limit.max, true),
                (limit.min - 1, false),
                (limit.max + 1, false),
            ] {
                let v = value as i32;
                let mut s = GroupSettings::DEFAULT;
                match limit.name {
                    "weight" => s.weight = v,
                    "max_concurrency" => s.max_concurrency = v,
                    "max_queued" => s.max_queued = Some(v),
                    "queue_timeout" => s.queue_timeout = Some(v),
                    "memory_budget" => s.memory_budget = Some(v),
                    "max_parallel_workers" => s.max_parallel_workers = Some(v),
                    "priority_initial" => s.priority_initial = Some(v),
                    "priority_min" => s.priority_min = Some(v),
                    "decay_start" => s.decay_start = Some(v),
                    other => panic!("untested limit {other}"),
                }
                assert_eq!(validate(&s).is_ok(), ok, "{} = {v}", limit.name);
            }
        }
    }

    #[test]
    fn the_shorter_of_the_group_and_session_queue_timeouts_applies() {
        let group = |t| GroupSettings {
            queue_timeout: t,
            ..GroupSettings::DEFAULT
        };
        assert_eq!(group(None).queue_timeout_ms(0), 0);
        assert_eq!(group(None).queue_timeout_ms(500), 500);
        assert_eq!(group(Some(0)).queue_timeout_ms(500), 500);
        assert_eq!(group(Some(300)).queue_timeout_ms(0), 300);
        assert_eq!(group(Some(300)).queue_timeout_ms(500), 300);
        assert_eq!(group(Some(900)).queue_timeout_ms(500), 500);
    }

    #[test]
    fn lambda_must_be_a_fraction_and_priorities_ordered() {
        for (l, ok) in [
            (0.0, true),
            (1.0, true),
            (-0.1, false),
            (1.5, false),
            (f64::NAN, false),
        ] {
            let s = GroupSettings {
                decay_lambda: Some(l),
                ..GroupSettings::DEFAULT
            };
            assert_eq!(validate(&s).is_ok(), ok, "lambda {l}");
        }
        let s = GroupSettings {
            priority_initial: Some(100),
            priority_min: Some(200),
            ..GroupSettings::DEFAULT
        };
        assert_eq!(
            validate(&s).unwrap_err(),
            "priority_min = 200 is greater than priority_initial = 100"
        );
    }

    fn current(names: &[(usize, &'static str)]) -> Vec<Option<&'static str>> {
        let mut c = vec![None; MAX_GROUPS as usize];
        c[0] = Some(DEFAULT_GROUP);
        for &(slot, name) in names {
            c[slot] = Some(name);
        }
        c
    }

    #[test]
    fn groups_keep_their_slots_and_new_ones_take_free_slots_not_in_use() {
        let cur = current(&[(1, "a"), (2, "b"), (4, "c")]);
        // "b" was dropped but a statement still runs in slot 2; slot 3 is free.
        let a = assign_slots(&cur, &["c", "new1", "a", "new2", "new3"], |s| s == 2);
        assert_eq!(a.slots[1], Some(2));
        assert_eq!(a.slots[4], Some(0));
        assert_eq!(a.slots[2], None, "a slot in use is not reused");
        assert_eq!(a.slots[3], Some(1));
        assert_eq!(a.slots[5], Some(3));
        assert_eq!(a.slots[6], Some(4));
        assert_eq!(a.fresh, vec![3, 5, 6]);
        assert!(a.dropped.is_empty());
    }

    #[test]
    fn default_stays_in_slot_zero_and_overflow_is_dropped() {
        let cur = current(&[]);
        let names: Vec<String> = (0..MAX_GROUPS + 2).map(|i| format!("g{i}")).collect();
        let mut reading: Vec<&str> = names.iter().map(String::as_str).collect();
        reading.push(DEFAULT_GROUP);
        let a = assign_slots(&cur, &reading, |_| false);
        assert_eq!(a.slots[0], Some(reading.len() - 1));
        // 63 slots for the others, 3 left over.
        assert_eq!(a.fresh.len(), MAX_GROUPS as usize - 1);
        assert_eq!(a.dropped, vec![63, 64, 65]);
    }

    #[test]
    fn a_slot_freed_in_this_reading_is_not_reused_in_the_same_reading() {
        // "old" leaves slot 1 and "new" arrives: slot 1 keeps its counters for the
        // statements of "old" that may still run, so "new" goes elsewhere.
        let cur = current(&[(1, "old")]);
        let a = assign_slots(&cur, &["new"], |_| false);
        assert_eq!(a.slots[1], None);
        assert_eq!(a.slots[2], Some(0));
    }
}
