-- The scheduler view reads live shared memory. This file runs alone, so the only
-- registered statements are this session's own.

-- The scheduler worker publishes its pid once it runs; wait for it (normally at once).
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    EXIT WHEN (SELECT scheduler_pid IS NOT NULL FROM pg_stride.scheduler);
    PERFORM pg_sleep(0.1);
  END LOOP;
END
$$;
SELECT s.scheduler_pid = a.pid AS worker_pid_published, a.backend_type, a.datname
  FROM pg_stride.scheduler s JOIN pg_stat_activity a ON a.pid = s.scheduler_pid;

-- The statement reading the view is itself running; nothing is queued.
SELECT cpu_slots >= 1 AS has_slots, running, queued, enabled FROM pg_stride.scheduler;

-- A disabled session is not scheduled.
SET pg_stride.enabled = off;
SELECT running, enabled FROM pg_stride.scheduler;
RESET pg_stride.enabled;

-- An open cursor stays registered until it is closed.
BEGIN;
DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g;
FETCH 1 FROM c;
SELECT running FROM pg_stride.scheduler;
CLOSE c;
SELECT running FROM pg_stride.scheduler;
COMMIT;

-- A cursor left open at commit is closed with its portal.
BEGIN;
DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g;
COMMIT;
SELECT running FROM pg_stride.scheduler;

-- A statement failing in the executor, and a cursor whose transaction aborts, leave
-- nothing behind (1 / 0 alone would fail in the planner, before the executor starts).
SELECT 1 / (g - 2) FROM generate_series(1, 3) g;
BEGIN;
DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g;
SELECT 1 / 0;
ROLLBACK;
SELECT running FROM pg_stride.scheduler;

-- Rolling back to a savepoint drops the cursors opened after it.
BEGIN;
SAVEPOINT s;
DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 3) g;
SELECT running FROM pg_stride.scheduler;
ROLLBACK TO SAVEPOINT s;
SELECT running FROM pg_stride.scheduler;
COMMIT;

-- A statement cancelled by statement_timeout leaves nothing behind.
SET statement_timeout = '100ms';
SELECT pg_sleep(5);
RESET statement_timeout;
SELECT running FROM pg_stride.scheduler;

-- Statements nested in a function run inside the calling statement's registration.
CREATE FUNCTION scheduler_running() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  RETURN (SELECT running FROM pg_stride.scheduler);
END
$$;
SELECT scheduler_running() AS running_seen_from_a_function;
DROP FUNCTION scheduler_running();

-- Statements of an AFTER trigger run in ExecutorFinish of the statement that fired it:
-- they are nested too.
CREATE TABLE firing (x int);
CREATE TABLE fired (running bigint);
CREATE FUNCTION note_running() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO fired SELECT running FROM pg_stride.scheduler;
  RETURN NULL;
END
$$;
CREATE TRIGGER note_running AFTER INSERT ON firing FOR EACH STATEMENT EXECUTE FUNCTION note_running();
INSERT INTO firing VALUES (1);
SELECT running AS running_seen_from_a_trigger FROM fired;
DROP TABLE firing, fired;
DROP FUNCTION note_running();

-- The nesting depth survives ERRORs. A nested statement that fails inside an exception
-- block leaves the function's later statements nested, and the next statement of the
-- same transaction top-level again; so does a statement rolled back to a savepoint.
CREATE FUNCTION running_after_caught_error() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    PERFORM 1 / (g - 2) FROM generate_series(1, 3) g;
  EXCEPTION WHEN division_by_zero THEN
    NULL;
  END;
  RETURN (SELECT running FROM pg_stride.scheduler);
END
$$;
BEGIN;
SELECT running_after_caught_error();
SELECT running FROM pg_stride.scheduler;
SAVEPOINT s;
SELECT running_after_caught_error() / 0;
ROLLBACK TO SAVEPOINT s;
SELECT running FROM pg_stride.scheduler;
SAVEPOINT t;
SELECT 1 / (g - 2) FROM generate_series(1, 3) g;
ROLLBACK TO SAVEPOINT t;
SELECT running FROM pg_stride.scheduler;
COMMIT;
DROP FUNCTION running_after_caught_error();

-- EXPLAIN, with and without ANALYZE, leaves nothing registered.
EXPLAIN (COSTS OFF) SELECT running FROM pg_stride.scheduler;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT 1 \g /dev/null
SELECT running FROM pg_stride.scheduler;
