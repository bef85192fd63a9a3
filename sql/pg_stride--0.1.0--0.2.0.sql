-- pg_stride 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_stride UPDATE).
--
-- 0.2.0 changes the library only (see CHANGELOG.md): its SQL objects are those of
-- 0.1.0, so there is nothing to change here. regress/upgrade.py checks that an updated
-- 0.1.0 has the objects of a fresh 0.2.0 install.
\echo Use "ALTER EXTENSION pg_stride UPDATE" to load this file. \quit
