-- TPC-H Q6: forecasting revenue change.  DATE = Jan 1 of 1993 .. 1997,
-- DISCOUNT in [0.02, 0.09], QUANTITY in [24, 25].
\set y random(1993, 1997)
\set d random(2, 9)
\set q random(24, 25)
select sum(l_extendedprice * l_discount) as revenue
from @S@.lineitem
where l_shipdate >= make_date(:y, 1, 1)
  and l_shipdate < make_date(:y + 1, 1, 1)
  and l_discount between :d / 100.0 - 0.01 and :d / 100.0 + 0.01
  and l_quantity < :q;
