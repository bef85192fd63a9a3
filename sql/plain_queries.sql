-- Plain queries give the same results whether pg_stride is preloaded and enabled,
-- preloaded and disabled, or not preloaded: this file runs in all three servers
-- against one expected output.
CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, price numeric NOT NULL);
INSERT INTO items SELECT g, g % 7, (g * 37 % 101)::numeric / 4 FROM generate_series(1, 5000) g;
ANALYZE items;

SELECT grp, count(*), sum(price), min(id), max(id) FROM items GROUP BY grp ORDER BY grp;

SELECT a.grp, count(*) AS pairs
  FROM items a JOIN items b ON a.id = b.id + 7 AND a.grp = b.grp
 GROUP BY a.grp ORDER BY a.grp;

WITH ranked AS (
  SELECT id, grp, price, rank() OVER (PARTITION BY grp ORDER BY price DESC, id) AS r
    FROM items
)
SELECT grp, id, price FROM ranked WHERE r = 1 ORDER BY grp;

-- Writes, a data-modifying CTE, and a prepared statement.
UPDATE items SET price = price + 1 WHERE id <= 10;
WITH moved AS (DELETE FROM items WHERE id > 4990 RETURNING id)
SELECT count(*) AS deleted FROM moved;
PREPARE by_group(int) AS SELECT count(*) FROM items WHERE grp = $1;
EXECUTE by_group(3);
EXECUTE by_group(3);
DEALLOCATE by_group;

-- A cursor fetched in pieces.
BEGIN;
DECLARE c CURSOR FOR SELECT id FROM items WHERE grp = 0 ORDER BY id;
FETCH 3 FROM c;
FETCH 2 FROM c;
CLOSE c;
COMMIT;

-- A parallel plan gives the same answer.
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT count(*), sum(price) FROM items;
RESET ALL;

DROP TABLE items;
