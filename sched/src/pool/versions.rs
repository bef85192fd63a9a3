//! The pool worker restores a leader's state from parallel.c's private shared-memory
//! layout (`FixedParallelState`, the TOC keys), copied per major. `PG_MODULE_MAGIC`
//! checks the major only, and a minor release may change a private layout (15.10 and
//! 17.2 added a field to `FixedParallelState`, a security fix). The pool therefore runs
//! only on the minor releases whose layouts were checked; elsewhere Gathers use
//! PostgreSQL's own workers.

/// Inclusive ranges of `server_version_num` whose layouts were checked, per major.
/// Extend a range only after reading that release's `parallel.c`.
pub const CHECKED: [(u32, u32); 3] = [(150_010, 150_020), (170_002, 170_011), (180_000, 180_006)];

/// Whether the pool may run on a server whose `server_version_num` is `version`.
pub fn layout_checked(version: u32) -> bool {
    CHECKED
        .iter()
        .any(|&(low, high)| (low..=high).contains(&version))
}

/// The checked range for `version`'s major as text (`"15.10–15.20"`), for messages;
/// `None` for a major the pool was never built for.
pub fn checked_range(version: u32) -> Option<String> {
    let text = |v: u32| format!("{}.{}", v / 10_000, v % 10_000);
    CHECKED
        .iter()
        .find(|&&(low, _)| low / 10_000 == version / 10_000)
        .map(|&(low, high)| format!("{}–{}", text(low), text(high)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_releases_before_the_layout_change_are_refused() {
        assert!(!layout_checked(150_009));
        assert!(layout_checked(150_010));
        assert!(!layout_checked(170_001));
        assert!(layout_checked(170_002));
    }

    #[test]
    fn releases_after_the_last_checked_one_are_refused() {
        assert!(layout_checked(150_020));
        assert!(!layout_checked(150_021));
        assert!(layout_checked(170_011));
        assert!(!layout_checked(170_012));
        assert!(layout_checked(180_006));
        assert!(!layout_checked(180_007));
    }

    #[test]
    fn majors_without_a_checked_layout_are_refused() {
        for v in [140_015, 160_005, 190_000, 0] {
            assert!(!layout_checked(v), "{v}");
            assert_eq!(checked_range(v), None);
        }
    }

    #[test]
    fn ranges_read_as_releases() {
        assert_eq!(checked_range(150_009).as_deref(), Some("15.10–15.20"));
        assert_eq!(checked_range(180_100).as_deref(), Some("18.0–18.6"));
    }
}
