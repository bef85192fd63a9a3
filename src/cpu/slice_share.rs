//! How much of each slice a pinned holder ran, for CPU swaps (`pinning::serve_stalled`).
//!
//! A holder that shares its CPU with another process still reaches its slice ends, only
//! later, so its clock as others see it moves and it is not stalled. It knows, though:
//! its own thread clock is exact. At each slice end it divides the CPU the slice used by
//! the wall-clock time the slice took and publishes that share in its process entry,
//! unless it blocked during the slice (I/O, a lock: time off its CPU that another CPU
//! would not give back). A lower-priority holder reads it at its own slice ends
//! (`pinning::serve_stalled`; the rule is `pg_stride_sched::stall::contended`, the
//! threshold [`BELOW_SHARE_PERCENT`]).

use crate::backend_local::BackendLocal;
use crate::{os, shmem};
use pg_stride_sched::stall;
use std::cell::Cell;
use std::sync::atomic::{fence, Ordering};

/// The current slice's start, while shares are measured.
#[derive(Clone, Copy)]
struct Start {
    /// CLOCK_MONOTONIC ns.
    at_ns: u64,
    /// The thread's voluntary context switches then.
    blocks: u64,
    /// The CPU (+1; 0 = none) the process owned then (`ProcEntry::slot_cpu`).
    cpu: u32,
}

/// Per slice of the process, not per statement: the slices of a process's statements
/// (open cursors) follow each other on its slot.
static START: BackendLocal<Cell<Option<Start>>> = BackendLocal::new(Cell::new(None));

/// The share of a slice's wall-clock time a holder ran, measured on the CPU it owned
/// throughout.
#[derive(Clone, Copy)]
pub struct Ran {
    pub permille: u32,
    /// That CPU, as `ProcEntry::slot_cpu` names it.
    cpu: u32,
}

/// A holder of a higher priority that ran less than this share of its last slice's
/// wall-clock time, without blocking, is kept off its CPU, and a lower holder swaps CPUs
/// with it. Well below the 90 % the lower holder must have run itself, so that two
/// holders on CPUs equally busy never swap back and forth. A holder that is kept off its
/// CPU by another process still advances its clock a little, so a rule on stalled
/// clocks alone misses it; the share catches it (bench/results/cpu-interference/
/// share_swaps compares the two).
const BELOW_SHARE_PERCENT: u32 = 67;

/// Whether holders measure their shares: pinned slots.
fn measured() -> bool {
    crate::cpu::settings::pin_slots()
}

/// The CPU this process owns (+1; 0 = none).
fn own_cpu(shared: &shmem::Shared) -> u32 {
    shared
        .my_entry()
        .map_or(0, |e| e.inbox.slot_cpu.load(Ordering::Acquire))
}

/// A slice starts now: the process keeps its slot past a slice end. An atomic load, a
/// clock read and a system call with pinned slots and the rule on; nothing without.
pub fn starts(shared: &shmem::Shared) {
    // A holder that owns no CPU (it runs unpinned) measures nothing: its share would be
    // of no CPU's.
    let cpu = measured().then(|| own_cpu(shared)).filter(|&cpu| cpu != 0);
    START.set(cpu.map(|cpu| Start {
        at_ns: os::monotonic_ns(),
        blocks: os::thread_voluntary_switches(),
        cpu,
    }));
}

/// The process is about to take a slot (again): a share it published before, of another
/// slot and perhaps another CPU, no longer says anything. Its first slice is measured
/// once it owns its CPU ([`starts`], from `placement::slot_taken`).
pub fn new_slot() {
    if let Some(entry) = shmem::shared().and_then(|s| s.my_entry()) {
        withdraw(entry);
    }
}

/// The slice that started at the last [`starts`] ends now, having used `used_ns` of
/// CPU: the share of its wall-clock time this process ran. `None` when it was not
/// measured, when the process owned no CPU (it ran unpinned: the share is of no CPU's),
/// when it blocked during the slice, when another process moved it to another CPU
/// meanwhile (a swap: the share would mix two CPUs), or when the slice lasted less than
/// half the slice target (cut short by a waiter's request: too short to judge by).
pub fn ends(shared: &shmem::Shared, used_ns: u64) -> Option<Ran> {
    let start = START.replace(None)?;
    let wall_ns = os::monotonic_ns().saturating_sub(start.at_ns);
    if os::thread_voluntary_switches() != start.blocks
        || own_cpu(shared) != start.cpu
        || wall_ns < crate::cpu::settings::slice_ns() / 2
    {
        return None;
    }
    Some(Ran {
        permille: stall::ran_permille(used_ns, wall_ns),
        cpu: start.cpu,
    })
}

/// Publishes this holder's share of the slice that just ended (`None`: withdraws the
/// last one, e.g. because the holder gives its slot up).
pub fn publish(shared: &shmem::Shared, ran: Option<Ran>) {
    let Some(entry) = shared.my_entry() else {
        return;
    };
    let Some(ran) = ran else {
        withdraw(entry);
        return;
    };
    entry
        .slice_ran_permille
        .store(ran.permille, Ordering::Relaxed);
    entry
        .slice_share_at_ns
        .store(os::monotonic_ns(), Ordering::Release);
    // A swap may have moved this holder since `ends` read its CPU. The swapper withdraws
    // the share after the move (`moved`): with the fences, either it sees the share
    // stored above, or this sees the move.
    fence(Ordering::SeqCst);
    if entry.inbox.slot_cpu.load(Ordering::Acquire) != ran.cpu {
        withdraw(entry);
    }
}

/// Holder `entry` was moved to another CPU by a swap (`slot_cpu` stored): the share it
/// published, measured on the CPU it left, no longer says anything. Pairs with the fence
/// in [`publish`].
pub fn moved(entry: &shmem::ProcEntry) {
    fence(Ordering::SeqCst);
    withdraw(entry);
}

/// Withdraws the share holder `entry` last published: it gives its slot up, takes a new
/// one, or was moved to another CPU. No store when there is nothing to withdraw.
fn withdraw(entry: &shmem::ProcEntry) {
    if entry.slice_share_at_ns.load(Ordering::Relaxed) != 0 {
        entry.slice_share_at_ns.store(0, Ordering::Release);
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

/// The rule: [`BELOW_SHARE_PERCENT`], and the slice target.
pub fn rule() -> stall::ShareRule {
    stall::ShareRule::new(BELOW_SHARE_PERCENT * 10, crate::cpu::settings::slice_ns())
}
