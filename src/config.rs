//! Applying configuration: the groups table and the GUCs into shared memory, for
//! admission and CPU scheduling together.

use crate::shmem::{self, Group};
use crate::{admission, cpu, groups, pg};

/// Brings admission and CPU scheduling in line with the directory's groups and the
/// GUCs (at start and after a reload) and admits whoever the new limits let in. Only the
/// scheduler worker calls it: connected to no database, it has the server's settings,
/// where a session (or the groups loader, connected to a database as the bootstrap
/// superuser) may have its own `pg_stride.slice`, from SET, ALTER ROLE or ALTER
/// DATABASE, which must not become the server's decay quantum.
pub fn apply(shared: &shmem::Shared) {
    let limits = (
        admission::max_active_queries(),
        admission::memory_budget_kb(),
    );
    configure(shared, Some(limits));
    if let Some(sched) = shared.sched() {
        cpu::apply_settings(shared, sched);
    }
}

/// Brings admission and CPU scheduling in line with the directory's groups and, given
/// `limits`, with the server's admission limits; the decay in force, configured or
/// tuned, stays.
fn configure(shared: &shmem::Shared, limits: Option<(u32, u64)>) {
    let groups = shared.groups.groups();
    let sched = shared.sched();
    admission::configure(shared, &groups, limits, |slot, group| {
        if let Some(sched) = sched {
            cpu::configure_group(sched, slot, &group.settings);
        }
    });
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
    // The limits and the decay in force stay: this process's settings may not be the
    // server's (a reload it has not yet read, its own `pg_stride.slice`). Groups that
    // set no priorities of their own still take this process's priority_initial and
    // priority_min, which only a reload it has not yet read makes differ.
    configure(shared, None);
}
