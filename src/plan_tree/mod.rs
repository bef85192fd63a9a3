//! Reading and changing a finished plan (a PlannedStmt), with no pg_stride state (layer 1
//! of docs/design.md §7): the Gathers whose worker counts the concurrency hint lowers
//! and that the pool replaces by a Stride Gather, whether a statement only reads, what a
//! plan reads and calls for the monitoring check (`src/monitoring.rs` composes that
//! rule) and for a read or write too small to admit, and the working memory its nodes may keep.

mod memory;
mod monitoring;
mod small;
mod walk;

pub use memory::need_kb as memory_need_kb;
pub use monitoring::{
    calls_no_function_but, calls_no_scheduled_built_in, calls_only_monitoring_functions,
    from_functions, from_items, is_monitoring_built_in, reads_only, FromItem,
};
pub use small::{is_plain_read, plain_write_target};
pub use walk::{for_each_plan, list_ptrs, stride_gather_inner, STRIDE_GATHER, STRIDE_GATHER_MERGE};
