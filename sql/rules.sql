-- Runaway-query rules: a group's rules are given as text, checked, and shown back in a
-- canonical spelling; pg_stride.rule_hits lists the hits (regress/rules.py makes them).
-- A move may name a group that does not exist (yet), with a WARNING: its hits are then
-- only logged.
\c postgres
CREATE EXTENSION pg_stride;
SELECT pg_stride.create_group('watched', rules => 'cpu_time > 30s: cancel; elapsed>5min:log');
SELECT rules, rules_dry_run FROM pg_stride.groups WHERE name = 'watched';
SELECT pg_stride.alter_group('watched', rules => 'rows > 1000000: log; temp_bytes > 1024MB: cancel; cpu_time > 120s: move  batch ', rules_dry_run => true);
SELECT rules, rules_dry_run FROM pg_stride.groups WHERE name = 'watched';
-- Other settings leave the rules alone; empty text removes them.
SELECT pg_stride.alter_group('watched', weight => 200);
SELECT rules FROM pg_stride.groups WHERE name = 'watched';
-- Targets that exist (the group itself and default included) give no WARNING; dropping
-- a target warns of the rules that name it.
SELECT pg_stride.create_group('batch');
SELECT pg_stride.alter_group('watched', rules => 'cpu_time > 2min: move batch; elapsed > 1h: move default; rows > 10: move watched');
SELECT pg_stride.create_group('heavy', rules => 'cpu_time > 2min: move batch; elapsed > 1h: move bacth');
SELECT pg_stride.drop_group('batch');
SELECT pg_stride.drop_group('heavy');
SELECT pg_stride.alter_group('watched', rules => '');
SELECT rules = '' AS no_rules FROM pg_stride.groups WHERE name = 'watched';
-- Errors name the rule and what is wrong with it.
SELECT pg_stride.alter_group('watched', rules => 'cpu_time > 30s');
SELECT pg_stride.alter_group('watched', rules => 'wall_time > 1s: log');
SELECT pg_stride.alter_group('watched', rules => 'rows > 10k: log');
SELECT pg_stride.alter_group('watched', rules => 'elapsed > 1 fortnight: log');
SELECT pg_stride.alter_group('watched', rules => 'elapsed > 1s: kill');
SELECT pg_stride.alter_group('watched', rules => 'elapsed > 1s: move');
SELECT pg_stride.alter_group('watched', rules => 'rows > 1: log; rows > 2: log; rows > 3: log; rows > 4: log; rows > 5: log');
SELECT pg_stride.create_group('other', rules => NULL);
-- Nothing was changed by the errors.
SELECT name, rules FROM pg_stride.groups WHERE name IN ('watched', 'other');
-- The view of the hits.
SELECT count(*) FROM pg_stride.rule_hits;
SELECT pg_stride.drop_group('watched');
DROP EXTENSION pg_stride;
