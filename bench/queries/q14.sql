-- TPC-H Q14: promotion effect.  DATE = first day of a month in 1993 .. 1997.
\set m random(0, 59)
select 100.00 * sum(case when p_type like 'PROMO%'
                         then l_extendedprice * (1 - l_discount) else 0 end)
       / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
from @S@.lineitem, @S@.part
where l_partkey = p_partkey
  and l_shipdate >= make_date(1993 + :m / 12, 1 + :m % 12, 1)
  and l_shipdate < make_date(1993 + :m / 12, 1 + :m % 12, 1) + interval '1 month';
