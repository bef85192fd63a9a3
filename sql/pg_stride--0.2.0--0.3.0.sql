-- pg_stride 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_stride UPDATE).
--
-- The statement histories that predict a statement's CPU are kept per database, role
-- and query identifier, as pg_stat_statements keeps its entries: pg_stride.statements
-- gains the role (userid), one row per role and query identifier, to join with
-- pg_stat_statements on userid and queryid. regress/upgrade.py checks that an updated
-- 0.2.0 has the objects of a fresh 0.3.0 install.
\echo Use "ALTER EXTENSION pg_stride UPDATE" to load this file. \quit

DROP VIEW pg_stride.statements;
DROP FUNCTION pg_stride.statements_state();

CREATE FUNCTION pg_stride."statements_state"() RETURNS TABLE (
	"userid" oid,
	"queryid" bigint,
	"calls" bigint,
	"mean_cpu_ms" double precision,
	"stddev_cpu_ms" double precision,
	"p95_cpu_ms" double precision,
	"max_cpu_ms" double precision,
	"class" TEXT,
	"last_seen_us" bigint
)
STRICT PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'statements_state_wrapper';

CREATE VIEW pg_stride.statements AS
    SELECT s.userid, s.queryid, s.calls, s.mean_cpu_ms, s.stddev_cpu_ms, s.p95_cpu_ms, s.max_cpu_ms,
           s.class,
           timestamptz '2000-01-01 00:00:00+00' + s.last_seen_us * interval '1 microsecond' AS last_seen
      FROM pg_stride.statements_state() s;
COMMENT ON VIEW pg_stride.statements IS
    'pg_stride: per role and query identifier in this database, the CPU of its executions that reached CPU scheduling (decayed over the last ~32); mean_cpu_ms is the prediction a next execution of that role starts from, class its class under pg_stride.decay_start; join pg_stat_statements on userid and queryid';
REVOKE ALL ON FUNCTION pg_stride.statements_state() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_stride.statements_state() TO pg_read_all_stats;
GRANT SELECT ON pg_stride.statements TO pg_read_all_stats;
