//! The machine's NUMA nodes as this process sees them, and per-node accounting
//! (docs/design.md §10; psaroudakis2016 §4.2 keeps utilisation per socket).
//!
//! * The topology comes from the kernel (`sched`'s `Topology::from_sysfs("/sys")`) or
//!   from `pg_stride.numa_topology` (fake nodes for tests), restricted to the CPUs the
//!   server may run on (the postmaster's, [`server_cpus`]). It is read once per
//!   process, at its first use; if it cannot be
//!   read, NUMA statistics are off in that process and the first process to find out
//!   says so in one LOG line for the server.
//! * [`charge`] adds CPU charged to a query to the counter of the node of the CPU the
//!   process is on at that moment (`sched_getcpu`, a vDSO read): a process that migrated
//!   during the slice has its whole slice counted where it ended. It is called exactly
//!   where the CPU scheduler charges a query (slice end, end of ExecutorRun), so that
//!   the per-node totals add up to the groups' CPU time.
//! * With `pg_stride.numa = bind`, [`slot_split`] splits the CPU slots over the nodes
//!   in proportion to their CPUs, and a process holding a slot of node `i` runs bound
//!   to the CPUs of the topology's `i`-th node ([`follow_slot`]) until its statement
//!   ends ([`unbind`] puts its own mask back). Every process numbers the nodes the same
//!   way because every process reads the same topology: the kernel's or the spec,
//!   restricted to the CPUs the postmaster gave it, read before it binds itself.
//! * [`shared_memory_placement`] reads where PostgreSQL's main shared-memory segment
//!   is, per node, from the postmaster's `/proc/<pid>/numa_maps`, touching no page.
//!
//! A layer of its own, between the shared-memory layout and the mechanisms: the CPU
//! scheduler charges through it, the views read it, and it uses neither.

use crate::backend_local::BackendLocal;
use crate::gucs::{self, Setting};
use crate::os;
use crate::{pg, shmem};
use pg_stride_sched::numa::{segment_placement, split_slots, Placement, Topology, TopologyError};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;
use pgrx::PostgresGucEnum;
use std::cell::{Cell, OnceCell, RefCell};
use std::ffi::CString;
use std::path::Path;

/// `node_of_cpu` entry of a CPU on no node of the topology.
const NO_NODE: u32 = u32::MAX;

/// The topology of this process, with a table from CPU number to kernel node number.
pub struct Machine {
    pub topology: Topology,
    /// Whether the nodes are fake ones from `pg_stride.numa_topology`.
    pub from_spec: bool,
    /// Kernel node number by CPU number (`NO_NODE` for CPUs of no node): one load at a
    /// slice end instead of a search.
    node_of_cpu: Vec<u32>,
}

impl Machine {
    fn probe() -> Result<Machine, TopologyError> {
        let spec = topology_spec();
        let topology = match &spec {
            Some(spec) => Topology::from_spec(spec)?,
            None => Topology::from_sysfs(Path::new("/sys"))?,
        };
        let topology = match server_cpus() {
            Some(allowed) => topology.restrict(&allowed)?,
            None => topology,
        };
        let max_cpu = topology
            .nodes
            .iter()
            .flat_map(|n| n.cpus.iter().copied())
            .max()
            .unwrap_or(0);
        let mut node_of_cpu = vec![NO_NODE; max_cpu as usize + 1];
        for node in &topology.nodes {
            for &cpu in &node.cpus {
                node_of_cpu[cpu as usize] = node.id;
            }
        }
        Ok(Machine {
            topology,
            from_spec: spec.is_some(),
            node_of_cpu,
        })
    }

    /// The kernel node number of `cpu`, if it is on a node of the topology.
    #[inline]
    pub fn node_of(&self, cpu: u32) -> Option<u32> {
        self.node_of_cpu
            .get(cpu as usize)
            .copied()
            .filter(|&n| n != NO_NODE)
    }
}

/// The CPUs the server may run on: the postmaster's, as shared memory recorded them
/// when it was created (CPU numbers below `shmem::MAX_CPUS`), else (no shared memory, or
/// none recorded) this process's own. Not this process's mask alone: probed at a slice
/// end, a slot holder may be pinned to one CPU (`pg_stride.pin_slots`), and the
/// topology it reads stays with it for its life.
fn server_cpus() -> Option<Vec<u32>> {
    shmem::shared()
        .map(|s| s.cpu_owners.allowed())
        .filter(|cpus| !cpus.is_empty())
        .or_else(os::allowed_cpus)
}

/// This process's topology: not probed yet, or the result of the probe (`None` when it
/// failed).
static MACHINE: BackendLocal<OnceCell<Option<Machine>>> = BackendLocal::new(OnceCell::new());

/// Calls `f` with this process's topology, probing it at the first call; `None` when it
/// cannot be read (then logged once per server).
pub fn with_machine<R>(f: impl FnOnce(Option<&Machine>) -> R) -> R {
    let machine = MACHINE.get_or_init(|| match Machine::probe() {
        Ok(m) => Some(m),
        Err(e) => {
            if shmem::shared().is_none_or(|s| s.nodes.first_probe_failure()) {
                pgrx::log!(
                    "pg_stride: NUMA statistics are off: cannot read the NUMA topology: {e}"
                );
            }
            None
        }
    });
    f(machine.as_ref())
}

/// Adds `used_ns` of CPU, just charged to a query, to the node of the CPU this process
/// is on, when `pg_stride.numa = stats`. No allocation after the first call of the
/// process (which reads the topology), no system call: a GUC read, `sched_getcpu` and
/// an atomic add.
#[inline]
pub fn charge(shared: &shmem::Shared, used_ns: u64) {
    if !counts_per_node() || used_ns == 0 {
        return;
    }
    // Without a topology the CPU still counts, on no node, so that the view's rows
    // add up to the groups' CPU time.
    let node = with_machine(|machine| {
        machine.and_then(|m| os::current_cpu().and_then(|cpu| m.node_of(cpu)))
    });
    shared.nodes.charge(node, used_ns);
}

/// Where PostgreSQL's main shared-memory segment (the one holding pg_stride's region)
/// is, per node: the pages in the postmaster's page tables, by its `/proc/<pid>/maps`
/// and `numa_maps`. Pages that only other processes touched (most shared buffers once
/// backends have read into them) are not in the postmaster's page tables and count as
/// not resident. `None` when the files cannot be read (a kernel without NUMA support
/// has no `numa_maps`) or the region is not mapped.
pub fn shared_memory_placement() -> Option<Placement> {
    let address = shmem::shared()? as *const shmem::Shared as u64;
    let pid = pg::postmaster_pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let numa_maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).ok()?;
    segment_placement(&maps, &numa_maps, address)
}

/// How `total` CPU slots are split by node: with `pg_stride.numa = bind` and a topology
/// of two or more nodes with CPUs, over the topology's nodes in proportion to their
/// CPUs ([`split_slots`]); otherwise not split (one entry).
pub fn slot_split(total: u32) -> Vec<u32> {
    if !binds() {
        return vec![total];
    }
    with_machine(|machine| {
        let Some(m) = machine else {
            return vec![total];
        };
        let cpus: Vec<u32> = m
            .topology
            .nodes
            .iter()
            .map(|n| n.cpus.len() as u32)
            .collect();
        if cpus.iter().filter(|&&c| c > 0).count() < 2 {
            return vec![total];
        }
        split_slots(total, &cpus)
    })
}

/// The node (topology index) this process is bound to, if it bound itself.
static BOUND_NODE: BackendLocal<Cell<Option<u32>>> = BackendLocal::new(Cell::new(None));
/// The CPUs this process was allowed before it bound itself for its statement.
static OWN_CPUS: BackendLocal<RefCell<Option<Vec<u32>>>> = BackendLocal::new(RefCell::new(None));

/// This process now holds a slot of node `node` (topology index): bind it to that
/// node's CPUs unless it is already. One `sched_setaffinity` per change of node, none
/// otherwise. A node without CPUs here, or a mask the kernel refuses (said once per
/// server in the log), leaves the binding as it was.
pub fn follow_slot(node: u32) {
    if BOUND_NODE.get() == Some(node) {
        return;
    }
    let Some(cpus) = with_machine(|m| {
        m.and_then(|m| m.topology.nodes.get(node as usize))
            .map(|n| n.cpus.clone())
            .filter(|c| !c.is_empty())
    }) else {
        return;
    };
    if BOUND_NODE.get().is_none() {
        let Some(own) = os::allowed_cpus() else {
            return;
        };
        OWN_CPUS.set(Some(own));
    }
    match os::set_allowed_cpus(&cpus) {
        Ok(()) => BOUND_NODE.set(Some(node)),
        Err(e) => {
            if shmem::shared().is_some_and(|s| s.nodes.first_bind_failure()) {
                pgrx::log!(
                    "pg_stride: cannot bind a process to the CPUs {} of NUMA node index {node}: {e}; it runs unbound",
                    pg_stride_sched::numa::format_cpu_list(&cpus)
                );
            }
        }
    }
}

/// Puts back the CPUs this process was allowed before [`follow_slot`] bound it (at the
/// end of its statement). Nothing to do if it is not bound.
pub fn unbind() {
    if BOUND_NODE.replace(None).is_none() {
        return;
    }
    if let Some(own) = OWN_CPUS.with_borrow_mut(Option::take) {
        // The mask the process had a moment ago: the kernel has no reason to refuse it.
        let _ = os::set_allowed_cpus(&own);
    }
}

// ---- NUMA settings ----

/// `pg_stride.numa`: what pg_stride does about NUMA (docs/design.md §10).
#[derive(PostgresGucEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaMode {
    /// Nothing: no per-node accounting.
    #[name = c"off"]
    Off,
    /// Per-node accounting of the CPU charged to queries (psaroudakis2016 §4.2's
    /// per-socket utilisation); the view `pg_stride.numa`.
    #[name = c"stats"]
    Stats,
    /// `stats`, and the CPU slots split by node: each query gets a home node, its
    /// processes take that node's slots and run bound to its CPUs (psaroudakis2016 §4).
    #[name = c"bind"]
    Bind,
}

static NUMA: Setting<NumaMode> = Setting::new(GucSetting::<NumaMode>::new(NumaMode::Stats));
static NUMA_STEAL_AFTER: Setting<i32> = Setting::new(GucSetting::<i32>::new(4));
static NUMA_TOPOLOGY: Setting<Option<CString>> =
    Setting::new(GucSetting::<Option<CString>>::new(Some(c"")));

/// Whether CPU time is counted per node: `pg_stride.numa` is `stats` or `bind`. Reads
/// the ordinal without converting it (which panics on an unknown one): asked at every
/// slice end.
fn counts_per_node() -> bool {
    NUMA.raw() >= NumaMode::Stats as i32
}

/// Whether `pg_stride.numa` is `bind`.
fn binds() -> bool {
    NUMA.raw() == NumaMode::Bind as i32
}

/// `pg_stride.numa_steal_after` in slices, `None` for -1 (never).
pub fn steal_after() -> Option<u32> {
    u32::try_from(NUMA_STEAL_AFTER.get()).ok()
}

/// `pg_stride.numa_topology`: a spec of fake nodes (`0|1`), or `None` for the kernel's
/// topology.
fn topology_spec() -> Option<String> {
    NUMA_TOPOLOGY
        .get()
        .map(|s| s.to_string_lossy().trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Refuses a `pg_stride.numa_topology` that does not parse as node CPU lists (or that
/// puts a CPU in two nodes), with the parser's reason.
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn check_numa_topology(
    newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes the check hook a valid pointer to the proposed value.
    let spec = unsafe { gucs::proposed_string(newval) };
    let spec = spec.trim();
    let Err(e) = (match spec {
        "" => Ok(()),
        _ => pg_stride_sched::numa::Topology::from_spec(spec).map(|_| ()),
    }) else {
        return true;
    };
    let detail = CString::new(e.to_string()).unwrap_or_default();
    // SAFETY: the documented way for a check hook to give its error's code, detail and
    // hint: palloc'd strings in the GUC_check_* globals.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE as i32);
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(
            c"Give one CPU list per node, separated by |, such as 0|1 or 0-3|4-7, each CPU in one node; or empty for the kernel's nodes."
                .as_ptr(),
        );
    }
    false
}

/// Registers the NUMA settings. Called once, from `_PG_init`.
pub fn register_settings() {
    GucRegistry::define_enum_guc(
        c"pg_stride.numa",
        c"What pg_stride does about NUMA nodes.",
        c"off: nothing; stats: CPU time charged to queries is counted per node (view pg_stride.numa); bind: stats, and each query gets a home node whose CPU slots and CPUs its processes use.",
        NUMA.inner(),
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_stride.numa_steal_after",
        c"Slices a process of a query waits at a stretch for a slot on its home node before it may take one on another node.",
        c"Only with pg_stride.numa = bind; -1: never.",
        NUMA_STEAL_AFTER.inner(),
        -1,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: the check hook is guarded and only parses the value.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_stride.numa_topology",
            c"For tests: CPU lists of fake NUMA nodes, such as 0|1; empty means the kernel's nodes.",
            c"Each |-separated CPU list in the kernel's format (0-3,8) is one node, numbered from 0.",
            NUMA_TOPOLOGY.inner(),
            GucContext::Postmaster,
            GucFlags::default(),
            Some(check_numa_topology),
            None,
            None,
        )
    };
}
