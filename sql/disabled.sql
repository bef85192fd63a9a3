-- pg_stride.enabled = off in postgresql.conf: the library is loaded, its view works,
-- and no statement is registered.
CREATE EXTENSION pg_stride;
SHOW pg_stride.enabled;
SELECT running, queued, enabled FROM pg_stride.scheduler;
BEGIN;
DECLARE c CURSOR FOR SELECT 1;
SELECT running FROM pg_stride.scheduler;
COMMIT;
