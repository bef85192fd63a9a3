//! NUMA placement, free of PostgreSQL (psaroudakis2016; docs/design.md §10): the machine's
//! nodes as the kernel reports them, and the rules `pg_stride.numa = bind` places work
//! by.
//!
//! * [`topology`] — nodes with their CPUs and memory, read from a sysfs tree (any root
//!   path, so tests read fixture trees), restricted to the CPUs the server may use, or
//!   given by a spec such as `0|1` (a test setting that makes one machine look like
//!   several nodes).
//! * [`placement`] — CPU slots split by node, a query's home node, and when a query may
//!   run on another node (stealing).
//! * [`maps`] — where a shared-memory segment's pages are, per node, from a process's
//!   `/proc/<pid>/maps` and `numa_maps`, without touching a page.
//!
//! On a machine with one node everything comes down to one node holding every slot:
//! nothing is bound and nothing is stolen.

pub mod maps;
pub mod placement;
pub mod topology;

pub use maps::{segment_containing, segment_placement, Placement};
pub use placement::{choose_home, split_slots, NodeLoad, StealPolicy, UtilEma};
pub use topology::{format_cpu_list, parse_cpu_list, Node, Topology, TopologyError};
