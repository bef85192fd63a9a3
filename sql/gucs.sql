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

-- Out-of-range and malformed values are refused and change nothing.
SET pg_stride.slice = '2s';
SET pg_stride.slice = 0;
SET pg_stride.enabled = maybe;
SHOW pg_stride.slice;
SHOW pg_stride.enabled;

-- Server-wide settings cannot be changed in a session.
SET pg_stride.cpu_slots = 4;
SET pg_stride.max_active_queries = 10;

-- Group and the scheduling switches are for superusers, or come from ALTER ROLE/DATABASE.
-- GROUP is a reserved word in SQL, so SET and ALTER ROLE name the setting with quotes.
CREATE ROLE stride_user LOGIN;
SET ROLE stride_user;
SET pg_stride."group" = 'reporting';
SELECT set_config('pg_stride.group', 'reporting', false);
SET pg_stride.enabled = off;
SET pg_stride.slice = '10ms';
SHOW pg_stride."group";
RESET ROLE;
-- A role can only be assigned a group that exists (see groups.sql for creating one).
ALTER ROLE stride_user SET pg_stride."group" = 'reporting';
ALTER ROLE stride_user SET pg_stride."group" = 'default';
SELECT unnest(setconfig) AS role_setting
  FROM pg_db_role_setting WHERE setrole = 'stride_user'::regrole;
-- A superuser may set it in a session.
SET pg_stride."group" = 'default';
SELECT current_setting('pg_stride.group');
RESET pg_stride."group";
DROP ROLE stride_user;
