//! Runaway-query rules: a resource group's list of conditions on a running statement —
//! CPU time, elapsed time since admission, rows produced, temporary-file bytes — each
//! with an action taken the first time the statement meets it (docs/design.md §1).
//!
//! A group's rules are written as text, one rule per `;`:
//!
//! ```text
//! cpu_time > 30s: move batch; elapsed > 5min: log; temp_bytes > 1GB: cancel; rows > 1000000: log
//! ```
//!
//! Times take PostgreSQL's units (`us`, `ms`, `s`, `min`, `h`, `d`; none = ms), bytes
//! its memory units (`B`, `kB`, `MB`, `GB`, `TB`, by 1024; none = bytes). [`Rules`] is the
//! parsed form kept in shared memory with the group's settings; its `Display` gives the
//! text back in a canonical spelling.

use crate::groups::MAX_NAME_LEN;
use std::fmt;

/// Most rules a group may have.
pub const MAX_RULES: usize = 4;

/// What a rule measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Metric {
    /// CPU time of the statement's processes (leader and parallel workers), µs.
    #[default]
    CpuTime,
    /// Time since the statement was admitted, µs.
    Elapsed,
    /// Rows the statement produced (returned, or changed by a write).
    Rows,
    /// Bytes of temporary files the statement's processes hold.
    TempBytes,
}

impl Metric {
    const ALL: [Metric; 4] = [
        Metric::CpuTime,
        Metric::Elapsed,
        Metric::Rows,
        Metric::TempBytes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::CpuTime => "cpu_time",
            Metric::Elapsed => "elapsed",
            Metric::Rows => "rows",
            Metric::TempBytes => "temp_bytes",
        }
    }
}

/// What a rule does when a statement meets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Action {
    /// Writes a LOG line and records the hit.
    #[default]
    Log,
    /// Cancels the statement, with an error naming the rule.
    Cancel,
    /// Moves the statement's CPU scheduling to the rule's `target` group: its weight
    /// and priorities from then on.
    Move,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Log => "log",
            Action::Cancel => "cancel",
            Action::Move => "move",
        }
    }
}

/// A group name in a rule (at most `MAX_NAME_LEN` bytes), kept inline so that rules
/// live in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Target {
    bytes: [u8; MAX_NAME_LEN],
    len: u8,
}

impl Target {
    const NONE: Target = Target {
        bytes: [0; MAX_NAME_LEN],
        len: 0,
    };

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl Default for Target {
    fn default() -> Self {
        Target::NONE
    }
}

/// One rule: `metric > threshold: action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Rule {
    /// In the metric's base unit: µs, rows or bytes.
    pub threshold: u64,
    pub metric: Metric,
    pub action: Action,
    /// The group of a `move`.
    pub target: Target,
}

impl Rule {
    pub const NONE: Rule = Rule {
        threshold: 0,
        metric: Metric::CpuTime,
        action: Action::Log,
        target: Target::NONE,
    };
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} > ", self.metric.name())?;
        let t = self.threshold;
        match self.metric {
            Metric::CpuTime | Metric::Elapsed => write_scaled(f, t, TIME_UNITS)?,
            Metric::TempBytes => write_scaled(f, t, BYTE_UNITS)?,
            Metric::Rows => write!(f, "{t}")?,
        }
        write!(f, ": {}", self.action.name())?;
        if self.action == Action::Move {
            write!(f, " {}", self.target.as_str())?;
        }
        Ok(())
    }
}

/// A group's rules, in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Rules {
    list: [Rule; MAX_RULES],
    len: u8,
}

/// The measures of one running statement that rules are checked against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_us: u64,
    pub elapsed_us: u64,
    pub rows: u64,
    pub temp_bytes: u64,
}

impl Usage {
    pub fn of(&self, metric: Metric) -> u64 {
        match metric {
            Metric::CpuTime => self.cpu_us,
            Metric::Elapsed => self.elapsed_us,
            Metric::Rows => self.rows,
            Metric::TempBytes => self.temp_bytes,
        }
    }
}

impl Rules {
    pub const EMPTY: Rules = Rules {
        list: [Rule::NONE; MAX_RULES],
        len: 0,
    };

    pub fn iter(&self) -> impl Iterator<Item = &Rule> {
        self.list[..self.len as usize].iter()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether any rule measures `metric` (temporary files are looked for only then).
    pub fn uses(&self, metric: Metric) -> bool {
        self.iter().any(|r| r.metric == metric)
    }

    /// The rules `usage` exceeds that are not in `fired` (bit i = rule i fired already
    /// for this statement), as a bit set.
    pub fn newly_hit(&self, usage: &Usage, fired: u8) -> u8 {
        self.iter()
            .enumerate()
            .filter(|(i, r)| fired & (1 << i) == 0 && usage.of(r.metric) > r.threshold)
            .fold(0, |set, (i, _)| set | (1 << i))
    }

    /// Rule `i`.
    pub fn get(&self, i: usize) -> Option<&Rule> {
        self.list[..self.len as usize].get(i)
    }

    /// Parses a group's rules text (see the module comment); empty text is no rules.
    pub fn parse(text: &str) -> Result<Rules, String> {
        let mut rules = Rules::default();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            if rules.len as usize == MAX_RULES {
                return Err(format!("at most {MAX_RULES} rules per group"));
            }
            rules.list[rules.len as usize] = parse_rule(part)?;
            rules.len += 1;
        }
        Ok(rules)
    }
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

/// Units of time in µs, largest first, as PostgreSQL spells them.
const TIME_UNITS: &[(&str, u64)] = &[
    ("d", 86_400_000_000),
    ("h", 3_600_000_000),
    ("min", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];
/// Units of memory in bytes, largest first.
const BYTE_UNITS: &[(&str, u64)] = &[
    ("TB", 1 << 40),
    ("GB", 1 << 30),
    ("MB", 1 << 20),
    ("kB", 1 << 10),
    ("B", 1),
];

/// Writes `value` in the largest unit that divides it.
fn write_scaled(f: &mut fmt::Formatter<'_>, value: u64, units: &[(&str, u64)]) -> fmt::Result {
    let (name, size) = units
        .iter()
        .find(|(_, size)| value.is_multiple_of(*size) && value >= *size)
        .copied()
        .unwrap_or(units[units.len() - 1]);
    write!(f, "{}{name}", value / size)
}

fn parse_rule(text: &str) -> Result<Rule, String> {
    let bad = |why: String| format!("invalid rule \"{text}\": {why}");
    let (condition, action) = text
        .split_once(':')
        .ok_or_else(|| bad("expected \"measure > value: action\"".into()))?;
    let (metric, value) = condition
        .split_once('>')
        .ok_or_else(|| bad("expected \"measure > value\" before the colon".into()))?;
    let metric = metric.trim();
    let metric = Metric::ALL
        .into_iter()
        .find(|m| m.name() == metric)
        .ok_or_else(|| {
            bad(format!(
                "unknown measure \"{metric}\" (cpu_time, elapsed, rows or temp_bytes)"
            ))
        })?;
    let threshold = match metric {
        Metric::CpuTime | Metric::Elapsed => parse_scaled(value, TIME_UNITS, 1_000),
        Metric::TempBytes => parse_scaled(value, BYTE_UNITS, 1),
        Metric::Rows => parse_scaled(value, &[], 1),
    }
    .map_err(bad)?;
    let mut target = Target::NONE;
    let action = match action.trim() {
        "log" => Action::Log,
        "cancel" => Action::Cancel,
        other => match other.strip_prefix("move") {
            // "move" and its group are apart: "moved batch" is a typo, not a move to
            // group "d batch".
            Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => {
                let group = rest.trim();
                if group.is_empty() || group.len() > MAX_NAME_LEN {
                    return Err(bad("\"move\" takes a group name".into()));
                }
                target.bytes[..group.len()].copy_from_slice(group.as_bytes());
                target.len = group.len() as u8;
                Action::Move
            }
            _ => {
                return Err(bad(format!(
                    "unknown action \"{other}\" (log, cancel or move GROUP)"
                )))
            }
        },
    };
    Ok(Rule {
        threshold,
        metric,
        action,
        target,
    })
}

/// A non-negative integer with an optional unit of `units` (`bare`: the size of no unit).
fn parse_scaled(text: &str, units: &[(&str, u64)], bare: u64) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("\"{text}\" is not a whole number with an optional unit"))?;
    let unit = unit.trim();
    let size = if unit.is_empty() {
        bare
    } else {
        units
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, size)| *size)
            .ok_or_else(|| {
                let known: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
                if known.is_empty() {
                    format!("\"{text}\" takes no unit")
                } else {
                    format!("unknown unit \"{unit}\" ({})", known.join(", "))
                }
            })?
    };
    number
        .checked_mul(size)
        .ok_or_else(|| format!("\"{text}\" is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_back_canonically() {
        let r = Rules::parse(" cpu_time > 30s: cancel;elapsed>5min : log; rows > 1000: log; temp_bytes > 1024MB: cancel ;").unwrap();
        assert_eq!(
            r.to_string(),
            "cpu_time > 30s: cancel; elapsed > 5min: log; rows > 1000: log; temp_bytes > 1GB: cancel"
        );
        assert_eq!(Rules::parse(&r.to_string()).unwrap(), r);
        let first = r.get(0).unwrap();
        assert_eq!(
            (first.threshold, first.action),
            (30_000_000, Action::Cancel)
        );
        assert_eq!(
            Rules::parse("elapsed > 250: log")
                .unwrap()
                .get(0)
                .unwrap()
                .threshold,
            250_000
        );
        assert_eq!(
            Rules::parse("elapsed > 1500ms: log").unwrap().to_string(),
            "elapsed > 1500ms: log"
        );
        assert_eq!(
            Rules::parse("temp_bytes > 0: log").unwrap().to_string(),
            "temp_bytes > 0B: log"
        );
        let moved = Rules::parse("cpu_time > 2s: move  batch jobs ").unwrap();
        assert_eq!(moved.to_string(), "cpu_time > 2s: move batch jobs");
        assert_eq!(moved.get(0).unwrap().target.as_str(), "batch jobs");
        assert!(Rules::parse("").unwrap().is_empty());
        assert!(Rules::parse(" ; ").unwrap().is_empty());
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        let err = |t: &str| Rules::parse(t).unwrap_err();
        assert!(err("cpu_time > 30s").contains("expected \"measure > value: action\""));
        assert!(err("cpu_time 30s: log").contains("before the colon"));
        assert!(err("wall > 1s: log").contains("unknown measure \"wall\""));
        assert!(err("rows > 10k: log").contains("takes no unit"));
        assert!(err("elapsed > 1 fortnight: log").contains("unknown unit \"fortnight\""));
        assert!(err("elapsed > -1s: log").contains("not a whole number"));
        assert!(err("rows > 1: kill").contains("unknown action \"kill\""));
        assert!(err("rows > 1: move").contains("takes a group name"));
        assert!(err("rows > 1: moved batch").contains("unknown action \"moved batch\""));
        assert!(err("rows > 1: movebatch").contains("unknown action \"movebatch\""));
        assert!(err(&format!("rows > 1: move {}", "g".repeat(64))).contains("takes a group name"));
        assert!(err("temp_bytes > 99999999999TB: log").contains("too large"));
        assert!(
            err("rows > 1: log; rows > 2: log; rows > 3: log; rows > 4: log; rows > 5: log")
                .contains("at most 4 rules")
        );
    }

    #[test]
    fn a_rule_is_hit_once_past_its_threshold() {
        let r = Rules::parse("cpu_time > 1s: log; rows > 10: cancel").unwrap();
        let mut usage = Usage {
            cpu_us: 1_000_000,
            rows: 10,
            ..Usage::default()
        };
        assert_eq!(r.newly_hit(&usage, 0), 0, "at the threshold is not past it");
        usage.cpu_us += 1;
        assert_eq!(r.newly_hit(&usage, 0), 0b01);
        usage.rows = 11;
        assert_eq!(
            r.newly_hit(&usage, 0b01),
            0b10,
            "a fired rule does not fire again"
        );
        assert!(r.uses(Metric::Rows) && !r.uses(Metric::TempBytes));
    }
}
