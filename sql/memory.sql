-- Memory-aware admission: a statement reserves the working memory its plan may keep
-- (work_mem per sort and tuple store, times hash_mem_multiplier per hash table, in
-- each process that runs the node) from the budgets it is under, while it runs.
-- Groups live in the database named by pg_stride.database.
\c postgres
CREATE EXTENSION pg_stride;
CREATE TABLE mem_t AS SELECT g AS a, g % 100 AS b FROM generate_series(1, 100000) g;
ANALYZE mem_t;
CREATE ROLE stride_mem;
GRANT SELECT ON mem_t TO stride_mem;
SELECT pg_stride.create_group('mem', memory_budget => 1048576);
SELECT memory_budget, reject_oversized FROM pg_stride.groups WHERE name = 'mem';
-- Out of range.
SELECT pg_stride.alter_group('mem', memory_budget => -1);
SET pg_stride.resource_group = 'mem';
SET work_mem = '1MB';
SET hash_mem_multiplier = 2;
SET max_parallel_workers_per_gather = 0;
-- A superuser's statements are not admitted (pg_stride.exempt_superuser): an ordinary
-- role's are.
SET ROLE stride_mem;
-- Each statement reads its own reservation. That read is a Function Scan, whose rows go
-- to a tuple store: work_mem (1024 kB) of each figure below is its own.
\set own '(SELECT memory_kb FROM pg_stride.activity_state() WHERE pid = pg_backend_pid())'
-- A plain aggregate keeps nothing: 0.
EXPLAIN (COSTS OFF) SELECT count(*) FROM mem_t;
SELECT :own AS kb, count(*) FROM mem_t;
-- A sort: work_mem.
EXPLAIN (COSTS OFF) SELECT count(*) FROM (SELECT a FROM mem_t ORDER BY a OFFSET 0) s;
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a OFFSET 0) s;
-- A hash join's hash table: work_mem × hash_mem_multiplier.
EXPLAIN (COSTS OFF) SELECT count(*) FROM mem_t x JOIN mem_t y USING (a);
SELECT :own AS kb, count(*) FROM mem_t x JOIN mem_t y USING (a);
-- Hashed aggregation: work_mem × hash_mem_multiplier.
SET enable_sort = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM (SELECT b FROM mem_t GROUP BY b) s;
SELECT :own AS kb, count(*) FROM (SELECT b FROM mem_t GROUP BY b) s;
RESET enable_sort;
-- Aggregates that sort their input inside the Agg, which the plan shows no Sort for:
-- work_mem each, ordered-set ones (WITHIN GROUP) here.
EXPLAIN (COSTS OFF) SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY a), percentile_disc(0.5) WITHIN GROUP (ORDER BY b) FROM mem_t;
SELECT :own AS kb, percentile_disc(0.5) WITHIN GROUP (ORDER BY a), percentile_disc(0.5) WITHIN GROUP (ORDER BY b) FROM mem_t;
-- A bitmap scan's TID bitmap: work_mem; under a BitmapOr, one per index scan.
RESET ROLE;
CREATE INDEX mem_t_a ON mem_t (a);
CREATE INDEX mem_t_b ON mem_t (b);
SET ROLE stride_mem;
SET enable_indexscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM mem_t WHERE b = 7;
SELECT :own AS kb, count(*) FROM mem_t WHERE b = 7;
EXPLAIN (COSTS OFF) SELECT count(*) FROM mem_t WHERE a = 7 OR b = 9;
SELECT :own AS kb, count(*) FROM mem_t WHERE a = 7 OR b = 9;
RESET enable_indexscan;
-- (The sorts by a below stay sorts.)
RESET ROLE;
DROP INDEX mem_t_a;
SET ROLE stride_mem;
-- Grouping sets sorted in two phases: the Sort below the Agg, and the Agg's own sort
-- for its second phase.
SET enable_hashagg = off;
EXPLAIN (COSTS OFF) SELECT a % 3, b % 5, count(*) FROM mem_t GROUP BY GROUPING SETS ((a % 3), (b % 5));
SELECT :own AS kb, count(*) FROM (SELECT a % 3, b % 5, count(*) FROM mem_t GROUP BY GROUPING SETS ((a % 3), (b % 5))) s;
RESET enable_hashagg;
-- A hashed subquery (NOT IN over a small one; EXPLAIN shows "hashed SubPlan"): its
-- hash table, work_mem × hash_mem_multiplier.
SELECT :own AS kb, count(*) FROM mem_t WHERE a NOT IN (SELECT b FROM mem_t WHERE a <= 1000);
-- A recursive UNION: its working and intermediate tables (work_mem each) and the rows
-- seen (a hash table), and the CTE Scan over it (work_mem); UNION ALL keeps no hash.
SELECT :own AS kb, count(*) FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION SELECT n + 1 FROM r WHERE n < 100) SELECT n FROM r) s;
SELECT :own AS kb, count(*) FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 100) SELECT n FROM r) s;
-- Each function of a Function Scan: work_mem.
SELECT :own AS kb, count(*) FROM ROWS FROM (generate_series(1, 10), generate_series(1, 5));
-- Below a Gather, once in the leader and once in each planned worker.
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
EXPLAIN (COSTS OFF) SELECT count(*) FROM (SELECT a FROM mem_t ORDER BY a) s;
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a) s;
-- A SubPlan that a node below the Gather calls runs there too: the Parallel Seq Scan's
-- filter calls one whose plan is a Materialize over a Limit, a Sort and a Function Scan
-- (work_mem each), once in the leader and once in each planned worker: 9 × 1024 kB,
-- and the read of its own reservation.
-- (Not EXPLAINed: PostgreSQL 17 shows SubPlans otherwise.)
SELECT :own AS kb, count(*) FROM mem_t m WHERE m.a < ANY (SELECT g FROM generate_series(1, 20) g ORDER BY g LIMIT 5) OR m.b < 0;
-- The same with the plan made for the pool: its Stride Gather Merge counts what is below
-- it once.
RESET ROLE;
SET pg_stride.parallel_mode = pool;
SET ROLE stride_mem;
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a) s;
RESET ROLE;
RESET pg_stride.parallel_mode;
SET ROLE stride_mem;
RESET max_parallel_workers_per_gather;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
-- Given back when the statement ends (read by the superuser, who reserves nothing).
RESET ROLE;
SELECT memory_reserved_kb, memory_waiting_kb FROM pg_stride.groups WHERE name = 'mem';
-- Larger than the group's whole budget: runs alone, by default.
SELECT pg_stride.alter_group('mem', memory_budget => 1000);
SET ROLE stride_mem;
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a OFFSET 0) s;
-- Or fails at once, if the group says so (SQLSTATE 53200).
RESET ROLE;
SELECT pg_stride.alter_group('mem', reject_oversized => true);
SELECT memory_budget, reject_oversized FROM pg_stride.groups WHERE name = 'mem';
SET ROLE stride_mem;
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a OFFSET 0) s;
\set VERBOSITY sqlstate
SELECT :own AS kb, count(*) FROM (SELECT a FROM mem_t ORDER BY a OFFSET 0) s;
\set VERBOSITY default
-- A statement that needs no memory is not affected.
SELECT count(*) FROM mem_t;
RESET ROLE;
SELECT rejected_total, memory_reserved_kb FROM pg_stride.groups WHERE name = 'mem';
RESET pg_stride.resource_group;
SELECT pg_stride.drop_group('mem');
DROP TABLE mem_t;
DROP ROLE stride_mem;
DROP EXTENSION pg_stride;
