-- Parallel workers granted by pg_stride: each Gather gets no more than the concurrency
-- hint and its group's max_parallel_workers allow, on a copy of the plan, so that a
-- cached plan keeps the worker count it was planned with. (PostgreSQL 18 prints actual
-- row counts with two decimals: expected/parallel_1.out differs from parallel.out only
-- there.)

\c postgres
CREATE EXTENSION pg_stride;
SELECT pg_stride.create_group('narrow', max_parallel_workers => 1);
\i sql/forced_parallel.psql

-- The planner asks for two workers.
EXPLAIN (COSTS OFF) SELECT count(*) FROM numbers;

-- Run in group "narrow", the Gather gets one (EXPLAIN ANALYZE shows the plan that ran).
SET pg_stride.resource_group = 'narrow';
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT count(*) FROM numbers;
SELECT count(*) FROM numbers;

-- A prepared statement's cached plan keeps its two workers, however often it runs
-- with fewer: EXPLAIN without ANALYZE shows the cached plan itself.
PREPARE total AS SELECT count(*) FROM numbers;
EXECUTE total;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) EXECUTE total;
EXECUTE total;
EXPLAIN (COSTS OFF) EXECUTE total;

-- The view shows what the running statement planned and was granted; the subquery is
-- a parallel initplan of the statement that reads the view.
SELECT workers_planned, workers_granted, (SELECT count(*) FROM numbers) AS n
  FROM pg_stride.activity WHERE pid = pg_backend_pid();

-- Each statement above got its worker because the one before gave its grant back.
-- A group allowed no workers runs its plans serially.
SELECT pg_stride.alter_group('narrow', max_parallel_workers => 0);
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT count(*) FROM numbers;
SELECT count(*) FROM numbers;

-- parallel_mode = off leaves the counts to PostgreSQL; only superusers may set it.
SET pg_stride.parallel_mode = off;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT count(*) FROM numbers;
-- pool is a value (its Gathers are in regress/pool.py); an unknown one lists them.
SET pg_stride.parallel_mode = pool;
SHOW pg_stride.parallel_mode;
SET pg_stride.parallel_mode = bogus;
SET pg_stride.parallel_mode = off;
CREATE ROLE stride_user;
SET ROLE stride_user;
SET pg_stride.parallel_mode = native;
RESET ROLE;
DROP ROLE stride_user;
RESET pg_stride.parallel_mode;
SELECT parallel_mode, hint > 0 AS has_hint FROM pg_stride.scheduler;


RESET pg_stride.resource_group;
DEALLOCATE total;

-- A session whose group was dropped runs in "default" (with a WARNING), and so do its
-- parallel workers, which restore the session's setting naming the dropped group.
SELECT current_user AS superuser \gset
SELECT pg_stride.create_group('vanishing');
CREATE ROLE stride_vanishing LOGIN;
GRANT SELECT ON numbers TO stride_vanishing;
ALTER ROLE stride_vanishing SET pg_stride.resource_group = 'vanishing';
SELECT pg_stride.drop_group('vanishing');
\c - stride_vanishing
SHOW pg_stride.resource_group;
-- (force_parallel_mode is called debug_parallel_query from PostgreSQL 16 on.)
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
                       THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END,
                  'on', false) AS forced;
SELECT count(*) FROM numbers;
\c - :superuser
DROP OWNED BY stride_vanishing;
DROP ROLE stride_vanishing;
DROP TABLE numbers;
DROP EXTENSION pg_stride;
