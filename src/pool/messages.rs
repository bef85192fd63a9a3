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
use std::ffi::{c_char, c_int};

/// The methods and destination the worker had before the fragment's redirection.
static mut SAVED_COMM: *const PQcommMethods = std::ptr::null();
static mut SAVED_DEST: pg_sys::CommandDest::Type = pg_sys::CommandDest::DestNone;
/// The error queue of the fragment in progress; null between fragments.
static mut MQ_HANDLE: *mut pg_sys::shm_mq_handle = std::ptr::null_mut();
/// A message is being sent: one sent meanwhile (from an interrupt) detaches the queue.
static mut MQ_BUSY: bool = false;

/// A fragment begins: a longjmp out of a previous fragment's send left the flag set.
///
/// # Safety
/// Called by the pool worker, between fragments.
pub(super) unsafe fn reset() {
    // SAFETY: the caller's promise: no send is in progress.
    unsafe { MQ_BUSY = false };
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
        let mut kind = msgtype;
        let mut iov = [
            pg_sys::shm_mq_iovec {
                data: &raw mut kind,
                len: 1,
            },
            pg_sys::shm_mq_iovec { data: s, len },
        ];
        let result = loop {
            let r = shm_mq_sendv(MQ_HANDLE, iov.as_mut_ptr(), 2, true, true);
            if r != pg_sys::shm_mq_result::SHM_MQ_WOULD_BLOCK {
                break r;
            }
            wait_latch(None, wait_event::MQ_PUT_MESSAGE);
            check_for_interrupts();
        };
        MQ_BUSY = false;
        if result == pg_sys::shm_mq_result::SHM_MQ_SUCCESS {
            0
        } else {
            -1
        }
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
