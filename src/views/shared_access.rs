//! The shared region every view reads.

use crate::{pg, shmem};
use pgrx::prelude::*;

/// The shared region, or an error telling the DBA how to load pg_stride properly.
pub(super) fn require_shared() -> &'static shmem::Shared {
    match shmem::shared() {
        Some(shared) => shared,
        None => pg::raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_stride must be loaded via \"shared_preload_libraries\"".into(),
            Some("Add pg_stride to shared_preload_libraries in postgresql.conf and restart the server."),
        ),
    }
}
