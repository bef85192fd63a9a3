-- TPC-H Q12: shipping modes and order priority.  Two different SHIPMODEs,
-- DATE = Jan 1 of 1993 .. 1997.
\set m1 random(1, 7)
\set k random(0, 5)
\set m2 (:m1 + :k) % 7 + 1
\set y random(1993, 1997)
select l_shipmode,
       sum(case when o_orderpriority = '1-URGENT' or o_orderpriority = '2-HIGH'
                then 1 else 0 end) as high_line_count,
       sum(case when o_orderpriority <> '1-URGENT' and o_orderpriority <> '2-HIGH'
                then 1 else 0 end) as low_line_count
from @S@.orders, @S@.lineitem
where o_orderkey = l_orderkey
  and l_shipmode in ((array['REG AIR','AIR','RAIL','SHIP','TRUCK','MAIL','FOB'])[:m1],
                     (array['REG AIR','AIR','RAIL','SHIP','TRUCK','MAIL','FOB'])[:m2])
  and l_commitdate < l_receiptdate
  and l_shipdate < l_commitdate
  and l_receiptdate >= make_date(:y, 1, 1)
  and l_receiptdate < make_date(:y + 1, 1, 1)
group by l_shipmode
order by l_shipmode;
