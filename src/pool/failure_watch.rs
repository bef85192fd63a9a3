//! The leader's watch for a pool worker's ERROR while it runs its own part of a round
//! (docs/design.md §6).
//!
//! A parallel worker's ERROR interrupts its leader wherever it is: the worker signals
//! it (PROCSIG_PARALLEL_MESSAGE), and the leader's next CHECK_FOR_INTERRUPTS reads the
//! error queues of its parallel contexts and rethrows the ERROR (parallel.c,
//! HandleParallelMessages). PostgreSQL reads only the queues of workers it launched
//! itself, and a pool round launches none (leader.rs), so the pool reads its workers'
//! queues in the Gather's own loops (tickets.rs). That covers a leader waiting for
//! tuples, not one that runs its own part of the plan and waits there for the
//! workers: at a Parallel Hash build's barrier, or for the set-up of a parallel bitmap
//! or B-tree scan, whose waits PostgreSQL's code owns. Without this module, a worker
//! that failed there was waited for until the statement was cancelled.
//!
//! So a section of the leader's that may wait for its workers runs watched
//! ([`run_watched`]): while it runs, a timer looks every [`INTERVAL_MS`] ms whether one
//! of the round's workers failed (the caller's test). If one did, the timer asks for a
//! query cancel, as PostgreSQL's statement timeout does, and the section's own error
//! handler (a PG_TRY) takes the cancel that follows for the watch's, not the user's:
//! the caller then raises the worker's ERROR instead. Any other ERROR goes on as it
//! came.

use pgrx::pg_sys;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// How often the timer looks at the watched round: the longest a leader waits at a
/// barrier for a worker that failed.
const INTERVAL_MS: c_int = 20;

/// timeout.h's USER_TIMEOUT, the first identifier an extension may register: 17 added
/// TRANSACTION_TIMEOUT before it.
#[cfg(any(feature = "pg15", feature = "pg16"))]
const USER_TIMEOUT: c_int = 12;
#[cfg(not(any(feature = "pg15", feature = "pg16")))]
const USER_TIMEOUT: c_int = 13;

extern "C-unwind" {
    fn RegisterTimeout(id: c_int, handler: Option<unsafe extern "C-unwind" fn()>) -> c_int;
    fn enable_timeout_every(id: c_int, fin_time: pg_sys::TimestampTz, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    fn GetCurrentTimestamp() -> pg_sys::TimestampTz;
    fn geterrcode() -> c_int;
    fn FlushErrorState();
    fn pg_re_throw() -> !;
}

/// A watched section's test: whether a worker of the round at `arg` failed. Called from
/// a signal handler: it may only read memory.
pub(super) type FailedTest = unsafe fn(arg: *mut c_void) -> bool;

/// The argument of the innermost section running watched; null when none runs. One
/// word, so that the timer never sees it half written.
static WATCHED: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
/// The test of the sections, written before WATCHED is set (Release), never cleared.
static mut TEST: Option<FailedTest> = None;
/// The timer found the watched round's worker failed and asked for a cancel.
static mut CANCEL_ASKED: bool = false;
/// The timeout this process registered (-1: none yet).
static mut TIMEOUT_ID: c_int = -1;
/// Rounds that turned the timer on and have not turned it off yet.
static mut ROUNDS: u32 = 0;

/// A round starts watching: the timer runs while any round watches. Each call is
/// matched by one [`stop`].
///
/// # Safety
/// Called by a leader backend, outside any signal handler.
pub(super) unsafe fn start() {
    // SAFETY: process-local statics; timeout.c's functions as PostgreSQL's own callers
    // use them.
    unsafe {
        if TIMEOUT_ID < 0 {
            TIMEOUT_ID = RegisterTimeout(USER_TIMEOUT, Some(timer_fired));
        }
        if ROUNDS == 0 {
            let first = GetCurrentTimestamp() + i64::from(INTERVAL_MS) * 1000;
            enable_timeout_every(TIMEOUT_ID, first, INTERVAL_MS);
        }
        ROUNDS += 1;
    }
}

/// A round stops watching. Safe during an abort: PostgreSQL's error recovery may have
/// turned every timeout off already, which disable_timeout allows.
///
/// # Safety
/// After a matching [`start`].
pub(super) unsafe fn stop() {
    // SAFETY: as in start.
    unsafe {
        ROUNDS = ROUNDS.saturating_sub(1);
        if ROUNDS == 0 && TIMEOUT_ID >= 0 {
            disable_timeout(TIMEOUT_ID, false);
        }
    }
}

/// The timer's handler (timeout.c calls it from its SIGALRM handler, then sets the
/// latch): asks for a cancel if the watched round's worker failed. It asks again at
/// every tick while the section runs, in case code inside it caught the cancel (a
/// `WHEN query_canceled` block) and went on waiting.
unsafe extern "C-unwind" fn timer_fired() {
    // SAFETY: reads of process-local memory and writes of PostgreSQL's interrupt flags,
    // as StatementCancelHandler does; the test only reads memory.
    unsafe {
        let arg = WATCHED.load(Ordering::Acquire);
        if arg.is_null() {
            return;
        }
        let Some(test) = ptr::read_volatile(&raw const TEST) else {
            return;
        };
        if !test(arg) {
            return;
        }
        ptr::write_volatile(&raw mut CANCEL_ASKED, true);
        ptr::write_volatile(&raw mut pg_sys::QueryCancelPending, 1);
        ptr::write_volatile(&raw mut pg_sys::InterruptPending, 1);
    }
}

/// Runs `body` watched by `failed(arg)`, inside an error handler of its own. Returns
/// true when `body` returned; false when an ERROR ended it that was the cancel the watch
/// asked for: the error state is flushed, no cancel is pending, and the caller raises
/// the worker's ERROR. Every other ERROR is rethrown.
///
/// # Safety
/// Called between [`start`] and [`stop`]. `body` runs executor code: nothing with a
/// destructor may live in its frames, which an ERROR's longjmp skips.
pub(super) unsafe fn run_watched(
    failed: FailedTest,
    arg: *mut c_void,
    body: impl FnOnce(),
) -> bool {
    // SAFETY: PG_TRY's steps: the handler's jump buffer is installed for `body` only,
    // and the error context stack and memory context restored when an ERROR lands here
    // (errfinish leaves ErrorContext current).
    unsafe {
        TEST = Some(failed);
        let outer = WATCHED.swap(arg, Ordering::Release);
        let prev_stack = pg_sys::PG_exception_stack;
        let prev_context_stack = pg_sys::error_context_stack;
        let prev_memory = pg_sys::CurrentMemoryContext;
        let rc = cee_scape::call_with_sigsetjmp(false, |jump_buffer| {
            pg_sys::PG_exception_stack = ptr::from_ref(jump_buffer).cast_mut().cast();
            body();
            0
        });
        pg_sys::PG_exception_stack = prev_stack;
        pg_sys::error_context_stack = prev_context_stack;
        WATCHED.store(outer, Ordering::Release);
        let asked = ptr::replace(&raw mut CANCEL_ASKED, false);
        if asked {
            // The cancel the watch asked for ends with the section: raised here, or not
            // raised yet (the caller's loop then reads the worker's ERROR from its
            // queue). A user's cancel that came in the same instant goes with it; the
            // statement fails with the worker's ERROR all the same.
            ptr::write_volatile(&raw mut pg_sys::QueryCancelPending, 0);
        }
        if rc == 0 {
            return true;
        }
        if asked && geterrcode() == pgrx::PgSqlErrorCode::ERRCODE_QUERY_CANCELED as c_int {
            pg_sys::CurrentMemoryContext = prev_memory;
            FlushErrorState();
            return false;
        }
        // Another ERROR: a PL/pgSQL block may catch it and go on, with no cancel left.
        pg_re_throw()
    }
}
