-- TPC-H Q10: returned item reporting.  DATE = first day of a month in 1993-02 .. 1995-01.
\set m random(1, 24)
select c_custkey, c_name,
       sum(l_extendedprice * (1 - l_discount)) as revenue,
       c_acctbal, n_name, c_address, c_phone, c_comment
from @S@.customer, @S@.orders, @S@.lineitem, @S@.nation
where c_custkey = o_custkey
  and l_orderkey = o_orderkey
  and o_orderdate >= make_date(1993 + :m / 12, 1 + :m % 12, 1)
  and o_orderdate < make_date(1993 + :m / 12, 1 + :m % 12, 1) + interval '3 month'
  and l_returnflag = 'R'
  and c_nationkey = n_nationkey
group by c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
order by revenue desc
limit 20;
