//! pg_stride: query scheduling and admission control for PostgreSQL.
use pgrx::prelude::*;

::pgrx::pg_module_magic!(name, version);
