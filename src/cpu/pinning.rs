//! Slot holders on CPUs of their own (`pg_stride.pin_slots`).
//!
//! With as many slots as CPUs, the kernel still decides where each holder runs, and it
//! may put two holders on one CPU while the other runs unslotted work (parse, plan,
//! the client) or even idles: the holders are runnable but not running, which the
//! trace measures (`held_runqueue`) and the simulator does not have
//! (bench/results/sim-gap/SIM_GAP.md). Pinning gives each holder one CPU for as long as
//! it holds its slot, and the CPU travels with the slot: the process that hands its slot
//! over pins the receiver to the CPU it leaves before it sets the receiver's latch, so
//! the receiver wakes where a CPU is about to be free, not where the kernel last saw it.
//!
//! Who owns which CPU is `shmem::CpuOwners`; each process's entry says which CPU it owns
//! (`slot_cpu`) and which it is pinned to (`pinned_cpu`). A holder that finds no CPU free
//! (slots lent for blocked holders, more slots than CPUs) runs unpinned. A process that
//! gives its slot up at ExecutorRun's end, or leaves its statement, runs with the
//! postmaster's CPUs again. A pinned holder asks the kernel for long time slices
//! ([`HOLDER_TIME_SLICE_MS`]), so that a process without a slot waking on its CPU
//! preempts it at once; each process asks for its own (`fit_own_slice`). With
//! `pg_stride.numa = bind` the slots belong to nodes and processes follow their node's
//! CPUs instead (`numa::follow_slot`).

use super::slice_share;
use crate::backend_local::BackendLocal;
use crate::os;
use crate::{pg, shmem};
use pg_stride_sched::pin_word;
use pg_stride_sched::stall::{self, HolderSample};
use pg_stride_sched::{ProcId, SchedShared};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{fence, Ordering};

/// The kernel time slice this process last asked for, ns (0: the kernel's default), and
/// whether it put itself in `SCHED_IDLE`: the process's kernel attributes, which outlive
/// its statements (it asks again only when what it wants changes).
static OWN_SCHEDULING: BackendLocal<Cell<(u64, bool)>> = BackendLocal::new(Cell::new((0, false)));
/// Whether this process may leave `SCHED_IDLE` again (`os::may_leave_idle_class`), once
/// asked.
static MAY_LEAVE_IDLE: BackendLocal<Cell<Option<bool>>> = BackendLocal::new(Cell::new(None));

/// Whether slot holders are pinned: on, and the slots are not split by node.
pub fn enabled(sched: &SchedShared) -> bool {
    crate::cpu::settings::pin_slots() && sched.node_count() == 1
}

/// This process holds a slot it took itself (or kept at a slice end): make sure it owns
/// a CPU — the one it runs on if that is free, so that nothing moves — and is pinned to
/// it, with its long slice. Three atomic reads when it already is, and, where the
/// process may leave `SCHED_IDLE` again, a look at the other holders' priorities.
pub fn hold(shared: &shmem::Shared, sched: &SchedShared, me: ProcId) {
    let Some(entry) = shared.procs().get(me.0 as usize) else {
        return;
    };
    // Only a process that may leave the idle class enters it: elsewhere (no
    // CAP_SYS_NICE, the usual case) the other holders are not looked at.
    let idle_wanted = may_leave_idle() && outranked(shared, sched, me);
    let me = me.0 as usize;
    let owned = cpu_of(entry.inbox.slot_cpu.load(Ordering::Acquire))
        .filter(|&c| shared.cpu_owners.owner(c) == Some(me));
    let cpu = owned.or_else(|| {
        let last = pin_word::cpu(entry.inbox.pinned_cpu.load(Ordering::Relaxed));
        let cpu = shared.cpu_owners.claim_free(me, &[os::current_cpu(), last]);
        entry
            .inbox
            .slot_cpu
            .store(cpu.map_or(0, |c| c + 1), Ordering::Release);
        cpu
    });
    pin(shared, me, cpu);
    fit_own_scheduling(entry, idle_wanted);
}

/// `from` gave its slot up (`None`: nobody did) and `to` was handed one (`None`: nobody
/// was). `from`'s CPU goes to `to`, or becomes free; a `to` that gets no CPU from `from`
/// takes a free one, or runs unpinned. Call before waking `to`.
pub fn pass(shared: &shmem::Shared, from: Option<ProcId>, to: Option<ProcId>) {
    let owners = &shared.cpu_owners;
    let procs = shared.procs();
    let from = from.map(|p| p.0 as usize);
    let to = to.map(|p| p.0 as usize);
    let released = from.and_then(|f| {
        let cpu = cpu_of(procs.get(f)?.inbox.slot_cpu.swap(0, Ordering::AcqRel))?;
        Some((f, cpu))
    });
    let Some(t) = to else {
        if let Some((f, cpu)) = released {
            owners.pass(cpu, f, None);
        }
        return;
    };
    let Some(entry) = procs.get(t) else { return };
    let handed = released.and_then(|(f, cpu)| owners.pass(cpu, f, Some(t)).then_some(cpu));
    let cpu = handed.or_else(|| {
        let last = pin_word::cpu(entry.inbox.pinned_cpu.load(Ordering::Relaxed));
        owners.claim_free(t, &[last])
    });
    entry
        .inbox
        .slot_cpu
        .store(cpu.map_or(0, |c| c + 1), Ordering::Release);
    pin(shared, t, cpu);
    // `to` may have left its statement meanwhile (a cancel while it was paused) and
    // unpinned itself before the line above pinned it: it owns nothing then (its leaving
    // freed the CPU, or the watchdog's sweep will), so it must run unpinned.
    if let Some(c) = cpu {
        if owners.owner(c) != Some(t) {
            pin(shared, t, None);
        }
    }
}

/// Whether a process handed a slot wakes on its giver's CPU without being pinned for
/// the slot: pinning is off, and the slots are not split by node.
///
/// Left to the kernel, a receiver wakes where it last ran or where the kernel finds
/// room, often a CPU on which the other holder runs, while the giver's CPU goes to work
/// without a slot: it then waits in the run queue holding its slot, and at a high load
/// the admission queue grows without bound
/// (bench/results/pinning-and-wakeups/alpha095_unpinned). Pinning the receiver to the
/// CPU its giver leaves, only until it runs, keeps one holder per CPU across hand-offs as
/// `pass` does, without binding any process to a CPU for longer than its wake-up.
pub fn places_receivers(sched: &SchedShared) -> bool {
    !crate::cpu::settings::pin_slots() && sched.node_count() == 1
}

/// This process handed its slot to `to` and leaves its CPU (`places_receivers`): pins
/// `to` to that CPU, to wake there, and returns whether it stays pinned. Call before
/// waking `to`; `to` gets its CPUs back once it runs with the slot (`unpin`, from the
/// check-in), or when it gives the slot up.
pub fn place(shared: &shmem::Shared, sched: &SchedShared, to: ProcId) -> bool {
    let Some(cpu) = os::current_cpu().filter(|&c| shared.cpu_owners.is_allowed(c)) else {
        return false;
    };
    let procno = to.0 as usize;
    let Some(entry) = shared.procs().get(procno) else {
        return false;
    };
    pin(shared, procno, Some(cpu));
    // `to` may be running already (woken by another latch, or it gave the slot up and
    // took another) and have looked for a pin to undo just before the line above pinned
    // it: only a process still paused waits to be woken here. The fence pairs with the
    // one in `unpin`: either `to` sees the pin and undoes it, or this sees that it no
    // longer waits.
    fence(Ordering::SeqCst);
    let waits = sched.is_running(to) && entry.paused.load(Ordering::Acquire) == 1;
    if !waits {
        pin(shared, procno, None);
    }
    waits
}

/// This process's statement ends (after it passed its slot on): it runs with the
/// postmaster's CPUs again. Nothing to do if it was never pinned.
pub fn leave(shared: &shmem::Shared, me: ProcId) {
    let Some(entry) = shared.procs().get(me.0 as usize) else {
        return;
    };
    if let Some(cpu) = cpu_of(entry.inbox.slot_cpu.swap(0, Ordering::AcqRel)) {
        shared.cpu_owners.pass(cpu, me.0 as usize, None);
    }
    unpin(shared, me);
}

/// This process gave its slot up and goes on without one: it runs with the
/// postmaster's CPUs again, while the CPU it owns stays its own until `pass` hands it
/// on. Nothing to do if it was never pinned.
pub fn unpin(shared: &shmem::Shared, me: ProcId) {
    // After this process stopped waiting or gave its slot up, before it looks for a pin:
    // pairs with the fence in `place`.
    fence(Ordering::SeqCst);
    pin(shared, me.0 as usize, None);
    if let Some(entry) = shared.procs().get(me.0 as usize) {
        fit_own_scheduling(entry, false);
    }
}

/// This process gave its slot up and waits for one: out of `SCHED_IDLE`, so that it
/// wakes with a slot in the class of everything else and finds it was outranked only
/// once it holds the slot again (a giver's `SCHED_BATCH` wake-up needs that class too).
pub fn pausing(shared: &shmem::Shared, me: ProcId) {
    leave_idle_class(shared, me);
}

/// Out of `SCHED_IDLE`, if this process is in it (no system call otherwise).
pub fn leave_idle_class(shared: &shmem::Shared, me: ProcId) {
    if let Some(entry) = shared.procs().get(me.0 as usize) {
        fit_own_scheduling(entry, false);
    }
}

/// Whether a holder that owns a CPU has a higher priority than holder `me`: the
/// scheduler would hand `me`'s slot to that one's queries first.
fn outranked(shared: &shmem::Shared, sched: &SchedShared, me: ProcId) -> bool {
    sched
        .holder_priority(me)
        .is_some_and(|mine| outranking(shared, sched, me, mine).next().is_some())
}

/// The holders that own a CPU and have a higher priority than `mine`, holder `me`'s:
/// (CPU, process number, priority) each.
fn outranking<'a>(
    shared: &'a shmem::Shared,
    sched: &'a SchedShared,
    me: ProcId,
    mine: u32,
) -> impl Iterator<Item = (u32, usize, u32)> + 'a {
    shared.cpu_owners.owned().filter_map(move |(cpu, p)| {
        let priority = sched
            .holder_priority(ProcId(p as u32))
            .filter(|&priority| priority > mine && p != me.0 as usize)?;
        Some((cpu, p, priority))
    })
}

/// The kernel time slice a pinned holder asks for, ms (Linux 6.12 and later): long
/// enough that work without a slot waits for the holder's slice rather than preempting
/// it, short enough that such work is not held back long; of the values tried, the one
/// that gave short statements the lowest slowdown (bench/results/handoff-and-slices/
/// alpha095_own_slices).
const HOLDER_TIME_SLICE_MS: f64 = 20.0;

/// The kernel time slice a process asks for once it left its pinned slot, ms (Linux
/// 6.12 and later): well below the kernel's default, so that such processes, each with
/// a little work between two waits, preempt each other at wake-up; it lowered short
/// statements' slowdown against the default (bench/results/cpu-interference/
/// alpha095_lead, runs D-F).
const UNSLOTTED_TIME_SLICE_MS: f64 = 0.2;

/// A pinned holder asks the kernel for long slices ([`HOLDER_TIME_SLICE_MS`]): a process
/// without a slot that wakes on its CPU, with the default slice, then preempts it at once
/// (EEVDF serves shorter requests first) to parse and plan or to answer its client,
/// rather than waiting out the holder's slice (bench/results/sim-gap/SIM_GAP.md). An
/// older kernel ignores the request. Without a slot, a process asks for short slices
/// ([`UNSLOTTED_TIME_SLICE_MS`]): such processes, each with a little work between two
/// waits (the rest of a statement, its reply, the next one's parse and plan), preempt
/// each other at wake-up instead of waiting out a protected default slice.
///
/// A pinned holder that another holder outranks (`idle_wanted`) goes further: in
/// `SCHED_IDLE`, its CPU counts as idle for the kernel's choice of a CPU for a waking
/// process, so the work without a slot (a backend parsing and planning, a kernel thread)
/// lands on the lower holder's CPU rather than on the higher one's, and runs there at
/// once, and the higher holder keeps its CPU (bench/results/cpu-interference/
/// alpha095_lead measures the time holders were runnable). The kernel lets a process
/// leave the class only with `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20: a process
/// without them never enters it.
///
/// Each process asks for its own slice and class, when it runs with a slot (or without
/// one again), never for a receiver it pins: with the giver setting the sleeping
/// receiver's slice, the receiver ran inside the tail of the statement that woke it more
/// often, and that statement's reply waited (bench/results/handoff-and-slices/
/// alpha095_own_slices). A system call only when what it wants changes.
fn fit_own_scheduling(entry: &shmem::ProcEntry, idle_wanted: bool) {
    let pinned = pin_word::cpu(entry.inbox.pinned_cpu.load(Ordering::Acquire)).is_some();
    let ms = if pinned {
        HOLDER_TIME_SLICE_MS
    } else {
        UNSLOTTED_TIME_SLICE_MS
    };
    let slice = (ms * 1e6) as u64;
    let idle = pinned && idle_wanted;
    let (had_slice, was_idle) = OWN_SCHEDULING.get();
    if (had_slice, was_idle) == (slice, idle) {
        return;
    }
    let class = (idle != was_idle).then_some(idle);
    // A refused slice (an older kernel's) is not asked for again; a refused class is.
    let ok = os::set_own_scheduling(slice, class).is_ok();
    OWN_SCHEDULING.set((slice, if ok { idle } else { was_idle }));
}

/// Whether this process may enter `SCHED_IDLE`: it can leave it again.
fn may_leave_idle() -> bool {
    if let Some(may) = MAY_LEAVE_IDLE.get() {
        return may;
    }
    let may = os::may_leave_idle_class();
    MAY_LEAVE_IDLE.set(Some(may));
    may
}

/// The holders of a higher priority, each as first sampled with its CPU time and
/// check-ins as they are now (`pg_stride_sched::stall`).
static SAMPLED: BackendLocal<RefCell<Vec<HolderSample>>> =
    BackendLocal::new(RefCell::new(Vec::new()));

/// A slice end at which pinned holder `me` keeps its slot, having run `ran` ‰ of the
/// slice (`slice_share`): samples the holders of a higher priority and, if one of them
/// has been kept off its CPU — stalled, or sharing it — while this process had its own
/// CPU to itself (`pg_stride_sched::stall`), swaps CPUs with it, the highest priority
/// first. The processes that keep a holder off its CPU are mostly the server's own work
/// without a slot and, on a virtual machine, kernel threads no holder can preempt:
/// swapping gives the CPU that is free of them to the higher priority
/// (bench/results/cpu-interference/alpha095_swap). A
/// clock read for each holder of a higher priority; nothing when there is none. Call
/// after `hold`.
pub fn serve_stalled(shared: &shmem::Shared, sched: &SchedShared, me: ProcId, ran: Option<u32>) {
    let before = SAMPLED.with_borrow_mut(std::mem::take);
    let Some(mine) = sched.holder_priority(me) else {
        return;
    };
    let (now, own_cpu) = (os::monotonic_ns(), os::thread_cpu_ns());
    let rule = slice_share::rule();
    let mut samples = Vec::new();
    let mut stalled: Option<(u32, usize, u32, bool)> = None;
    for (cpu, p, priority) in outranking(shared, sched, me, mine) {
        let Some(entry) = shared.procs().get(p) else {
            continue;
        };
        // A holder waiting on an event is not kept off its CPU. One handed its slot
        // still shows its pause's event until it runs: it was woken when handed the
        // slot, and waits for its CPU (for the giver's end of ExecutorRun at first,
        // as `placement::hand_over` has it, well under the stall's 5 ms).
        if !pg::proc_runs_or_waits_for_slot(p) {
            continue;
        }
        let pid = pg::proc_pid(p);
        let Some(cpu_ns) = (pid != 0).then(|| os::process_cpu_ns(pid)).flatten() else {
            continue;
        };
        let sample = HolderSample {
            procno: p,
            pid,
            at_ns: now,
            cpu_ns,
            checkins: entry.checkins.load(Ordering::Relaxed),
            observer_cpu_ns: own_cpu,
        };
        let first = before
            .iter()
            .find(|b| stall::unchanged(b, &sample))
            .copied()
            .unwrap_or(sample);
        let theirs = slice_share::published(entry);
        let still = stall::should_swap(&first, &sample);
        let sharing = ran.is_some_and(|own| stall::contended(theirs, rule, own, now));
        if (still || sharing) && stalled.is_none_or(|(best, ..)| priority > best) {
            stalled = Some((priority, p, cpu, !still));
        }
        samples.push(first);
    }
    if let Some((_, p, cpu, by_share)) = stalled {
        if swap(shared, me.0 as usize, p, cpu) {
            shared.cpu_swaps.fetch_add(1, Ordering::Relaxed);
            if by_share {
                shared.cpu_share_swaps.fetch_add(1, Ordering::Relaxed);
            }
            // Both shares were measured on the CPUs their holders leave: no other holder
            // acts on them.
            for q in [p, me.0 as usize] {
                if let Some(entry) = shared.procs().get(q) {
                    slice_share::moved(entry);
                }
            }
            // On another CPU now: sampled afresh from the next slice end.
            samples.clear();
        }
    }
    SAMPLED.set(samples);
}

/// Holder `me` takes `other`'s CPU `theirs` and gives it its own; returns whether it
/// did. `other` is pinned first: it then waits on this process's CPU, which it gets as
/// soon as this process moves off it. Ownership changes by compare-and-swap, so a
/// holder that gave its slot up or moved meanwhile is left alone; one that gives it up
/// while the swap is under way keeps the CPU it was given until the scheduler worker's
/// `sweep` frees it.
fn swap(shared: &shmem::Shared, me: usize, other: usize, theirs: u32) -> bool {
    let owners = &shared.cpu_owners;
    let procs = shared.procs();
    let (Some(my_entry), Some(their_entry)) = (procs.get(me), procs.get(other)) else {
        return false;
    };
    let Some(mine) = cpu_of(my_entry.inbox.slot_cpu.load(Ordering::Acquire)) else {
        return false;
    };
    if owners.owner(mine) != Some(me)
        || their_entry.inbox.slot_cpu.load(Ordering::Acquire) != theirs + 1
        || !owners.pass(theirs, other, Some(me))
    {
        return false;
    }
    if !owners.pass(mine, me, Some(other)) {
        owners.pass(theirs, me, Some(other));
        return false;
    }
    their_entry
        .inbox
        .slot_cpu
        .store(mine + 1, Ordering::Release);
    my_entry.inbox.slot_cpu.store(theirs + 1, Ordering::Release);
    pin(shared, other, Some(mine));
    pin(shared, me, Some(theirs));
    // As in `pass`: `other` may have left its statement and unpinned itself meanwhile.
    if owners.owner(mine) != Some(other) {
        pin(shared, other, None);
    }
    true
}

/// The scheduler worker's safety net: a CPU whose owner holds no slot (it died, or it
/// left while a slot was being handed to it) is freed, and the owner unpinned. An
/// owner between giving its slot up and passing its CPU on loses it here too; `pass`
/// then finds it free for the receiver.
pub fn sweep(shared: &shmem::Shared, sched: &SchedShared) {
    let owners = &shared.cpu_owners;
    for (cpu, p) in owners.owned() {
        if sched.is_running(ProcId(p as u32)) {
            continue;
        }
        if owners.pass(cpu, p, None) {
            if let Some(entry) = shared.procs().get(p) {
                let _ = entry.inbox.slot_cpu.compare_exchange(
                    cpu + 1,
                    0,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            pin(shared, p, None);
        }
    }
}

/// Pins process `procno` to `cpu` alone, or gives it the postmaster's CPUs back
/// (`None`), unless its mask is that already. A mask the kernel refuses (a cpuset that
/// changed) is said once per server in the log and leaves the process as it was.
fn pin(shared: &shmem::Shared, procno: usize, cpu: Option<u32>) {
    let Some(entry) = shared.procs().get(procno) else {
        return;
    };
    let mut seen = entry.inbox.pinned_cpu.load(Ordering::Acquire);
    if pin_word::cpu(seen) == cpu {
        return;
    }
    let pid = if Some(procno) == pg::my_procno() {
        0
    } else {
        match pg::proc_pid(procno) {
            0 => return,
            pid => pid,
        }
    };
    let mask = match cpu {
        Some(c) => vec![c],
        None => shared.cpu_owners.allowed(),
    };
    // Two processes may pin a third at once (a giver placing it, the process itself
    // unpinning): the entry is written only if nobody wrote it since this read it, else
    // the mask is set again, so that the last mask set is the one the entry names (the
    // word counts its writes: `pin_word`).
    while pin_word::cpu(seen) != cpu {
        if let Err(e) = os::set_allowed_cpus_of(pid, &mask) {
            if shared.nodes.first_bind_failure() {
                pgrx::log!(
                    "pg_stride: cannot pin process {procno} to CPUs {}: {e}; slot holders may run unpinned",
                    pg_stride_sched::numa::format_cpu_list(&mask)
                );
            }
            return;
        }
        match entry.inbox.pinned_cpu.compare_exchange(
            seen,
            pin_word::next(seen, cpu),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return,
            Err(now) => seen = now,
        }
    }
}

/// The CPU an entry's `slot_cpu` names.
fn cpu_of(stored: u32) -> Option<u32> {
    stored.checked_sub(1)
}
