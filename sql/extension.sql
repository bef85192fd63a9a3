-- CREATE EXTENSION builds schema pg_stride with its functions and views, and
-- DROP EXTENSION removes all of it.
CREATE EXTENSION pg_stride;
-- The script turns allow_system_table_mods on only to create the pg_-prefixed schema.
SHOW allow_system_table_mods;

SELECT extversion = pg_stride.version() AS version_matches_library
  FROM pg_extension WHERE extname = 'pg_stride';

-- Every object the extension owns, by kind and name.
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_stride')
   AND deptype = 'e'
   -- From PostgreSQL 18 on, the row types of the extension's tables and views (and their
   -- array types) are members as well; they come and go with their relation.
   AND NOT EXISTS (SELECT FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem
                    WHERE classid = 'pg_type'::regclass AND t.oid = objid
                      AND (t.typrelid <> 0 OR e.typrelid <> 0))
 ORDER BY 1;

-- The views' columns and types.
SELECT attrelid::regclass AS view, attname, format_type(atttypid, atttypmod)
  FROM pg_attribute
 WHERE attrelid IN ('pg_stride.scheduler'::regclass, 'pg_stride.groups'::regclass,
                    'pg_stride.activity'::regclass, 'pg_stride.tuner'::regclass,
                    'pg_stride.numa'::regclass, 'pg_stride.trace'::regclass,
                    'pg_stride.statements'::regclass,
                    'pg_stride.prediction_quality'::regclass)
   AND attnum > 0
 ORDER BY attrelid::regclass::text, attnum;

-- Anyone may read the views.
CREATE ROLE stride_reader LOGIN;
SET ROLE stride_reader;
SELECT cpu_slots > 0 AS has_slots FROM pg_stride.scheduler;
-- With the tuner off (the default) no refresh has run.
SELECT count(*) AS refreshes FROM pg_stride.tuner;
-- With pg_stride.trace off (the default) nothing is traced.
SELECT count(*) AS traced FROM pg_stride.trace;
-- The catalog queries above that reached CPU scheduling have histories, and each of
-- their executions was judged (a fingerprint's first one as unpredicted or by its cost).
SELECT fingerprints > 0 AS learnt,
       short_predicted_short + short_predicted_long + long_predicted_short
         + long_predicted_long + unpredicted >= fingerprints AS each_judged
  FROM pg_stride.prediction_quality;
-- All but pg_stride.statements, which shows every role's query identifiers: that one is
-- for members of pg_read_all_stats.
SELECT count(*) FROM pg_stride.statements;
RESET ROLE;
GRANT pg_read_all_stats TO stride_reader;
SET ROLE stride_reader;
SELECT count(*) > 0 AS readable FROM pg_stride.statements;
RESET ROLE;
DROP ROLE stride_reader;

DROP EXTENSION pg_stride;
SELECT count(*) AS leftover_schemas FROM pg_namespace WHERE nspname = 'pg_stride';
SELECT count(*) AS leftover_functions
  FROM pg_proc WHERE proname IN ('version', 'scheduler_state')
   AND pronamespace NOT IN ('pg_catalog'::regnamespace);

-- It can be created again, and the remaining tests use it.
CREATE EXTENSION pg_stride;
