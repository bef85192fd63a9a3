//! What each of pg_stride's static workers does on SIGHUP and SIGTERM, and as it exits.

use crate::{pg, shmem};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use std::sync::atomic::Ordering;

/// Re-reads the configuration files if a SIGHUP arrived since the last call; returns
/// whether it did.
pub(super) fn reload_config_if_signalled() -> bool {
    if !BackgroundWorker::sighup_received() {
        return false;
    }
    // SAFETY: the documented way for a background worker to reload its config.
    unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    true
}

/// Ends a worker that SIGTERM stopped. Exit code 1 has the postmaster start it again
/// after its restart time (code 0 would unregister it for good): a DBA's
/// `pg_terminate_backend` must not switch the safety net off until the next server
/// start. At shutdown the postmaster starts nothing again.
pub(super) fn exit_to_be_restarted() -> ! {
    // SAFETY: the documented way for a background worker to exit.
    unsafe { pg_sys::proc_exit(1) };
    // PostgreSQL 18's bindings lose proc_exit's noreturn attribute.
    #[allow(unreachable_code)]
    {
        unreachable!("proc_exit returned")
    }
}

/// At the exit of a static worker, however it exits (SIGTERM, or an ERROR: a
/// `pg_cancel_backend` or a failure): withdraws the pid or process number it published,
/// if it still is its own, so that `pg_stride.scheduler` shows no pid while it is not
/// running, and no reload request sets the latch of a process that took its number.
/// Registered with `pg::on_exit` once it published them.
#[pgrx::pg_guard]
pub(super) unsafe extern "C-unwind" fn forget_this_worker(_code: i32, _arg: pg_sys::Datum) {
    let Some(shared) = shmem::shared() else {
        return;
    };
    let me = pg::my_pid();
    for published in [&shared.scheduler_pid, &shared.tuner.pid] {
        let _ = published.compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
    if let Some(procno) = pg::my_procno() {
        shared.groups.forget_loader(procno);
    }
}
