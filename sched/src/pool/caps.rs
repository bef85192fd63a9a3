//! How many background-worker slots the pool may take.
//!
//! Every pool worker is a dynamic background worker and counts against
//! `max_worker_processes`, beside PostgreSQL's own parallel workers, logical replication
//! workers, other extensions' workers and pg_stride's own three (scheduler, groups loader, tuner).
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
//! With PostgreSQL's defaults (8 worker processes, 8 parallel workers) the pool gets 2
//! slots and 3 stay for native workers; a second database's pool gets what the first
//! leaves of the 2 (lifecycle.rs in the extension makes the first give one back when
//! it is idle).

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
        let db_cap = if other_databases > 0 {
            self.shared
        } else {
            self.alone
        };
        in_db < db_cap && in_server < self.server
    }

    /// Whether a running pool worker stays after the caps were lowered (a reload of
    /// `pool_size` or `max_parallel_workers`): `rank` is the number of its database's
    /// pool workers in lower slots. The lowest slots stay, so that the workers above a
    /// lowered cap each see the same answer and retire, without agreeing on anything.
    /// Sharing with other databases is left to the start of their workers (they make
    /// room as they need it).
    pub fn keeps(&self, rank: u32) -> bool {
        rank < self.alone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_lowered_pool_size_keeps_the_lowest_slots() {
        // pool_size lowered from 4 to 1 with PostgreSQL's defaults: of a database's
        // workers the one in the lowest slot stays, the others retire; to 0, none stays.
        let caps = pool_caps(8, 8, 3, 1);
        assert_eq!(
            (0..4).map(|rank| caps.keeps(rank)).collect::<Vec<_>>(),
            [true, false, false, false]
        );
        assert!(!pool_caps(8, 8, 3, 0).keeps(0));
        // Within the caps the pool keeps whatever it started.
        let caps = pool_caps(8, 8, 3, 10);
        assert!((0..caps.alone).all(|rank| caps.keeps(rank)));
    }

    #[test]
    fn postgresql_defaults_leave_half_for_native_workers() {
        // 8 worker processes, pg_stride's 3: 5 available, 3 kept free, 2 for the pool.
        let caps = pool_caps(8, 8, 3, 10);
        assert_eq!(
            caps,
            PoolCaps {
                server: 2,
                alone: 2,
                shared: 1
            }
        );
    }

    #[test]
    fn a_lower_max_parallel_workers_keeps_fewer_free() {
        assert_eq!(pool_caps(16, 2, 3, 32).server, 11);
    }

    #[test]
    fn pool_size_bounds_each_database() {
        let caps = pool_caps(64, 8, 3, 4);
        assert_eq!((caps.server, caps.alone, caps.shared), (53, 4, 4));
    }

    #[test]
    fn too_few_worker_processes_give_no_pool() {
        assert_eq!(pool_caps(3, 8, 3, 4).server, 0);
        assert_eq!(pool_caps(1, 8, 3, 4).server, 0);
        assert!(!pool_caps(4, 8, 3, 4).may_start(0, 0, 0));
    }

    #[test]
    fn a_second_database_gets_a_share_while_the_first_keeps_its_workers() {
        // 8 worker processes: the first database takes 2, the second none until one of
        // the first's workers exits; the native workers always have 3.
        let caps = pool_caps(8, 8, 3, 10);
        assert!(caps.may_start(1, 1, 0));
        assert!(!caps.may_start(2, 2, 0));
        assert!(!caps.may_start(0, 2, 1));
        assert!(caps.may_start(0, 1, 1));
        // 16: 13 available, 7 kept free, 6 for the pool; with a second database, each
        // may have 3 while the first's are below the server cap.
        let caps = pool_caps(16, 8, 3, 10);
        assert!(caps.may_start(0, 5, 1));
        assert!(!caps.may_start(0, 6, 1));
        assert!(!caps.may_start(3, 4, 1));
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
