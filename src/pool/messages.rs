//! A fragment's protocol messages to its leader (docs/design.md §6 step 5): while a
//! fragment runs, the pool worker sends what a backend would send its client (errors,
//! notices, the end of the fragment) into the leader's error queue for that worker.
//! These are pqmq.c's `PQcommMethods`, with one difference: pqmq.c's busy flag lives as
//! long as its process, which serves one query; a pool worker serves many, so the flag
//! is reset at every fragment ([`reset`]). Process-local statics of the one pool worker
//! thread.

use super::ffi::*;
use super::port::*;
use pgrx::pg_sys;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};

/// The methods and destination the worker had before the fragment's redirection.
static mut SAVED_COMM: *const PQcommMethods = std::ptr::null();
static mut SAVED_DEST: pg_sys::CommandDest::Type = pg_sys::CommandDest::DestNone;
/// The error queue of the fragment in progress; null between fragments.
static mut MQ_HANDLE: *mut pg_sys::shm_mq_handle = std::ptr::null_mut();
/// A message is being sent: one sent meanwhile (from an interrupt) detaches the queue.
static mut MQ_BUSY: bool = false;
/// While the fragment runs the plan: its slot's failure mark and its ticket's
/// generation. An ERROR or FATAL sets the mark before it waits for room in the queue,
/// so that a leader waiting for this worker inside its own part of the plan reads the
/// queue (failure_watch.rs).
static mut FAILURE_MARK: Option<(*const AtomicU64, u64)> = None;
/// Notices the queue had no room for, each with its type byte first, oldest first: they
/// go before any later message. A leader that runs its own part of the plan waits
/// there for this worker without reading the queue (a Parallel Hash build's barrier;
/// PostgreSQL reads its own workers' queues at any interrupt check, not the pool's), so
/// a worker that waited for room to send a notice would wait for ever. Errors and the
/// end of the fragment wait for room (the leader reads on: failure_watch.rs, and the
/// round's end), after the notices before them.
static mut DEFERRED: VecDeque<Vec<u8>> = VecDeque::new();
static mut DEFERRED_BYTES: usize = 0;
/// Beyond this many bytes deferred (bookkeeping included), a notice waits for room as
/// an error does.
const DEFER_LIMIT: usize = 8 << 20;
/// What keeping one notice costs beyond its bytes: its Vec and its place in the deque.
const DEFER_OVERHEAD: usize = 48;

/// A fragment begins: a longjmp out of a previous fragment's send left the flag set, or
/// notices deferred that never went.
///
/// # Safety
/// Called by the pool worker, between fragments.
pub(super) unsafe fn reset() {
    // SAFETY: the caller's promise: no send is in progress.
    unsafe {
        MQ_BUSY = false;
        FAILURE_MARK = None;
        forget_deferred();
    }
}

/// Sends what this process would send its client into `mqh`, the fragment's error
/// queue, until [`restore`].
///
/// # Safety
/// `mqh` is attached to the leader's error queue for this worker, as the sender.
pub(super) unsafe fn redirect_to(mqh: *mut pg_sys::shm_mq_handle) {
    // SAFETY: the caller's promise; libpq's process-local globals.
    unsafe {
        SAVED_COMM = PqCommMethods;
        SAVED_DEST = pg_sys::whereToSendOutput;
        MQ_HANDLE = mqh;
        PqCommMethods = &raw const POOL_COMM;
        pg_sys::whereToSendOutput = pg_sys::CommandDest::DestRemote;
    }
}

/// Tells the leader that the fragment ended without an error ('X', as
/// ParallelWorkerMain's exit does).
///
/// # Safety
/// Between [`redirect_to`] and [`restore`].
pub(super) unsafe fn send_terminate() {
    // SAFETY: the caller's promise: our methods are installed.
    unsafe {
        if let Some(put) = (*PqCommMethods).putmessage {
            put(b'X' as c_char, std::ptr::null(), 0);
        }
    }
}

/// The fragment entered the plan: from now until [`plan_done`], an error marks
/// `mark` with `gen` before it is sent (FAILURE_MARK).
///
/// # Safety
/// `mark` is the slot's failure mark in shared memory; called by the pool worker.
pub(super) unsafe fn plan_entered(mark: &AtomicU64, gen: u64) {
    // SAFETY: the caller's promise; a process-local static.
    unsafe { FAILURE_MARK = Some((std::ptr::from_ref(mark), gen)) };
}

/// The fragment's part of the plan ended: no leader waits for it there any more.
///
/// # Safety
/// Called by the pool worker.
pub(super) unsafe fn plan_done() {
    // SAFETY: a process-local static.
    unsafe { FAILURE_MARK = None };
}

/// Gives the worker back the methods and destination it had before [`redirect_to`].
///
/// # Safety
/// After [`redirect_to`]; the queue's segment is detached by the caller afterwards.
pub(super) unsafe fn restore() {
    // SAFETY: the caller's promise; libpq's process-local globals.
    unsafe {
        PqCommMethods = SAVED_COMM;
        pg_sys::whereToSendOutput = SAVED_DEST;
        MQ_HANDLE = std::ptr::null_mut();
        FAILURE_MARK = None;
        forget_deferred();
    }
}

unsafe extern "C-unwind" fn comm_reset() {}
unsafe extern "C-unwind" fn comm_flush() -> c_int {
    0
}
unsafe extern "C-unwind" fn comm_is_send_pending() -> bool {
    false
}
unsafe extern "C-unwind" fn comm_putmessage(
    msgtype: c_char,
    s: *const c_char,
    len: usize,
) -> c_int {
    // SAFETY: process-local statics; shm_mq calls on the handle this fragment attached.
    // A longjmp out of check_for_interrupts leaves MQ_BUSY set, which the next message
    // of the fragment treats as pqmq.c does, and the next fragment resets.
    unsafe {
        if MQ_BUSY {
            if !MQ_HANDLE.is_null() {
                shm_mq_detach(MQ_HANDLE);
            }
            MQ_HANDLE = std::ptr::null_mut();
            return -1;
        }
        if MQ_HANDLE.is_null() {
            return 0;
        }
        MQ_BUSY = true;
        if msgtype as u8 == b'E' {
            if let Some((mark, gen)) = FAILURE_MARK {
                (*mark).store(gen, Ordering::Release);
            }
        }
        let mut kind = msgtype;
        let mut iov = [
            pg_sys::shm_mq_iovec {
                data: &raw mut kind,
                len: 1,
            },
            pg_sys::shm_mq_iovec { data: s, len },
        ];
        let deferrable =
            msgtype as u8 == b'N' && DEFERRED_BYTES + len + DEFER_OVERHEAD < DEFER_LIMIT;
        let mut result = send_deferred(!deferrable);
        if result == pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
            result = send(iov.as_mut_ptr(), 2, !deferrable);
        }
        if result == pg_sys::shm_mq_result::SHM_MQ_WOULD_BLOCK {
            // Only a notice gets here: it follows the ones already deferred, or is the
            // one whose send began (the next try resends the same bytes, as shm_mq
            // requires of a send it could not finish).
            result = if defer(
                msgtype as u8,
                std::slice::from_raw_parts(s.cast::<u8>(), len),
            ) {
                pg_sys::shm_mq_result::SHM_MQ_SUCCESS
            } else {
                // No memory to keep it: it waits for room, as an error does, after the
                // notices kept before it.
                match send_deferred(true) {
                    pg_sys::shm_mq_result::SHM_MQ_SUCCESS => send(iov.as_mut_ptr(), 2, true),
                    failed => failed,
                }
            };
        }
        MQ_BUSY = false;
        if result == pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
            0
        } else {
            -1
        }
    }
}

/// Keeps a notice (its type byte, then `payload`) after those already deferred. False
/// when there is no memory for it: an allocation that fails must not abort the
/// process, as Rust's allocator would.
///
/// # Safety
/// Inside comm_putmessage.
unsafe fn defer(kind: u8, payload: &[u8]) -> bool {
    let mut message = Vec::new();
    // SAFETY: the caller's promise; process-local statics.
    unsafe {
        if message.try_reserve_exact(payload.len() + 1).is_err()
            || deferred().try_reserve(1).is_err()
        {
            return false;
        }
        message.push(kind);
        message.extend_from_slice(payload);
        DEFERRED_BYTES += message.len() + DEFER_OVERHEAD;
        deferred().push_back(message);
    }
    true
}

/// Sends one message (`iov`, `iovcnt` parts) into the fragment's queue; with `wait`,
/// waits for room, otherwise may give SHM_MQ_WOULD_BLOCK.
///
/// # Safety
/// Inside comm_putmessage, with the fragment's queue attached.
unsafe fn send(
    iov: *mut pg_sys::shm_mq_iovec,
    iovcnt: c_int,
    wait: bool,
) -> pg_sys::shm_mq_result::Type {
    // SAFETY: the caller's promise.
    unsafe {
        loop {
            let r = shm_mq_sendv(MQ_HANDLE, iov, iovcnt, true, true);
            if r != pg_sys::shm_mq_result::SHM_MQ_WOULD_BLOCK || !wait {
                return r;
            }
            wait_latch(None, wait_event::MQ_PUT_MESSAGE);
            check_for_interrupts();
        }
    }
}

/// Sends the deferred notices, oldest first; with `wait`, all of them, otherwise as many
/// as fit now (SHM_MQ_WOULD_BLOCK if some are left).
///
/// # Safety
/// As [`send`].
unsafe fn send_deferred(wait: bool) -> pg_sys::shm_mq_result::Type {
    // SAFETY: the caller's promise; process-local statics, each reference to the
    // deferred notices dropped before the next is taken.
    unsafe {
        loop {
            let Some(message) = deferred().front_mut() else {
                return pg_sys::shm_mq_result::SHM_MQ_SUCCESS;
            };
            let len = message.len();
            let mut iov = pg_sys::shm_mq_iovec {
                data: message.as_mut_ptr().cast(),
                len,
            };
            let r = send(&mut iov, 1, wait);
            if r == pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
                DEFERRED_BYTES -= len + DEFER_OVERHEAD;
                deferred().pop_front();
                continue;
            }
            if r != pg_sys::shm_mq_result::SHM_MQ_WOULD_BLOCK {
                forget_deferred();
            }
            return r;
        }
    }
}

/// The deferred notices.
///
/// # Safety
/// Process-local; no other reference to them is alive.
unsafe fn deferred() -> &'static mut VecDeque<Vec<u8>> {
    // SAFETY: the caller's promise.
    #[allow(clippy::deref_addrof)]
    unsafe {
        &mut *&raw mut DEFERRED
    }
}

/// Drops the deferred notices and the memory that held them (their queue is gone, or
/// the fragment ended).
///
/// # Safety
/// Process-local statics, outside comm_putmessage's sends.
unsafe fn forget_deferred() {
    // SAFETY: the caller's promise.
    unsafe {
        *deferred() = VecDeque::new();
        DEFERRED_BYTES = 0;
    }
}
unsafe extern "C-unwind" fn comm_putmessage_noblock(msgtype: c_char, s: *const c_char, len: usize) {
    // SAFETY: as comm_putmessage.
    unsafe { comm_putmessage(msgtype, s, len) };
}

static POOL_COMM: PQcommMethods = PQcommMethods {
    comm_reset: Some(comm_reset),
    flush: Some(comm_flush),
    flush_if_writable: Some(comm_flush),
    is_send_pending: Some(comm_is_send_pending),
    putmessage: Some(comm_putmessage),
    putmessage_noblock: Some(comm_putmessage_noblock),
};
