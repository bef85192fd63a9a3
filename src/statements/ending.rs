//! A statement's end, and the process's: ExecutorEnd unregisters a statement
//! ([`end_at_once`], [`end`]); a failed, cancelled or timed-out one, whose ExecutorEnd
//! never runs, is unregistered when its portal's resource owner is released
//! ([`on_resource_release`]); a process that exits unregisters all of its own and clears
//! its shared entry ([`on_exit`]). Either way its CPU scheduling, workers, memory and
//! admission are given back in that order (`unregister_where`). [`claim`] makes a process
//! the owner of its entry and registers both callbacks at its first registered statement,
//! or a parallel worker's first part of one.

use super::registry::{
    Stage, Statement, BY_HISTORY_REGISTERED, LAST_OF_COMMAND, REGISTERED, TINY_REGISTERED,
};
use super::unadmitted;
use crate::backend_local::BackendLocal;
use crate::shmem::{self, ProcEntry};
use crate::{admission, cpu, parallel, pg};
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::atomic::Ordering;

/// Whether this process registered its exit and resource-release callbacks ([`claim`]).
static EXIT_CALLBACK_SET: BackendLocal<Cell<bool>> = BackendLocal::new(Cell::new(false));

/// What ExecutorEnd of `desc` found to do outside pgrx's error boundary
/// ([`end_at_once`]).
pub enum Ending {
    /// Nothing of this backend's: a nested statement (one that ran unadmitted is told
    /// before, by `unadmitted_ended`).
    NotRegistered,
    /// The statement ended; nothing is left to do.
    Ended,
    /// The statement ended and gave its admission back while statements wait:
    /// [`let_waiters_in`] lets them in, taking the queue's lock.
    EndedWithWaiters,
    /// A registered statement, or this parallel worker's part of one, ends through
    /// [`end`]: it joined CPU scheduling, holds workers or memory, has a tiny plan's runs
    /// to learn from, or the backend has further statements registered.
    NeedsEnd,
}

/// Where [`end_at_once`] found its statement.
enum Found {
    /// Alone in the list, holding nothing but its admission (if it took one): removed.
    Simple {
        admitted: bool,
        /// Its count in `ProcEntry::registered`.
        key: u32,
    },
    /// In the list, but it holds more, or has company.
    Other,
    Absent,
}

/// ExecutorEnd of `desc`: ends, here, the backend's one registered statement when it
/// holds nothing but its admission — a write, or a read of a transaction that wrote:
/// most of what an OLTP application sends —, and tells the hook what else to do. Cannot
/// panic: the hook calls it outside pgrx's error boundary, whose entry would cost as much
/// as the rest of such a statement's end. A nested statement is never registered.
pub fn end_at_once(desc: *const pg_sys::QueryDesc) -> Ending {
    let found = REGISTERED.try_with_borrow_mut(|list| match list.as_slice() {
        [r] if r.desc == desc
            && r.stage == Stage::Admitted
            && !r.tiny
            && r.by_history.is_none()
            && !r.reserved_memory
            && r.workers.granted == 0 =>
        {
            let (admitted, key) = (r.admitted, r.key);
            list.clear();
            Found::Simple { admitted, key }
        }
        _ if list.iter().any(|r| r.desc == desc) => Found::Other,
        _ => Found::Absent,
    });
    let (admitted, key) = match found {
        Some(Found::Simple { admitted, key }) => (admitted, key),
        // Borrowed: the guarded path tells.
        None | Some(Found::Other) => return Ending::NeedsEnd,
        Some(Found::Absent) if pg::is_parallel_worker() && cpu::is_member() => {
            return Ending::NeedsEnd
        }
        Some(Found::Absent) => return Ending::NotRegistered,
    };
    // As `unregister_where` does for such a statement, in the same order.
    let Some((shared, entry)) = shmem::shared().and_then(|s| Some((s, s.my_entry()?))) else {
        return Ending::Ended;
    };
    entry.running.fetch_sub(1, Ordering::AcqRel);
    entry.forget_rule_cancel_of(key);
    if admitted && admission::release(shared, entry) {
        Ending::EndedWithWaiters
    } else {
        Ending::Ended
    }
}

/// ExecutorEnd of `desc`: a registered statement ends, or this parallel worker's part of
/// one.
pub fn end(desc: *const pg_sys::QueryDesc) {
    if unregister_where(|r| r.desc == desc, false) == 0
        && pg::is_parallel_worker()
        && cpu::is_member()
    {
        if let Some(shared) = shmem::shared() {
            cpu::end_statement(shared, Some(desc), false);
        }
    }
}

/// A statement that [`end_at_once`] ended gave its admission back while statements
/// waited: lets them in (the queue's lock, so inside pgrx's error boundary).
pub fn let_waiters_in() {
    if let Some(shared) = shmem::shared() {
        admission::let_waiters_in(shared);
    }
}

/// Forgets every registration that matches, keeps the shared count in step, and
/// returns how many there were. `failed`: the statements ended with an error, or
/// their process exits.
fn unregister_where(matches: impl Fn(&Statement) -> bool, failed: bool) -> usize {
    let mut count = 0;
    // One at a time, allocating nothing: this runs at the end of every statement.
    while let Some(r) = REGISTERED.with_borrow_mut(|list| {
        let i = list.iter().position(&matches)?;
        Some(list.swap_remove(i))
    }) {
        count += 1;
        let Some(shared) = shmem::shared() else {
            continue;
        };
        let entry = shared.my_entry();
        // The entry stops counting the statement before its admission goes to the next
        // waiter, so that the views never count one statement twice.
        if let Some(entry) = entry {
            entry.running.fetch_sub(1, Ordering::AcqRel);
            // Unless a statement of its command goes on: a DO block's loop is judged
            // with its body as one, and the rule's cancel is the loop's too. The last
            // of a command's statements to end (the loop's query) forgets those of the
            // body, whose counts follow its own up to the command's latest.
            let goes_on = r.command.is_some()
                && REGISTERED.with_borrow(|list| list.iter().any(|o| o.command == r.command));
            if !goes_on {
                let last = match (r.command, LAST_OF_COMMAND.get()) {
                    (Some(command), (of, last)) if of == command => last,
                    _ => r.key,
                };
                entry.forget_rule_cancels_from(r.key, last);
            }
        }
        if r.stage == Stage::Joined {
            cpu::end_statement(shared, Some(r.desc), failed);
        }
        if r.tiny {
            TINY_REGISTERED.set(TINY_REGISTERED.get().saturating_sub(1));
            // Learned from statements that ended normally: their QueryDesc, text
            // included, is still whole at ExecutorEnd.
            if !failed && cpu::counts_as_long(r.ran_ns) {
                unadmitted::learn_long_run(r.desc);
            }
        }
        if let Some(h) = r.by_history {
            BY_HISTORY_REGISTERED.set(BY_HISTORY_REGISTERED.get().saturating_sub(1));
            // One that never ran (a cursor closed unfetched) says nothing.
            if !failed && r.ran_ns > 0 {
                cpu::record_unscheduled(
                    shared,
                    r.group,
                    (h.query_id, h.plan_cost),
                    h.predicted_us,
                    h.cpu_ns,
                );
            }
        }
        parallel::return_workers(shared, r.group, r.workers);
        // The backend's admission covers all its registered statements, whichever took
        // it: while one is still registered (a second cursor, when the first is closed)
        // it passes to that one, with its memory, so that the backend keeps running
        // under it (docs/design.md §4 rule 12).
        if r.admitted && pass_admission_on(r.reserved_memory) {
            continue;
        }
        if r.reserved_memory {
            if let Some(procno) = pg::my_procno() {
                admission::release_memory(shared, procno);
            }
        }
        if let (true, Some(entry)) = (r.admitted, entry) {
            if admission::release(shared, entry) {
                admission::let_waiters_in(shared);
            }
        }
    }
    count
}

/// The statement that held the backend's admission ended: the first statement still
/// registered, if any, holds it now, with the memory it reserved. Returns whether there
/// was one.
fn pass_admission_on(reserved_memory: bool) -> bool {
    REGISTERED.with_borrow_mut(|list| match list.first_mut() {
        Some(next) => {
            next.admitted = true;
            next.reserved_memory |= reserved_memory;
            true
        }
        None => false,
    })
}

/// Makes this process the owner of its shared entry. An entry still naming another pid
/// belonged to an earlier process with the same PGPROC; whatever it says is stale, but
/// an idle lease it kept is still counted as an admission and is given back.
#[inline]
pub(super) fn claim(shared: &shmem::Shared, entry: &ProcEntry) {
    if !EXIT_CALLBACK_SET.get() || entry.pid.load(Ordering::Acquire) != pg::my_pid() {
        claim_anew(shared, entry);
    }
}

/// [`claim`] for the first statement of the process, or of an entry an earlier
/// process left: out of line, so that every later statement's check stays two loads.
#[cold]
#[inline(never)]
fn claim_anew(shared: &shmem::Shared, entry: &ProcEntry) {
    let me = pg::my_pid();
    if entry.pid.load(Ordering::Acquire) != me {
        admission::give_back_lease(shared, entry);
        entry.reset();
        entry.pid.store(me, Ordering::Release);
    }
    // The postmaster's exit list is reset in every child, so this happens here. The
    // resource-release callback too, which PostgreSQL calls at every phase of every
    // resource owner's release: a backend that only runs statements too small to admit
    // never registers one, so it never pays for that call.
    // Marked done only once both are registered: the first allocates, and may fail.
    if !EXIT_CALLBACK_SET.get() {
        // SAFETY: registers a callback that cannot panic before its guarded call.
        unsafe {
            pg_sys::RegisterResourceReleaseCallback(Some(on_resource_release), std::ptr::null_mut())
        };
        pg::on_exit(on_exit);
        EXIT_CALLBACK_SET.set(true);
    }
}

/// Called for every phase of every resource-owner release, most of which have nothing to
/// do here: those return before entering pgrx's error boundary (which costs more than
/// this check), with code that cannot panic.
unsafe extern "C-unwind" fn on_resource_release(
    phase: pg_sys::ResourceReleasePhase::Type,
    _is_commit: bool,
    _is_top_level: bool,
    _arg: *mut std::ffi::c_void,
) {
    if phase != pg_sys::ResourceReleasePhase::RESOURCE_RELEASE_BEFORE_LOCKS
        || REGISTERED.try_with_borrow(|list| list.is_empty()) == Some(true)
    {
        return;
    }
    release_owner_registrations_cold();
}

/// The call into the guarded function, out of line: inlined, its set-up would be paid
/// by every call of the callback above.
#[cold]
#[inline(never)]
fn release_owner_registrations_cold() {
    // SAFETY: a guarded function, called as PostgreSQL would call it.
    unsafe { release_owner_registrations() };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn release_owner_registrations() {
    // SAFETY: while a resource owner is released, PostgreSQL makes it the
    // CurrentResourceOwner (ResourceOwnerReleaseInternal), so this names the owner
    // being released.
    let owner = unsafe { pg_sys::CurrentResourceOwner };
    unregister_where(|r| r.owner == owner, true);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_exit(_code: i32, _arg: pg_sys::Datum) {
    // Gives back the admissions still held (a terminated backend's cursors), leaves CPU
    // scheduling (a parallel worker's part, passing on its slot), leaves the admission
    // queue (a FATAL error ends a wait without unwinding), gives back the idle lease,
    // counts its admissions in its group, then clears the entry.
    unregister_where(|_| true, true);
    if let (Some(shared), Some(procno)) = (shmem::shared(), pg::my_procno()) {
        cpu::end_statement(shared, None, true);
        admission::leave_queue(shared, procno);
        if let Some(entry) = shared.my_entry() {
            admission::give_back_lease(shared, entry);
            admission::flush_admissions(shared, entry);
            entry.reset();
        }
    }
}
