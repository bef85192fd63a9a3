-- pg_stride's settings: defaults, units, ranges, and who may change them.
SELECT name, setting, unit, context, vartype, min_val, max_val
  FROM pg_settings WHERE name LIKE 'pg\_stride.%' AND name <> 'pg_stride.cpu_slots'
 ORDER BY name;
-- cpu_slots defaults to 0, "the CPUs this server may use"; the value in effect is in
-- the scheduler view (its number depends on the machine).
SELECT boot_val, context, min_val, max_val FROM pg_settings WHERE name = 'pg_stride.cpu_slots';

-- Units are accepted as for PostgreSQL's own time settings.
SET pg_stride.slice = '500us';
SHOW pg_stride.slice;
SET pg_stride.slice = '0.25s';
SHOW pg_stride.slice;
RESET pg_stride.slice;

-- Out-of-range and malformed values are refused and change nothing. (PostgreSQL 18
-- prints the range with its unit: expected/gucs_1.out differs from gucs.out only there.)
SET pg_stride.slice = '2s';
SET pg_stride.slice = 0;
SET pg_stride.enabled = maybe;
SHOW pg_stride.slice;
SHOW pg_stride.enabled;

-- Server-wide settings cannot be changed in a session.
SET pg_stride.cpu_slots = 4;
SET pg_stride.max_active_queries = 10;

-- Group and the scheduling switches are for superusers, or come from ALTER ROLE/DATABASE.
CREATE ROLE stride_user LOGIN;
SET ROLE stride_user;
SET pg_stride.resource_group = 'reporting';
SELECT set_config('pg_stride.resource_group', 'reporting', false);
SET pg_stride.enabled = off;
SET pg_stride.slice = '10ms';
SHOW pg_stride.resource_group;
RESET ROLE;
-- A role may be assigned a group that does not exist yet, with a NOTICE: a dump
-- restores roles before the database that defines their groups (docs/design.md §4 rule 10).
-- A session that uses it runs in "default" with a WARNING (groups.sql). A SET in a
-- session is checked.
ALTER ROLE stride_user SET pg_stride.resource_group = 'reporting';
SET pg_stride.resource_group = 'reporting';
-- Both with SQLSTATE undefined_object (docs/errors.md).
\set VERBOSITY sqlstate
ALTER ROLE stride_user SET pg_stride.resource_group = 'reporting';
SET pg_stride.resource_group = 'reporting';
\set VERBOSITY default
ALTER ROLE stride_user SET pg_stride.resource_group = 'default';
SELECT unnest(setconfig) AS role_setting
  FROM pg_db_role_setting WHERE setrole = 'stride_user'::regrole;
-- A superuser may set it in a session.
SET pg_stride.resource_group = 'default';
SELECT current_setting('pg_stride.resource_group');
RESET pg_stride.resource_group;
DROP ROLE stride_user;

-- The pg_stride prefix is reserved: a misspelt setting is an error, not a placeholder.
SET pg_stride.cpu_slot = 4;
SET pg_stride.resource_groups = 'reporting';
