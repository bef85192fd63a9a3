-- TPC-H Q5: local supplier volume.  REGION, DATE = Jan 1 of 1993 .. 1997.
\set r random(1, 5)
\set y random(1993, 1997)
select n_name, sum(l_extendedprice * (1 - l_discount)) as revenue
from @S@.customer, @S@.orders, @S@.lineitem, @S@.supplier, @S@.nation, @S@.region
where c_custkey = o_custkey
  and l_orderkey = o_orderkey
  and l_suppkey = s_suppkey
  and c_nationkey = s_nationkey
  and s_nationkey = n_nationkey
  and n_regionkey = r_regionkey
  and r_name = (array['AFRICA','AMERICA','ASIA','EUROPE','MIDDLE EAST'])[:r]
  and o_orderdate >= make_date(:y, 1, 1)
  and o_orderdate < make_date(:y + 1, 1, 1)
group by n_name
order by revenue desc;
