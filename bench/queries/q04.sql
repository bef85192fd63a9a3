-- TPC-H Q4: order priority checking.  DATE = first day of a month in 1993-01 .. 1997-10.
\set m random(0, 57)
select o_orderpriority, count(*) as order_count
from @S@.orders
where o_orderdate >= make_date(1993 + :m / 12, 1 + :m % 12, 1)
  and o_orderdate < make_date(1993 + :m / 12, 1 + :m % 12, 1) + interval '3 month'
  and exists (select * from @S@.lineitem
              where l_orderkey = o_orderkey and l_commitdate < l_receiptdate)
group by o_orderpriority
order by o_orderpriority;
