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
        assert!((crate::gucs::SLICE_MS.get() - 0.5).abs() < 1e-9);
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
}
