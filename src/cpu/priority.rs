//! A group's priorities: what its statements start at and decay to (wagner2021 §3.2),
//! from its settings or the server's.

use pg_stride_sched::decay::PriorityRange;
use pg_stride_sched::GroupSettings;

/// A group's initial and lowest priority.
pub(super) fn priority_range(settings: &GroupSettings) -> PriorityRange {
    let p0 = settings
        .priority_initial
        .unwrap_or_else(super::settings::priority_initial);
    let p_min = settings
        .priority_min
        .unwrap_or_else(super::settings::priority_min);
    PriorityRange::new(p0.max(1) as u32, p_min.max(1) as u32)
}
