-- TPC-H Q3: shipping priority.  SEGMENT, DATE in [1995-03-01, 1995-03-31].
\set seg random(1, 5)
\set day random(1, 31)
select l_orderkey,
       sum(l_extendedprice * (1 - l_discount)) as revenue,
       o_orderdate, o_shippriority
from @S@.customer, @S@.orders, @S@.lineitem
where c_mktsegment = (array['AUTOMOBILE','BUILDING','FURNITURE','MACHINERY','HOUSEHOLD'])[:seg]
  and c_custkey = o_custkey
  and l_orderkey = o_orderkey
  and o_orderdate < make_date(1995, 3, :day)
  and l_shipdate > make_date(1995, 3, :day)
group by l_orderkey, o_orderdate, o_shippriority
order by revenue desc, o_orderdate
limit 10;
