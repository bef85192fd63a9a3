//! Memory-aware admission: what a statement's plan may use of working memory, and the
//! budgets its admission reserves it from (docs/design.md §1 "admission").
//!
//! PostgreSQL bounds the memory of each sort, hash table and tuple store of a plan by
//! `work_mem` (hash tables by `work_mem × hash_mem_multiplier`), in each process that
//! runs that node; it does not bound how many of them run at once. So N clients that
//! each run a sort of several × `work_mem` need N × that much, and past the machine's
//! memory the server swaps or a backend is killed. Admission can prevent that: a
//! statement reserves its plan's bound from a budget when it is admitted and gives it
//! back when it ends, and a statement whose bound does not fit waits in the queue.
//!
//! The bound is an estimate from the plan alone, before anything runs:
//!
//! * each node that keeps its input in memory counts once per process that runs it:
//!   sorts, incremental sorts, materialisations, window aggregates, CTE and table
//!   function tuple stores, TID bitmaps, each function's tuple store in a function scan
//!   and the sorts an aggregation runs inside itself (ordered and DISTINCT aggregates,
//!   sorted grouping-set phases) and a recursive union's two tables `work_mem`; hash
//!   joins' hash tables, hashed or mixed aggregation, hashed set operations, memoize
//!   caches, a recursive `UNION`'s rows seen and hashed subqueries
//!   `work_mem × hash_mem_multiplier`;
//! * plain and sorted aggregation otherwise keep one group's state at a time and count
//!   nothing (a `count(*)` over a large table needs no memory to speak of);
//! * a node under a Gather runs in the leader and in each planned worker: it counts
//!   (1 + workers) times.
//!
//! A node spills to disk rather than exceed its bound, so the estimate is an upper bound
//! on what the nodes keep, not on what a backend allocates besides (catalog caches,
//! expression state: a few MB per backend, the margin of the budget).
//!
//! A statement whose bound is 0 reserves nothing and is admitted as before, on the
//! lock-free path. A statement larger than a whole budget would never fit; it runs alone
//! instead — admitted when nothing else holds memory of that budget — unless its group
//! rejects such statements at once.

/// How a plan node bounds its memory, for [`node_need_kb`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeMemory {
    /// A tuple store or sort: up to `work_mem`.
    WorkMem,
    /// A hash table: up to `work_mem × hash_mem_multiplier`.
    HashMem,
}

/// The memory settings a plan's bound is computed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemorySettings {
    /// `work_mem`, kB.
    pub work_mem_kb: u64,
    /// `hash_mem_multiplier`.
    pub hash_mem_multiplier: f64,
}

/// The bound of `copies` nodes of a kind (one node run by N processes counts N times),
/// in kB.
pub fn node_need_kb(kind: NodeMemory, settings: MemorySettings, copies: u64) -> u64 {
    let each = match kind {
        NodeMemory::WorkMem => settings.work_mem_kb,
        // PostgreSQL's get_hash_memory_limit: the product, capped at what a size_t holds.
        NodeMemory::HashMem => {
            let kb = settings.work_mem_kb as f64 * settings.hash_mem_multiplier.max(1.0);
            if kb >= u64::MAX as f64 {
                u64::MAX
            } else {
                kb as u64
            }
        }
    };
    each.saturating_mul(copies)
}

/// One memory budget's account: what admitted statements reserved from it and what
/// waiting statements ask of it, in kB. Changed only under the admission queue's lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Budget {
    /// The budget; 0 = none (nothing is refused for memory).
    pub limit_kb: u64,
    /// Reserved by admitted statements.
    pub reserved_kb: u64,
    /// Asked by statements waiting for admission.
    pub waiting_kb: u64,
}

impl Budget {
    /// Whether a statement needing `need_kb` may reserve it now: it fits beside what is
    /// reserved, or nothing is reserved (a statement larger than the whole budget runs
    /// alone rather than never).
    pub fn fits(&self, need_kb: u64) -> bool {
        self.limit_kb == 0
            || need_kb == 0
            || self.reserved_kb == 0
            || self.reserved_kb.saturating_add(need_kb) <= self.limit_kb
    }

    /// Whether a statement needing `need_kb` may reserve it now and leave room for
    /// `kept_kb` that a statement before it waits for (with a budget, and needing memory:
    /// no exception for an empty budget, which the statement kept for may need whole).
    pub fn fits_beside(&self, need_kb: u64, kept_kb: u64) -> bool {
        self.limit_kb == 0
            || need_kb == 0
            || self
                .reserved_kb
                .saturating_add(kept_kb)
                .saturating_add(need_kb)
                <= self.limit_kb
    }

    /// Whether `need_kb` is larger than the whole budget.
    pub fn exceeds(&self, need_kb: u64) -> bool {
        self.limit_kb > 0 && need_kb > self.limit_kb
    }

    pub fn reserve(&mut self, kb: u64) {
        self.reserved_kb = self.reserved_kb.saturating_add(kb);
    }

    pub fn unreserve(&mut self, kb: u64) {
        debug_assert!(kb <= self.reserved_kb, "memory given back twice");
        self.reserved_kb = self.reserved_kb.saturating_sub(kb);
    }

    pub fn ask(&mut self, kb: u64) {
        self.waiting_kb = self.waiting_kb.saturating_add(kb);
    }

    pub fn stop_asking(&mut self, kb: u64) {
        debug_assert!(kb <= self.waiting_kb, "a wait for memory ended twice");
        self.waiting_kb = self.waiting_kb.saturating_sub(kb);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: MemorySettings = MemorySettings {
        work_mem_kb: 4096,
        hash_mem_multiplier: 2.0,
    };

    #[test]
    fn nodes_count_their_bound_once_per_process() {
        assert_eq!(node_need_kb(NodeMemory::WorkMem, SETTINGS, 1), 4096);
        assert_eq!(node_need_kb(NodeMemory::WorkMem, SETTINGS, 3), 3 * 4096);
        assert_eq!(node_need_kb(NodeMemory::HashMem, SETTINGS, 1), 8192);
        assert_eq!(node_need_kb(NodeMemory::HashMem, SETTINGS, 0), 0);
    }

    #[test]
    fn a_hash_multiplier_below_one_counts_as_one() {
        let s = MemorySettings {
            hash_mem_multiplier: 0.5,
            ..SETTINGS
        };
        assert_eq!(node_need_kb(NodeMemory::HashMem, s, 1), 4096);
    }

    #[test]
    fn huge_settings_saturate() {
        let s = MemorySettings {
            work_mem_kb: u64::MAX / 2,
            hash_mem_multiplier: 1000.0,
        };
        assert_eq!(node_need_kb(NodeMemory::HashMem, s, 1), u64::MAX);
        assert_eq!(node_need_kb(NodeMemory::WorkMem, s, 3), u64::MAX);
    }

    #[test]
    fn a_budget_admits_what_fits_and_an_oversized_statement_alone() {
        let mut b = Budget {
            limit_kb: 100,
            ..Budget::default()
        };
        assert!(b.fits(60));
        b.reserve(60);
        assert!(b.fits(40));
        assert!(!b.fits(41));
        assert!(b.fits(0), "a statement needing nothing always fits");
        assert!(b.exceeds(101) && !b.exceeds(100));
        assert!(!b.fits(500), "oversized, with memory reserved");
        b.unreserve(60);
        assert!(b.fits(500), "oversized, alone");
        let none = Budget::default();
        assert!(none.fits(u64::MAX) && !none.exceeds(u64::MAX));
    }
}
