-- pg_stride.enabled = off in postgresql.conf: the library is loaded, its view works,
-- no statement is registered, and plans run as PostgreSQL made them. (PostgreSQL 18
-- prints actual row counts with two decimals: expected/disabled_1.out differs from
-- disabled.out only there.)
CREATE EXTENSION pg_stride;
SHOW pg_stride.enabled;
SELECT running, queued, enabled FROM pg_stride.scheduler;
BEGIN;
DECLARE c CURSOR FOR SELECT 1;
SELECT running FROM pg_stride.scheduler;
COMMIT;

-- Off means pass-through (docs/design.md §4 rule 7): a group that allows no parallel
-- workers, and the pool's parallel mode, change nothing. The Gather is PostgreSQL's,
-- with the workers it was planned with (EXPLAIN ANALYZE shows the plan that ran).
-- Groups live in pg_stride.database's database.
\c postgres
CREATE EXTENSION pg_stride;
SELECT pg_stride.create_group('no_workers', max_parallel_workers => 0);
\i sql/forced_parallel.psql
SET pg_stride.resource_group = 'no_workers';
SET pg_stride.parallel_mode = pool;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF) SELECT count(*) FROM numbers;
SELECT count(*) FROM numbers;
RESET ALL;
DROP TABLE numbers;
