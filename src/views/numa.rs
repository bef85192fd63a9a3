//! The `pg_stride.numa` view: CPUs, CPU time, memory and CPU slots per NUMA node.

use super::shared_access::require_shared;
use crate::shmem;
use pgrx::prelude::*;

/// One row per NUMA node of this server's CPUs, and a row with a NULL node for what
/// is on none; the `pg_stride.numa` view. CPU time counts what was charged to
/// queries while `pg_stride.numa = stats`, by the node of the CPU each charge was
/// made on; shared memory is PostgreSQL's main segment, by the postmaster's
/// `numa_maps` (pages it has not mapped itself count on no node).
#[pg_extern(parallel_restricted, schema = "pg_stride")]
#[allow(clippy::type_complexity)]
fn numa_state() -> TableIterator<
    'static,
    (
        name!(node, Option<i32>),
        name!(cpus, Option<String>),
        name!(cpu_count, Option<i32>),
        name!(cpu_time_ms, Option<f64>),
        name!(memory_total_kb, Option<i64>),
        name!(memory_free_kb, Option<i64>),
        name!(shared_memory_bytes, Option<i64>),
        name!(cpu_slots, Option<i32>),
        name!(slots_in_use, Option<i32>),
        name!(queries_homed, Option<i32>),
        name!(waiting, Option<i32>),
    ),
> {
    use pg_stride_sched::numa::{format_cpu_list, Topology};
    let shared = require_shared();
    let placement = crate::numa::shared_memory_placement();
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut rows = Vec::new();
    let mut on_listed_nodes = 0u64;
    let slots = shared.sched().map(node_slot_state);
    crate::numa::with_machine(|machine| {
        let Some(m) = machine else { return };
        // Slots by node: split (`numa = bind`) over the topology's nodes, or all on
        // the one node there is; otherwise they belong to no node.
        let slots = slots.filter(|s| s.len() == m.topology.nodes.len());
        // Free memory changes: read it now (a spec's fake nodes have none).
        let fresh = (!m.from_spec)
            .then(|| Topology::from_sysfs(std::path::Path::new("/sys")).ok())
            .flatten();
        let mut shared_counter_shown = false;
        for (index, node) in m.topology.nodes.iter().enumerate() {
            let node_slots = slots.as_ref().map(|s| s[index]);
            // Nodes numbered MAX_NODES - 1 and above share a counter: shown once.
            let cpu_ns = if shmem::NodeCounters::slot(node.id) < shmem::MAX_NODES - 1 {
                Some(shared.nodes.cpu_ns(node.id))
            } else if !shared_counter_shown {
                shared_counter_shown = true;
                Some(shared.nodes.cpu_ns(node.id))
            } else {
                None
            };
            let memory = fresh
                .as_ref()
                .and_then(|t| t.nodes.iter().find(|n| n.id == node.id))
                .unwrap_or(node);
            let bytes = placement.as_ref().map(|p| p.on_node(node.id));
            on_listed_nodes += bytes.unwrap_or(0);
            rows.push((
                Some(node.id as i32),
                Some(format_cpu_list(&node.cpus)),
                Some(node.cpus.len() as i32),
                cpu_ns.map(ms),
                memory.mem_total_kb.map(|kb| kb as i64),
                memory.mem_free_kb.map(|kb| kb as i64),
                bytes.map(|b| b as i64),
                node_slots.map(|s| s.slots as i32),
                node_slots.map(|s| s.running as i32),
                node_slots.map(|s| s.homed as i32),
                node_slots.map(|s| s.waiting as i32),
            ));
        }
    });
    // On no listed node: CPU charged on a CPU of no node, and the pages of the
    // segment not resident (or on a node the topology does not list), so that each
    // column adds up over the rows.
    rows.push((
        None,
        None,
        None,
        Some(ms(shared.nodes.elsewhere_ns())),
        None,
        None,
        placement
            .as_ref()
            .map(|p| p.size.saturating_sub(on_listed_nodes) as i64),
        None,
        None,
        None,
        None,
    ));
    TableIterator::new(rows)
}

extension_sql!(
    r#"
CREATE VIEW pg_stride.numa AS
    SELECT * FROM pg_stride.numa_state() ORDER BY node NULLS LAST;
COMMENT ON VIEW pg_stride.numa IS
    'pg_stride NUMA nodes: CPUs, CPU time charged to queries per node (pg_stride.numa = stats or bind), memory, bytes of the main shared-memory segment per node, and CPU slots per node (split with pg_stride.numa = bind); the row with a NULL node holds what is on none';
GRANT SELECT ON pg_stride.numa TO PUBLIC;
"#,
    name = "numa_view",
    requires = [numa_state],
);

/// One node's CPU slots, as the `pg_stride.numa` view shows them.
#[derive(Clone, Copy)]
struct NodeSlots {
    slots: u32,
    running: u32,
    homed: u32,
    /// Processes waiting for a slot whose query is homed on the node.
    waiting: u32,
}

/// The CPU slots of each node the scheduler splits them over (one entry when not split).
fn node_slot_state(sched: &pg_stride_sched::SchedShared) -> Vec<NodeSlots> {
    sched
        .node_loads()
        .iter()
        .zip(sched.waiting_by_node())
        .map(|(l, waiting)| NodeSlots {
            slots: l.slots,
            running: l.running,
            homed: l.homed,
            waiting,
        })
        .collect()
}
