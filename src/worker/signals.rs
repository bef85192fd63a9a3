//! What each of pg_stride's static workers does on SIGHUP and SIGTERM.

use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;

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
