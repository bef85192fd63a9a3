-- pg_stat_statements is preloaded before pg_stride, so pg_stride's executor and planner
-- hooks wrap its hooks. It must still see every statement: pg_stride chains to it.
CREATE EXTENSION pg_stat_statements;
SELECT pg_stat_statements_reset() IS NOT NULL AS reset;
SELECT count(*) FROM generate_series(1, 1000);
SELECT count(*) FROM generate_series(1, 1000);
SELECT calls, rows
  FROM pg_stat_statements WHERE query = 'SELECT count(*) FROM generate_series($1, $2)';
-- Planning goes through the chained planner hook too.
SET pg_stat_statements.track_planning = on;
SELECT pg_stat_statements_reset() IS NOT NULL AS reset;
SELECT count(*) FROM generate_series(1, 10);
SELECT calls, plans FROM pg_stat_statements
 WHERE query = 'SELECT count(*) FROM generate_series($1, $2)';
DROP EXTENSION pg_stat_statements;
