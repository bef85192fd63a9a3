//! How many background-worker slots the pool may take.
//!
//! Every pool worker is a dynamic background worker and counts against
//! `max_worker_processes`, beside PostgreSQL's own parallel workers, logical replication
//! workers, other extensions' workers and pg_stride's own two (scheduler and tuner).
//! A pool that took every free slot would leave a Gather in another database, a Gather
//! the pool declines and a logical replication worker with none. So:
//!
//! ```text
//! available  = max_worker_processes − pg_stride's static workers
//! kept_free  = min(max_parallel_workers, ⌈available / 2⌉)     native workers and the rest
//! server_cap = available − kept_free                           pool workers of all databases
//! db_cap     = min(pool_size, ⌈server_cap / 2⌉)  while another database has a pool,
//!              min(pool_size, server_cap)         otherwise
//! ```
//!
//! With PostgreSQL's defaults (8 worker processes, 8 parallel workers) the pool gets 3
//! slots and 3 stay for native workers; a second database's pool gets what the first
//! leaves of the 3.

/// The pool's limits for one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCaps {
    /// Pool workers of all databases together.
    pub server: u32,
    /// Pool workers of one database while no other database has any.
    pub alone: u32,
    /// Pool workers of one database while another has some.
    pub shared: u32,
}

/// The caps for a server with `max_worker_processes`, `max_parallel_workers`, pg_stride's
/// `static_workers` (registered at start) and a wanted `pool_size` per database.
pub fn pool_caps(
    max_worker_processes: u32,
    max_parallel_workers: u32,
    static_workers: u32,
    pool_size: u32,
) -> PoolCaps {
    let available = max_worker_processes.saturating_sub(static_workers);
    let kept_free = max_parallel_workers.min(available.div_ceil(2));
    let server = available - kept_free;
    PoolCaps {
        server,
        alone: pool_size.min(server),
        shared: pool_size.min(server.div_ceil(2)),
    }
}

impl PoolCaps {
    /// Whether a database that has `in_db` pool workers (started or starting) may start
    /// another, with `in_server` in all and `other_databases` other databases that have
    /// some.
    pub fn may_start(&self, in_db: u32, in_server: u32, other_databases: u32) -> bool {
        let db_cap = if other_databases > 0 { self.shared } else { self.alone };
        in_db < db_cap && in_server < self.server
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn postgresql_defaults_leave_half_for_native_workers() {
        let caps = pool_caps(8, 8, 2, 10);
        assert_eq!(caps, PoolCaps { server: 3, alone: 3, shared: 2 });
    }

    #[test]
    fn a_lower_max_parallel_workers_keeps_fewer_free() {
        assert_eq!(pool_caps(16, 2, 2, 32).server, 12);
    }

    #[test]
    fn pool_size_bounds_each_database() {
        let caps = pool_caps(64, 8, 2, 4);
        assert_eq!((caps.server, caps.alone, caps.shared), (54, 4, 4));
    }

    #[test]
    fn too_few_worker_processes_give_no_pool() {
        assert_eq!(pool_caps(2, 8, 2, 4).server, 0);
        assert_eq!(pool_caps(1, 8, 2, 4).server, 0);
        assert!(!pool_caps(3, 8, 2, 4).may_start(0, 0, 0));
    }

    #[test]
    fn a_second_database_gets_a_share_while_the_first_keeps_its_workers() {
        // 8 worker processes: the first database takes 3, the second none until the
        // first's workers exit; the native workers always have 3.
        let caps = pool_caps(8, 8, 2, 10);
        assert!(caps.may_start(2, 2, 0));
        assert!(!caps.may_start(3, 3, 0));
        assert!(!caps.may_start(0, 3, 1));
        // 16: the first database has 7, so the second may start up to the server cap.
        let caps = pool_caps(16, 8, 2, 10);
        assert!(caps.may_start(0, 6, 1));
        assert!(!caps.may_start(0, 7, 1));
    }

    proptest! {
        #[test]
        fn the_pool_never_takes_the_slots_it_leaves(mwp in 0u32..300, mpw in 0u32..300,
                                                     statics in 0u32..4, size in 0u32..64) {
            let caps = pool_caps(mwp, mpw, statics, size);
            let available = mwp.saturating_sub(statics);
            // Room for native workers: half of the available, or all they may use.
            prop_assert!(available - caps.server >= mpw.min(available.div_ceil(2)));
            prop_assert!(caps.alone <= caps.server && caps.shared <= caps.alone);
            prop_assert!(caps.alone <= size);
        }
    }
}
