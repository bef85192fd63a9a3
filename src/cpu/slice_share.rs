//! How much of each slice a pinned holder ran (`pg_stride.swap_stalled_holders`).
//!
//! A holder that shares its CPU with another process still reaches its slice ends, only
//! later, so its clock as others see it moves and it is not stalled. It knows, though:
//! its own thread clock is exact. At each slice end it divides the CPU the slice used by
//! the wall-clock time the slice took and publishes that share in its process entry,
//! unless it blocked during the slice (I/O, a lock: time off its CPU that another CPU
//! would not give back). A lower-priority holder reads it at its own slice ends
//! (`pinning::serve_stalled`; the rule is `pg_stride_sched::stall::contended`, the
//! threshold `pg_stride.swap_below_share`).

use crate::backend_local::BackendLocal;
use crate::{gucs, pg, shmem};
use pg_stride_sched::stall;
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// When the current slice started (CLOCK_MONOTONIC ns) and the thread's voluntary
/// context switches then; `None` when shares are not measured.
static START: BackendLocal<Cell<Option<(u64, u64)>>> = BackendLocal::new(Cell::new(None));

/// Whether holders measure their shares: pinned slots, swapped when kept off their CPUs
/// for part of a slice.
fn measured() -> bool {
    gucs::PIN_SLOTS.get() && gucs::SWAP_STALLED_HOLDERS.get() && gucs::SWAP_BELOW_SHARE.get() > 0
}

/// A slice starts now: the process took a slot, or keeps its slot past a slice end.
/// Two clock reads and a system call with pinned slots; nothing without.
pub fn starts() {
    START.set(measured().then(|| (pg::monotonic_ns(), pg::thread_voluntary_switches())));
}

/// The slice that started at the last [`starts`] ends now, having used `used_ns` of
/// CPU: the share of its wall-clock time this process ran, ‰. `None` when it was not
/// measured or the process blocked during it.
pub fn ends(used_ns: u64) -> Option<u32> {
    let (started_ns, blocks) = START.replace(None)?;
    if pg::thread_voluntary_switches() != blocks {
        return None;
    }
    Some(stall::ran_permille(
        used_ns,
        pg::monotonic_ns().saturating_sub(started_ns),
    ))
}

/// Publishes this holder's share of the slice that just ended (`None`: withdraws the
/// last one, e.g. because the holder gives its slot up).
pub fn publish(shared: &shmem::Shared, ran: Option<u32>) {
    let Some(entry) = shared.my_entry() else {
        return;
    };
    match ran {
        Some(permille) => {
            entry.slice_ran_permille.store(permille, Ordering::Relaxed);
            entry
                .slice_share_at_ns
                .store(pg::monotonic_ns(), Ordering::Release);
        }
        None => entry.slice_share_at_ns.store(0, Ordering::Release),
    }
}

/// The share holder `entry` last published, for [`stall::contended`].
pub fn published(entry: &shmem::ProcEntry) -> stall::Share {
    let at_ns = entry.slice_share_at_ns.load(Ordering::Acquire);
    stall::Share {
        ran_permille: entry.slice_ran_permille.load(Ordering::Relaxed),
        at_ns,
    }
}

/// `pg_stride.swap_below_share` in ‰.
pub fn swap_below_permille() -> u32 {
    gucs::SWAP_BELOW_SHARE.get().clamp(0, 100) as u32 * 10
}
