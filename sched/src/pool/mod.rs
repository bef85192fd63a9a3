//! Rules of the pool of parallel workers (the extension's `pool` module) that need no
//! PostgreSQL types: which server releases its private layouts were checked against,
//! and how many background-worker slots the pool may take.
//!
//! * [`versions`] — the checked ranges of minor releases.
//! * [`caps`] — the pool's share of `max_worker_processes`.

pub mod caps;
pub mod versions;
