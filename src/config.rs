//! Applying configuration: the groups table and the GUCs into shared memory, for
//! admission and CPU scheduling together.

use crate::shmem::{self, Group};
use crate::{admission, cpu, groups, pg};

/// Brings admission and CPU scheduling in line with the directory's groups and the
/// GUCs (after a reload of either) and admits whoever the new limits let in.
pub fn apply(shared: &shmem::Shared) {
    apply_groups(shared);
    if let Some(sched) = shared.sched() {
        cpu::apply_settings(shared, sched);
    }
}

/// Brings admission and CPU scheduling in line with the directory's groups; the decay
/// in force, configured or tuned, stays.
fn apply_groups(shared: &shmem::Shared) {
    let groups = shared.groups.groups();
    let sched = shared.sched();
    admission::configure(
        shared,
        &groups,
        admission::max_active_queries(),
        admission::memory_budget_kb(),
        |slot, group| {
            if let Some(sched) = sched {
                cpu::configure_group(sched, slot, &group.settings);
            }
        },
    );
}

/// Reads the groups table (in a transaction of the current database) into the
/// directory and applies it. A group keeps its slot while a statement still runs in it.
///
/// The groups loader reads the committed table (`committed`), while a session that
/// changes the table publishes it at once as its transaction sees it; the loader's
/// reading is then older and is dropped. The session's commit or rollback asks the
/// loader for another reload, which settles the directory on the committed table.
pub fn reload_groups(shared: &shmem::Shared, committed: bool) {
    let read_at = committed.then(|| shared.groups.generation());
    let table: Vec<Group> = groups::read_table();
    let dropped = shared
        .groups
        .publish(&table, read_at, |slot| shared.slot_has_statements(slot));
    for name in dropped {
        pg::report(
            pgrx::PgLogLevel::WARNING,
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "pg_stride: resource group \"{name}\" is not in effect: at most {} groups fit in shared memory",
                shmem::MAX_GROUPS
            ),
            Some("Drop a group that is not used, with pg_stride.drop_group(), to make room."),
        );
    }
    // A session's own value of `pg_stride.slice` (a superuser may SET it) is not the
    // server's decay quantum: only the groups loader applies the settings with the table.
    if committed {
        apply(shared);
    } else {
        apply_groups(shared);
    }
}
