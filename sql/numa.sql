-- The view pg_stride.numa: one row per NUMA node of the server's CPUs and one (node
-- NULL) for what is on no node. Its figures are compared with the kernel's own files
-- and with PostgreSQL's settings, not with numbers of this machine, so the test passes
-- wherever the server may use every CPU (nodes as /sys/devices/system/node lists them,
-- or one node when the kernel has no NUMA support).
SHOW pg_stride.numa;
SHOW pg_stride.numa_topology;
-- The modes, the stealing delay's range and the topology spec are checked.
ALTER SYSTEM SET pg_stride.numa = interleave;
ALTER SYSTEM SET pg_stride.numa_steal_after = -2;
SHOW pg_stride.numa_steal_after;
ALTER SYSTEM SET pg_stride.numa_topology = '0|0';
ALTER SYSTEM SET pg_stride.numa_topology = '0-1|x';

-- One row per node online, each with the CPUs the kernel lists for it.
WITH online AS (
    SELECT sum(CASE WHEN r LIKE '%-%'
                    THEN split_part(r, '-', 2)::int - split_part(r, '-', 1)::int + 1
                    ELSE 1 END) AS nodes
      FROM regexp_split_to_table(
             btrim(coalesce(pg_read_file('/sys/devices/system/node/online', 0, 4096, true), '0'),
                   E' \n'), ',') r)
SELECT (SELECT count(*) FROM pg_stride.numa WHERE node IS NOT NULL) = nodes AS a_row_per_node,
       (SELECT count(*) FROM pg_stride.numa WHERE node IS NULL) AS rows_of_no_node
  FROM online;
SELECT bool_and(cpus = btrim(coalesce(
                  pg_read_file(format('/sys/devices/system/node/node%s/cpulist', node), 0, 4096, true),
                  pg_read_file('/sys/devices/system/cpu/online')), E' \n')) AS cpus_as_the_kernel_lists,
       sum(cpu_count) >= 1 AS has_cpus,
       bool_and(cpu_count = (SELECT count(*) FROM regexp_split_to_table(cpus, ',') r,
                                  generate_series(split_part(r, '-', 1)::int,
                                                  coalesce(nullif(split_part(r, '-', 2), ''),
                                                           split_part(r, '-', 1))::int) c))
           AS cpu_count_counts_cpus,
       bool_and(memory_free_kb BETWEEN 0 AND memory_total_kb) AS free_within_total
  FROM pg_stride.numa WHERE node IS NOT NULL;

-- The main shared-memory segment, node by node plus not resident, is the size
-- PostgreSQL computed for it (shared_memory_size, rounded up to MB; huge pages round
-- the mapping up to 2 MB more at most).
SELECT sum(shared_memory_bytes) > (s.setting::bigint - 1) * 1024 * 1024
       AND sum(shared_memory_bytes) <= (s.setting::bigint + 2) * 1024 * 1024 AS segment_adds_up,
       bool_and(shared_memory_bytes >= 0) AS no_negative_bytes
  FROM pg_stride.numa, pg_settings s
 WHERE s.name = 'shared_memory_size'
 GROUP BY s.setting;

-- CPU charged to queries is counted per node: after a reset and a scan, the nodes'
-- CPU time is the groups' CPU time.
SELECT pg_stride.reset_stats();
SELECT sum(cpu_time_ms) AS cpu_ms_after_reset FROM pg_stride.numa;
SET max_parallel_workers_per_gather = 0;
SELECT count(*) FROM generate_series(1, 2000000);
RESET max_parallel_workers_per_gather;
SELECT n.ms > 0 AS charged,
       abs(n.ms - g.ms) <= 0.05 * g.ms AS nodes_match_groups
  FROM (SELECT sum(cpu_time_ms) AS ms FROM pg_stride.numa) n,
       (SELECT sum(cpu_time_ms) AS ms FROM pg_stride.groups) g;

-- Anyone may read the view.
CREATE ROLE stride_numa_reader;
SET ROLE stride_numa_reader;
SELECT count(*) >= 2 AS readable FROM pg_stride.numa;
RESET ROLE;
DROP ROLE stride_numa_reader;
