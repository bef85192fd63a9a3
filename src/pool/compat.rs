//! Whether this server can run the pool at all. Asked by every Gather before it posts
//! tickets; the answer is computed once per process.
//!
//! * The pool worker reads parallel.c's private layouts, checked for a range of minor
//!   releases per major (pg_stride_sched::pool::versions): on any other release the
//!   pool falls back to PostgreSQL's workers, and says so once in the server log.
//! * A server built with assertions refuses the second `SetAuthenticatedUserId` of a
//!   process (identity.rs): no pool there either.

use super::shared::{Fallback, PoolShared};
use pg_stride_sched::pool::versions;
use pgrx::pg_sys;
use std::ffi::CStr;
use std::sync::atomic::Ordering;

/// The answer of [`unavailable`] once asked: `Some(None)` when the pool may run.
static mut ANSWER: Option<Option<Fallback>> = None;

/// Why this server cannot run the pool, if it cannot. Cannot panic.
pub(super) fn unavailable(pool: &PoolShared) -> Option<Fallback> {
    // SAFETY: process-local.
    if let Some(answer) = unsafe { ANSWER } {
        return answer;
    }
    let answer = why_not();
    if let Some(why) = answer {
        if !pool.unavailable_warned.swap(true, Ordering::AcqRel) {
            warn(why);
        }
    }
    // SAFETY: process-local.
    unsafe { ANSWER = Some(answer) };
    answer
}

/// The server's `server_version_num`. A debug build (what the test suites install)
/// takes PG_STRIDE_TEST_SERVER_VERSION_NUM from the server's environment instead, so
/// that a test can show what an unchecked release does.
pub fn server_version_num() -> u32 {
    #[cfg(debug_assertions)]
    if let Some(v) = std::env::var("PG_STRIDE_TEST_SERVER_VERSION_NUM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return v;
    }
    setting(c"server_version_num")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn setting(name: &CStr) -> Option<String> {
    // SAFETY: GetConfigOption with missing_ok returns NULL or a string it keeps.
    unsafe {
        let value = pg_sys::GetConfigOption(name.as_ptr(), true, false);
        (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned())
    }
}

fn why_not() -> Option<Fallback> {
    if !versions::layout_checked(server_version_num()) {
        return Some(Fallback::UncheckedRelease);
    }
    if setting(c"debug_assertions").as_deref() == Some("on") {
        return Some(Fallback::AssertBuild);
    }
    None
}

#[pgrx::pg_guard]
extern "C-unwind" fn warn(why: Fallback) {
    use pgrx::{PgLogLevel, PgSqlErrorCode};
    let version = server_version_num();
    let (message, hint) = match why {
        Fallback::UncheckedRelease => (
            format!(
                "pg_stride.parallel_mode = pool is not available on PostgreSQL {}.{}; parallel queries use PostgreSQL's own workers",
                version / 10_000,
                version % 10_000
            ),
            match versions::checked_range(version) {
                Some(range) => format!(
                    "The pool was checked against releases {range} of this major. Install a pg_stride release that supports this one, or set pg_stride.parallel_mode = native."
                ),
                None => "Set pg_stride.parallel_mode = native.".to_string(),
            },
        ),
        _ => (
            "pg_stride.parallel_mode = pool is not available on a server built with assertions; parallel queries use PostgreSQL's own workers".to_string(),
            "Set pg_stride.parallel_mode = native.".to_string(),
        ),
    };
    crate::pg::report(
        PgLogLevel::WARNING,
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        message,
        Some(&hint),
    );
}
