-- TPC-H Q11: important stock identification.  NATION, FRACTION = 0.0001 / SF.
\set n random(0, 24)
select ps_partkey, sum(ps_supplycost * ps_availqty) as value
from @S@.partsupp, @S@.supplier, @S@.nation
where ps_suppkey = s_suppkey
  and s_nationkey = n_nationkey
  and n_nationkey = :n
group by ps_partkey
having sum(ps_supplycost * ps_availqty) > (
    select sum(ps_supplycost * ps_availqty) * (0.0001 / @SF@)
    from @S@.partsupp, @S@.supplier, @S@.nation
    where ps_suppkey = s_suppkey
      and s_nationkey = n_nationkey
      and n_nationkey = :n)
order by value desc;
