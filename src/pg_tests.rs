//! In-server tests (`cargo pgrx test`), run against a server that preloads pg_stride.
//! The functions live in schema `tests`, where pgrx's test runner calls them.

#[pgrx::pg_schema]
mod tests {
    use crate::shmem;
    use pgrx::prelude::*;
    use std::sync::atomic::Ordering;

    /// Statements this backend has registered, as its shared entry says.
    fn my_running() -> u32 {
        let entry = shmem::shared()
            .and_then(|s| s.my_entry())
            .expect("pg_stride is preloaded in tests");
        entry.running.load(Ordering::Acquire)
    }

    #[pg_test]
    fn a_statement_too_short_for_a_chunk_takes_no_slot() {
        // The test runs inside a top-level SELECT without scans: it is registered for
        // admission but, never reaching a check-in, joins no query and holds no slot.
        let shared = shmem::shared().expect("pg_stride is preloaded in tests");
        let sched = shared.sched().expect("the CPU scheduler is initialised");
        let me = pg_stride_sched::ProcId(crate::pg::my_procno().unwrap() as u32);
        assert_eq!(my_running(), 1);
        assert!(!sched.is_running(me));
        assert_eq!(
            shared.my_entry().unwrap().cpu_query.load(Ordering::Acquire),
            0
        );
        assert_eq!(sched.running(), 0);
    }

    #[pg_test]
    fn the_table_checks_agree_with_the_group_limits() {
        // The limits are defined once, in pg_stride_sched::groups; the CHECK
        // constraints of pg_stride.resource_groups must accept and reject at exactly
        // the same values, or a restore could load rows the functions refuse.
        Spi::run(
            "CREATE FUNCTION pg_temp.accepts(col text, v bigint) RETURNS bool LANGUAGE plpgsql AS $$
             BEGIN
               EXECUTE format('INSERT INTO pg_stride.resource_groups (name, %I) VALUES (''probe'', %s)', col, v);
               RAISE EXCEPTION USING ERRCODE = 'P0001';
             EXCEPTION
               WHEN check_violation THEN RETURN false;
               -- Past an integer column's range (memory_budget's maximum is INT_MAX).
               WHEN numeric_value_out_of_range THEN RETURN false;
               WHEN raise_exception THEN RETURN true;
             END $$",
        )
        .unwrap();
        for limit in pg_stride_sched::groups::INTEGER_LIMITS {
            for (value, accepted) in [
                (limit.min, true),
                (limit.max, true),
                (limit.min - 1, false),
                (limit.max + 1, false),
            ] {
                let sql = format!("SELECT pg_temp.accepts('{}', {value})", limit.name);
                assert_eq!(
                    Spi::get_one::<bool>(&sql).unwrap(),
                    Some(accepted),
                    "{} = {value}",
                    limit.name
                );
            }
        }
    }

    // ReleaseCachedPlan takes a resource owner from PostgreSQL 14 on.
    #[cfg(not(feature = "pg13"))]
    #[pg_test]
    fn a_saved_plans_shape_is_kept_until_its_memory_goes() {
        // What a saved plan is, for statements too small to admit, is kept by its
        // address; once PostgreSQL deletes the plan's memory context the address may
        // hold another plan, so nothing may be kept for it any more. A plan made for one
        // execution is not kept at all.
        use crate::statements::plan_shapes;
        /// The first statement of a cached plan, one of a query: a PlannedStmt.
        unsafe fn first_statement(cached: *mut pg_sys::CachedPlan) -> *const pg_sys::PlannedStmt {
            assert!(!cached.is_null());
            // SAFETY: a cached plan's statement list has at least one element.
            unsafe { (*(*(*cached).stmt_list).elements).ptr_value.cast() }
        }
        // SAFETY: SPI calls inside a connection; each plan's first statement is a
        // PlannedStmt (a query, not a utility), released before its plan is freed.
        Spi::connect(|_| unsafe {
            let sql = c"SELECT relname FROM pg_class WHERE oid = 1259";
            let plan = pg_sys::SPI_prepare(sql.as_ptr(), 0, std::ptr::null_mut());
            assert!(!plan.is_null());
            assert_eq!(pg_sys::SPI_keepplan(plan), 0);
            let cached = pg_sys::SPI_plan_get_cached_plan(plan);
            let stmt = first_statement(cached);
            assert_eq!(plan_shapes::kept(stmt), None);
            assert!(matches!(plan_shapes::shape(stmt), plan_shapes::Shape::Read));
            assert_eq!(plan_shapes::kept(stmt), Some(true));
            pg_sys::ReleaseCachedPlan(cached, pg_sys::CurrentResourceOwner);
            assert_eq!(
                plan_shapes::kept(stmt),
                Some(true),
                "the plan is still saved"
            );
            assert_eq!(pg_sys::SPI_freeplan(plan), 0);
            assert_eq!(plan_shapes::kept(stmt), None, "the plan's memory is gone");

            let once = pg_sys::SPI_prepare(sql.as_ptr(), 0, std::ptr::null_mut());
            assert!(!once.is_null());
            let cached = pg_sys::SPI_plan_get_cached_plan(once);
            let stmt = first_statement(cached);
            assert!(matches!(plan_shapes::shape(stmt), plan_shapes::Shape::Read));
            assert_eq!(plan_shapes::kept(stmt), None, "a plan that is not saved");
            pg_sys::ReleaseCachedPlan(cached, std::ptr::null_mut());
            assert_eq!(pg_sys::SPI_freeplan(once), 0);
        })
    }

    #[pg_test]
    fn version_is_the_crate_version() {
        let version = Spi::get_one::<&str>("SELECT pg_stride.version()").unwrap();
        assert_eq!(version, Some(env!("CARGO_PKG_VERSION")));
    }

    #[pg_test]
    fn the_calling_statement_is_registered_once_and_nested_ones_are_not() {
        // The test runs inside one top-level statement; the SPI query below is nested in it
        // and must not count a second time.
        assert_eq!(my_running(), 1);
        let nested = Spi::get_one::<i64>("SELECT count(*) FROM generate_series(1, 10)").unwrap();
        assert_eq!(nested, Some(10));
        assert_eq!(my_running(), 1);
    }

    #[pg_test]
    fn the_scheduler_view_reads_shared_memory() {
        let slots = Spi::get_one::<i32>("SELECT cpu_slots FROM pg_stride.scheduler").unwrap();
        let expected = shmem::shared().unwrap().sched().unwrap().cpu_slots() as i32;
        assert_eq!(slots, Some(expected));
        assert!(expected >= 1);
    }

    #[pg_test]
    fn slice_has_a_time_unit() {
        Spi::run("SET pg_stride.slice = '500us'").unwrap();
        let shown = Spi::get_one::<&str>("SHOW pg_stride.slice").unwrap();
        assert_eq!(shown, Some("500us"));
        assert!((crate::cpu::slice_ms() - 0.5).abs() < 1e-9);
    }

    #[pg_test(error = "parameter \"pg_stride.cpu_slots\" cannot be changed now")]
    fn cpu_slots_cannot_be_set_in_a_session() {
        Spi::run("SET pg_stride.cpu_slots = 4").unwrap();
    }

    #[pg_test]
    fn the_scheduler_worker_shows_in_pg_stat_activity() {
        // The worker starts with the server; give it a moment on a slow machine.
        let mut found = None;
        for _ in 0..100 {
            found = Spi::get_one::<i32>(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_stride scheduler'",
            )
            .unwrap();
            if found.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let pid = found.expect("the pg_stride scheduler worker is running");
        let published =
            Spi::get_one::<i32>("SELECT scheduler_pid FROM pg_stride.scheduler").unwrap();
        assert_eq!(published, Some(pid));
    }

    #[pg_test]
    fn a_drop_database_that_fails_in_a_subtransaction_takes_its_hook_away() {
        use crate::executor::watches_object_drops;
        assert!(!watches_object_drops());
        // DROP DATABASE cannot run from a function: it fails inside the exception
        // block's subtransaction, which aborts alone, as a savepoint rolled back after a
        // DROP DATABASE that failed in a transaction block does.
        Spi::run(
            "DO $$ BEGIN EXECUTE 'DROP DATABASE IF EXISTS pg_stride_no_such_db'; \
             EXCEPTION WHEN active_sql_transaction THEN NULL; END $$",
        )
        .unwrap();
        assert!(!watches_object_drops());
    }

    unsafe extern "C-unwind" fn another_modules_hook(
        _access: pg_sys::ObjectAccessType::Type,
        _class_id: pg_sys::Oid,
        _object_id: pg_sys::Oid,
        _sub_id: std::ffi::c_int,
        _arg: *mut std::ffi::c_void,
    ) {
    }

    #[pg_test]
    fn a_hook_put_in_front_of_pg_strides_is_never_taken_out() {
        use crate::executor::{stop_watching_object_drops, watch_object_drops};
        // SAFETY: process-local hook variables, as a library's _PG_init sets them.
        let hook = || unsafe { pg_sys::object_access_hook }.map(|f| f as usize);
        let before = hook();
        watch_object_drops();
        assert_eq!(
            hook(),
            Some(crate::executor::object_access as *const () as usize)
        );
        // A library loaded while the DROP DATABASE runs puts its hook in front of
        // pg_stride's (and would chain to it).
        // SAFETY: as above.
        unsafe { pg_sys::object_access_hook = Some(another_modules_hook) };
        stop_watching_object_drops();
        assert_eq!(hook(), Some(another_modules_hook as *const () as usize));
        // pg_stride's stays in that chain: the next DROP DATABASE adds no second one.
        watch_object_drops();
        assert_eq!(hook(), Some(another_modules_hook as *const () as usize));
        // Put back as before the test (as if the other library had taken its hook out).
        // SAFETY: as above.
        unsafe { pg_sys::object_access_hook = Some(crate::executor::object_access) };
        stop_watching_object_drops();
        assert_eq!(hook(), before);
    }

    /// Sets a reload-level setting in this backend, as a reload of the configuration
    /// file would.
    fn set_as_reload(name: &std::ffi::CStr, value: &str) {
        let value = std::ffi::CString::new(value).unwrap();
        // SAFETY: SetConfigOption copies both strings; PGC_SIGHUP from the file is what
        // ProcessConfigFile uses.
        unsafe {
            pg_sys::SetConfigOption(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SIGHUP,
                pg_sys::GucSource::PGC_S_FILE,
            )
        };
    }

    /// The tuner on, and decay parameters of its own (λ 0.97, d_start 40) adopted:
    /// (the configured parameters, the tuned ones, the generation they were adopted at).
    fn tuned_decay_in_force(
        shared: &shmem::Shared,
    ) -> (
        pg_stride_sched::DecayParams,
        pg_stride_sched::DecayParams,
        u64,
    ) {
        let sched = shared.sched().unwrap();
        set_as_reload(c"pg_stride.tuner", "on");
        crate::config::apply(shared);
        let configured = sched.decay();
        let tuned = pg_stride_sched::DecayParams {
            lambda: 0.97,
            d_start: 40,
            ..configured
        };
        let generation = shared.tuner.choice().generation();
        assert!(shared.tuner.adopt(sched, tuned, generation));
        (configured, tuned, generation)
    }

    #[pg_test]
    fn a_reload_keeps_the_tuned_decay_unless_the_decay_settings_change() {
        let shared = shmem::shared().unwrap();
        let sched = shared.sched().unwrap();
        let d_start = crate::cpu::decay_params().d_start;
        let (configured, tuned, generation) = tuned_decay_in_force(shared);
        // A reload that changes nothing about decay (any SIGHUP).
        crate::config::apply(shared);
        assert_eq!(sched.decay(), tuned);
        let shown = Spi::get_one::<bool>(
            "SELECT decay_tuned AND decay_start = 40 FROM pg_stride.scheduler",
        );
        assert_eq!(shown.unwrap(), Some(true));
        // A DBA changes decay_start: it is in force at once, and a search that started
        // before the change cannot install its result.
        set_as_reload(c"pg_stride.decay_start", &(d_start + 4).to_string());
        crate::config::apply(shared);
        let changed = pg_stride_sched::DecayParams {
            d_start: d_start + 4,
            ..configured
        };
        assert_eq!(sched.decay(), changed);
        assert!(!shared.tuner.adopt(sched, tuned, generation));
        assert_eq!(sched.decay(), changed);
        // Adopted again, then the tuner is switched off: the configuration is back.
        assert!(shared
            .tuner
            .adopt(sched, tuned, shared.tuner.choice().generation()));
        set_as_reload(c"pg_stride.tuner", "off");
        crate::config::apply(shared);
        assert_eq!(sched.decay(), changed);
        set_as_reload(c"pg_stride.decay_start", &d_start.to_string());
        crate::config::apply(shared);
        assert_eq!(sched.decay(), configured);
    }

    #[pg_test]
    fn a_sessions_own_slice_is_not_published_by_its_groups_change() {
        let shared = shmem::shared().unwrap();
        let sched = shared.sched().unwrap();
        let (configured, tuned, _) = tuned_decay_in_force(shared);
        // A superuser's session sets its own slice, then changes the groups table (whose
        // trigger publishes the table as the session sees it): the server's decay
        // quantum, and the tuner's choice, stay as they were. So too when the groups
        // loader has its own slice (ALTER DATABASE … SET) and reads the committed table.
        let own_ms = crate::cpu::slice_ms() * 10.0;
        Spi::run(&format!("SET pg_stride.slice = {own_ms}")).unwrap();
        crate::config::reload_groups(shared, false);
        assert_eq!(sched.decay(), tuned);
        crate::config::reload_groups(shared, true);
        assert_eq!(sched.decay(), tuned);
        Spi::run("RESET pg_stride.slice").unwrap();
        set_as_reload(c"pg_stride.tuner", "off");
        crate::config::apply(shared);
        assert_eq!(sched.decay(), configured);
    }
}
