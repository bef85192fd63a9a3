-- Resource groups: the functions that manage them, their errors, the pg_stride.groups
-- view, assignment through pg_stride.resource_group, and the shared directory following the
-- table (commit, rollback, direct changes).

-- Groups live in the database named by pg_stride.database; elsewhere the functions
-- refuse.
SHOW pg_stride.database;
SELECT pg_stride.create_group('reporting');

\c postgres
CREATE EXTENSION pg_stride;
-- The table is extension configuration: pg_dump keeps its rows.
SELECT extconfig::regclass[] FROM pg_extension WHERE extname = 'pg_stride';

-- Only "default" exists at first, with the server-wide settings.
SELECT name, weight, max_concurrency, max_parallel_workers, priority_initial,
       priority_min, decay_lambda, decay_start, pinned
  FROM pg_stride.groups;

SELECT pg_stride.create_group('reporting', weight => 300, max_concurrency => 4);
SELECT pg_stride.create_group('batch', weight => 50, max_parallel_workers => 2,
       priority_initial => 5000, priority_min => 50, decay_lambda => 0.8,
       decay_start => 4, pinned => true);
SELECT name, weight, max_concurrency, max_parallel_workers, priority_initial,
       priority_min, decay_lambda, decay_start, pinned
  FROM pg_stride.groups;

-- Errors: duplicates, bad names, values out of range, unknown groups, "default".
SELECT pg_stride.create_group('reporting');
SELECT pg_stride.create_group('');
SELECT pg_stride.create_group(repeat('x', 64));
SELECT pg_stride.create_group(' padded');
SELECT pg_stride.create_group('a;b');
SELECT pg_stride.create_group('x', weight => 0);
SELECT pg_stride.create_group('x', weight => 10001);
SELECT pg_stride.create_group('x', max_concurrency => -1);
SELECT pg_stride.create_group('x', max_parallel_workers => -1);
SELECT pg_stride.create_group('x', max_queued => -1);
SELECT pg_stride.create_group('x', queue_timeout => 86400001);
SELECT pg_stride.create_group('x', priority_initial => 100, priority_min => 200);
SELECT pg_stride.create_group('x', decay_lambda => 1.5);
SELECT pg_stride.create_group('x', decay_lambda => 'NaN');
SELECT pg_stride.create_group('x', decay_start => -1);
SELECT pg_stride.alter_group('nosuch', weight => 10);
SELECT pg_stride.alter_group('batch', priority_min => 6000);
SELECT pg_stride.drop_group('nosuch');
SELECT pg_stride.drop_group('default');
-- NULL where a value is required: SQLSTATE 22004, not an internal error. drop_group
-- is STRICT, so its NULL call does nothing.
SELECT pg_stride.create_group(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_stride.create_group('x', weight => NULL);
SELECT pg_stride.create_group('x', max_concurrency => NULL);
SELECT pg_stride.create_group('x', pinned => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_stride.alter_group(NULL, weight => 10);
SELECT pg_stride.drop_group(NULL);
-- None of the failed calls left anything behind.
SELECT name FROM pg_stride.groups;

-- Altering changes only the settings given; "default" gets a row once altered.
SELECT pg_stride.alter_group('reporting', weight => 200);
SELECT pg_stride.alter_group('default', max_concurrency => 64);
SELECT name, weight, max_concurrency FROM pg_stride.groups;
SELECT name, weight, max_concurrency FROM pg_stride.resource_groups ORDER BY name;

-- Assignment: unknown groups are rejected; a statement runs in its session's group.
-- Superusers' statements skip admission (pg_stride.exempt_superuser), so the counting
-- is done as an ordinary role.
CREATE ROLE stride_member;
GRANT USAGE ON SCHEMA pg_stride TO stride_member;
-- Its own backend authenticated as the superuser: what pg_stride.activity shows of
-- it beyond its existence needs pg_read_all_stats, as in pg_stat_activity.
GRANT pg_read_all_stats TO stride_member;
SET pg_stride.resource_group = 'nosuch';
SET pg_stride.resource_group = 'reporting';
SET ROLE stride_member;
SELECT name, active, admitted_total, timed_out_total FROM pg_stride.groups WHERE name = 'reporting';
SELECT "group", state, statements, queued_since IS NULL AS not_queued, admitted_at BETWEEN now() AND clock_timestamp() AS admitted_now
  FROM pg_stride.activity WHERE pid = pg_backend_pid();
RESET ROLE;
-- A group is in use while a statement runs in it, so this statement cannot drop it.
SELECT pg_stride.drop_group('reporting');
RESET pg_stride.resource_group;
SELECT name, active, admitted_total, queue_time_p50_ms, queue_time_p99_ms
  FROM pg_stride.groups WHERE name = 'reporting';
-- The same waits as a histogram for Prometheus: bucket bounds in seconds (1 µs, then
-- 1 ms to 72 min by factors of 4), cumulative counts, sum and count. Both statements
-- were admitted at once, so every bound counts both, and the count is admitted_total.
SELECT name, le_seconds, buckets, sum_seconds, count
  FROM pg_stride.queue_time_histogram() WHERE name = 'reporting';

-- A statement can name its group in a comment before its first word, without a SET:
-- honoured for roles that may set pg_stride.resource_group, passed over with a WARNING
-- otherwise or when the group does not exist. Each statement of a query string reads
-- its own comment; the session's group is left as it was.
SET ROLE stride_member;
/* pg_stride.resource_group=reporting */ SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
RESET ROLE;
GRANT SET ON PARAMETER pg_stride.resource_group TO stride_member;
SET ROLE stride_member;
/* app='regress', pg_stride.resource_group='reporting' */ SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
SELECT "group" AS untagged FROM pg_stride.activity WHERE pid = pg_backend_pid();
/* pg_stride.resource_group=nosuch */ SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
-- The two WARNINGs' SQLSTATEs: insufficient_privilege, undefined_object.
\set VERBOSITY sqlstate
RESET ROLE;
REVOKE SET ON PARAMETER pg_stride.resource_group FROM stride_member;
SET ROLE stride_member;
/* pg_stride.resource_group=reporting */ SELECT 'runs' AS denied;
RESET ROLE;
GRANT SET ON PARAMETER pg_stride.resource_group TO stride_member;
SET ROLE stride_member;
/* pg_stride.resource_group=nosuch */ SELECT 'runs' AS unknown;
\set VERBOSITY default
SELECT 1 AS first \; /* pg_stride.resource_group=reporting */ SELECT "group" AS second FROM pg_stride.activity WHERE pid = pg_backend_pid() \; SELECT "group" AS third FROM pg_stride.activity WHERE pid = pg_backend_pid();
-- The tag of the statement the client sends applies to the statements run for it: the
-- query of an EXECUTE, a cursor or a CREATE TABLE AS, the statements of a DO block.
PREPARE whose_group AS SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
/* pg_stride.resource_group=reporting */ EXECUTE whose_group;
EXECUTE whose_group;
DEALLOCATE whose_group;
BEGIN;
/* pg_stride.resource_group=reporting */ DECLARE whose_group CURSOR FOR SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
FETCH whose_group;
COMMIT;
/* pg_stride.resource_group=reporting */ CREATE TEMP TABLE whose_group AS SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
TABLE whose_group;
DROP TABLE whose_group;
/* pg_stride.resource_group=reporting */ DO $$
DECLARE
  g text;
BEGIN
  SELECT "group" INTO g FROM pg_stride.activity WHERE pid = pg_backend_pid();
  RAISE NOTICE 'a statement of the DO block runs in group %', g;
END
$$;
-- A utility that fails, here inside the client's savepoint (psql's ON_ERROR_ROLLBACK),
-- leaves no tag behind for the statements after it: the third one runs untagged.
\set ON_ERROR_ROLLBACK on
BEGIN;
/* pg_stride.resource_group=reporting */ EXPLAIN (ANALYZE, COSTS OFF) SELECT 1 / 0;
/* pg_stride.resource_group=reporting */ SELECT 1 AS first \; SELECT 2 AS second \; SELECT "group" AS third FROM pg_stride.activity WHERE pid = pg_backend_pid();
COMMIT;
\set ON_ERROR_ROLLBACK off
-- Not a tag: a comment inside the statement, or one behind a line comment.
SELECT /* pg_stride.resource_group=reporting */ "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
/* pg_stride.resource_group=reporting */
-- a line comment hides the tag
SELECT "group" FROM pg_stride.activity WHERE pid = pg_backend_pid();
RESET ROLE;
REVOKE SET ON PARAMETER pg_stride.resource_group FROM stride_member;
SHOW pg_stride.resource_group;

-- A statement is judged as the role that sent the client's command: the statements of
-- a SECURITY DEFINER procedure owned by a superuser, called by stride_member, run as
-- the superuser but are stride_member's. Its tag is passed over (stride_member may not
-- set pg_stride.resource_group), and its statement is admitted (no superuser exemption).
CREATE PROCEDURE definer_reports_its_group() LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
  g text;
BEGIN
  SELECT "group" INTO g FROM pg_stride.activity WHERE pid = pg_backend_pid();
  RAISE NOTICE 'the procedure''s statement runs in group %', g;
END
$$;
GRANT EXECUTE ON PROCEDURE definer_reports_its_group() TO stride_member;
SELECT admitted_total AS admitted_before FROM pg_stride.groups WHERE name = 'default' \gset
SET ROLE stride_member;
/* pg_stride.resource_group=reporting */ CALL definer_reports_its_group();
RESET ROLE;
SELECT admitted_total - :admitted_before AS admitted_as_the_caller
  FROM pg_stride.groups WHERE name = 'default';
DROP PROCEDURE definer_reports_its_group();

-- With max_concurrency 1, an open cursor holds the group's only admission. The
-- session's next statements run under it instead of waiting for it, which would be
-- waiting for itself (queue_timeout makes that fail here instead of hang), and so do
-- the statements in the loop of a DO block over a query. `active` counts running
-- statements: the cursor and the statement reading the view.
SELECT pg_stride.create_group('single', max_concurrency => 1);
SET pg_stride.resource_group = 'single';
SET ROLE stride_member;
SET pg_stride.queue_timeout = '200ms';
BEGIN;
DECLARE c CURSOR FOR SELECT 1;
SELECT 'admitted' AS with_a_cursor_open;
SELECT name, active FROM pg_stride.groups WHERE name = 'single';
ROLLBACK;
DO $$
DECLARE
  r record;
  n bigint := 0;
BEGIN
  FOR r IN SELECT g FROM generate_series(1, 3) g LOOP
    n := n + (SELECT count(*) FROM generate_series(1, r.g));
  END LOOP;
  RAISE NOTICE 'the loop body counted % rows', n;
END
$$;
-- The cursor's admission went with the transaction; statements are admitted again.
SELECT 'admitted' AS after_rollback;
RESET pg_stride.queue_timeout;
RESET ROLE;
RESET pg_stride.resource_group;
SELECT name, active, queued, admitted_total, timed_out_total FROM pg_stride.groups WHERE name = 'single';
SELECT pg_stride.reset_stats();
SELECT name, admitted_total, timed_out_total, queue_time_total_ms, queue_time_p50_ms
  FROM pg_stride.groups WHERE name = 'single';
SELECT name, buckets, sum_seconds, count
  FROM pg_stride.queue_time_histogram() WHERE name = 'single';
SELECT pg_stride.drop_group('single');
REVOKE USAGE ON SCHEMA pg_stride FROM stride_member;
DROP ROLE stride_member;

-- A group created in a transaction that rolls back disappears again (the scheduler
-- worker reloads the committed table).
BEGIN;
SELECT pg_stride.create_group('temporary');
SELECT name FROM pg_stride.groups WHERE name = 'temporary';
ROLLBACK;
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    EXIT WHEN NOT EXISTS (SELECT FROM pg_stride.groups WHERE name = 'temporary');
    PERFORM pg_sleep(0.05);
  END LOOP;
END
$$;
SELECT count(*) AS temporary_groups FROM pg_stride.groups WHERE name = 'temporary';

-- Nor can such a transaction be prepared (COMMIT PREPARED, from any session, would leave
-- the groups in effect behind the table): PREPARE TRANSACTION fails and rolls it back.
-- A transaction that changed no group prepares as usual.
BEGIN;
SELECT pg_stride.create_group('prepared');
PREPARE TRANSACTION 'stride_groups';
SELECT count(*) AS prepared_rows FROM pg_stride.resource_groups WHERE name = 'prepared';
SELECT count(*) > 0 AS prepared FROM pg_prepared_xacts WHERE gid = 'stride_groups' \gset
\if :prepared
ROLLBACK PREPARED 'stride_groups';
\endif
SELECT :'prepared' AS prepared;
BEGIN;
SELECT count(*) AS groups_read FROM pg_stride.resource_groups WHERE name = 'prepared';
PREPARE TRANSACTION 'stride_no_groups';
COMMIT PREPARED 'stride_no_groups';

-- A session whose group disappears runs in "default", with a WARNING.
SET pg_stride.resource_group = 'batch';
DELETE FROM pg_stride.resource_groups WHERE name = 'batch';
SELECT name FROM pg_stride.groups WHERE name = 'batch';
-- Its SQLSTATE: undefined_object (docs/errors.md).
\set VERBOSITY sqlstate
SELECT 'still runs' AS dropped_group;
\set VERBOSITY default
RESET pg_stride.resource_group;

-- Only superusers manage groups; everybody may read them.
CREATE ROLE stride_user;
SET ROLE stride_user;
SELECT pg_stride.create_group('mine');
SELECT pg_stride.drop_group('reporting');
SELECT count(*) > 0 AS sees_groups FROM pg_stride.groups;
RESET ROLE;
DROP ROLE stride_user;

-- The functions and the groups loader name every function and operator of their SQL
-- with its schema: a schema a database owner controls, put first on the search path
-- (ALTER DATABASE ... SET search_path, which applies to the loader too), cannot stand
-- in for them and run its code as the superuser who manages the groups. Each stand-in
-- would fail the statement that called it.
CREATE ROLE stride_owner;
CREATE SCHEMA stand_ins AUTHORIZATION stride_owner;
SET ROLE stride_owner;
CREATE FUNCTION stand_ins.current_database() RETURNS name LANGUAGE plpgsql
    AS $$BEGIN RAISE 'stand_ins.current_database ran as %', current_user; END$$;
CREATE FUNCTION stand_ins.to_regclass(text) RETURNS regclass LANGUAGE plpgsql
    AS $$BEGIN RAISE 'stand_ins.to_regclass ran as %', current_user; END$$;
CREATE FUNCTION stand_ins.text_equal(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $$BEGIN RAISE 'stand_ins.= ran as %', current_user; END$$;
CREATE OPERATOR stand_ins.= (LEFTARG = text, RIGHTARG = text,
    FUNCTION = stand_ins.text_equal);
CREATE FUNCTION stand_ins.count_step(bigint) RETURNS bigint LANGUAGE plpgsql
    AS $$BEGIN RAISE 'stand_ins.count ran as %', current_user; END$$;
CREATE AGGREGATE stand_ins.count(*) (SFUNC = stand_ins.count_step, STYPE = bigint);
RESET ROLE;
SET search_path = stand_ins, pg_catalog;
-- The stand-ins do take the unqualified names.
\set VERBOSITY terse
SELECT count(*) FROM pg_stride.groups;
SELECT current_database();
SELECT to_regclass('pg_stride.resource_groups');
SELECT name FROM pg_stride.groups WHERE name = 'default';
\set VERBOSITY default
SELECT pg_stride.create_group('searched');
SELECT pg_stride.alter_group('searched', weight => 7);
SELECT name, weight FROM pg_stride.groups WHERE name OPERATOR(pg_catalog.=) 'searched';
SELECT pg_stride.drop_group('searched');
RESET search_path;
SET client_min_messages = warning;
DROP SCHEMA stand_ins CASCADE;
RESET client_min_messages;
DROP ROLE stride_owner;

SELECT pg_stride.drop_group('reporting');
SELECT name FROM pg_stride.groups;

-- Shared memory holds "default" and 63 other groups: a 64th is refused (54000), and
-- once one is dropped there is room again.
SELECT count(*) AS created
  FROM (SELECT pg_stride.create_group('many_' || i) FROM generate_series(1, 63) i) c;
SELECT pg_stride.create_group('one_too_many');
\echo :LAST_ERROR_SQLSTATE
SELECT pg_stride.drop_group('many_63');
SELECT pg_stride.create_group('one_too_many');
SELECT count(*) AS in_effect FROM pg_stride.groups;
SELECT count(*) AS dropped
  FROM (SELECT pg_stride.drop_group(name) FROM pg_stride.resource_groups
         WHERE name NOT IN ('default', 'one_too_many')) d;
-- Dropping the extension drops the table without firing its trigger; its groups go out
-- of effect all the same once the transaction commits (the loader finds no table). A
-- reload of the loader's that the drop interrupts fails; the loader tries again at
-- once for the drop's own request (regress/specs/groups_loader.spec): up to 5 s here.
DROP EXTENSION pg_stride;
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    -- Set and rolled back at once, so that no statement runs in the group (one would
    -- warn when it is gone).
    BEGIN
      PERFORM set_config('pg_stride.resource_group', 'one_too_many', true);
      RAISE 'still in effect';
    EXCEPTION
      WHEN undefined_object THEN RETURN;
      WHEN raise_exception THEN NULL;
    END;
    PERFORM pg_sleep(0.05);
  END LOOP;
END
$$;
SET pg_stride.resource_group = 'one_too_many';
