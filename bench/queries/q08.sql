-- TPC-H Q8: national market share.  NATION (and its REGION), TYPE.
\set n random(0, 24)
\set a random(1, 6)
\set b random(1, 5)
\set c random(1, 5)
select o_year,
       sum(case when nation = (select n_name from @S@.nation where n_nationkey = :n)
                then volume else 0 end) / sum(volume) as mkt_share
from (
  select extract(year from o_orderdate) as o_year,
         l_extendedprice * (1 - l_discount) as volume,
         n2.n_name as nation
  from @S@.part, @S@.supplier, @S@.lineitem, @S@.orders, @S@.customer,
       @S@.nation n1, @S@.nation n2, @S@.region
  where p_partkey = l_partkey
    and s_suppkey = l_suppkey
    and l_orderkey = o_orderkey
    and o_custkey = c_custkey
    and c_nationkey = n1.n_nationkey
    and n1.n_regionkey = r_regionkey
    and r_regionkey = (array[0,1,1,1,4,0,3,3,2,2,4,4,2,4,0,0,0,1,2,3,4,2,3,3,1])[:n + 1]
    and s_nationkey = n2.n_nationkey
    and o_orderdate between date '1995-01-01' and date '1996-12-31'
    and p_type = (array['STANDARD','SMALL','MEDIUM','LARGE','ECONOMY','PROMO'])[:a] || ' '
              || (array['ANODIZED','BURNISHED','PLATED','POLISHED','BRUSHED'])[:b] || ' '
              || (array['TIN','NICKEL','BRASS','STEEL','COPPER'])[:c]
) as all_nations
group by o_year
order by o_year;
