-- TPC-H Q15: top supplier.  DATE = first day of a month in 1993-01 .. 1997-10.
-- The view revenue0 of the specification is a common table expression here.
\set m random(0, 57)
with revenue0 as (
  select l_suppkey as supplier_no,
         sum(l_extendedprice * (1 - l_discount)) as total_revenue
  from @S@.lineitem
  where l_shipdate >= make_date(1993 + :m / 12, 1 + :m % 12, 1)
    and l_shipdate < make_date(1993 + :m / 12, 1 + :m % 12, 1) + interval '3 month'
  group by l_suppkey)
select s_suppkey, s_name, s_address, s_phone, total_revenue
from @S@.supplier, revenue0
where s_suppkey = supplier_no
  and total_revenue = (select max(total_revenue) from revenue0)
order by s_suppkey;
