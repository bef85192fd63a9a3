-- pg_stride not in shared_preload_libraries: loading it warns and installs nothing; the
-- extension can be created, and its views say what to do.
LOAD 'pg_stride';
SELECT count(*) AS pg_stride_settings FROM pg_settings WHERE name LIKE 'pg\_stride.%';
CREATE EXTENSION pg_stride;
SELECT pg_stride.version() IS NOT NULL AS has_version;
SELECT * FROM pg_stride.scheduler;
SELECT * FROM pg_stride.pool;
SELECT * FROM pg_stride.pool_fallbacks;
SELECT * FROM pg_stride.pool_counters();
DROP EXTENSION pg_stride;
