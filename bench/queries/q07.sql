-- TPC-H Q7: volume shipping.  Two different nations.
\set n1 random(1, 25)
\set k random(1, 24)
\set n2 (:n1 - 1 + :k) % 25 + 1
select supp_nation, cust_nation, l_year, sum(volume) as revenue
from (
  select n1.n_name as supp_nation, n2.n_name as cust_nation,
         extract(year from l_shipdate) as l_year,
         l_extendedprice * (1 - l_discount) as volume
  from @S@.supplier, @S@.lineitem, @S@.orders, @S@.customer, @S@.nation n1, @S@.nation n2
  where s_suppkey = l_suppkey
    and o_orderkey = l_orderkey
    and c_custkey = o_custkey
    and s_nationkey = n1.n_nationkey
    and c_nationkey = n2.n_nationkey
    and ((n1.n_nationkey = :n1 - 1 and n2.n_nationkey = :n2 - 1)
      or (n1.n_nationkey = :n2 - 1 and n2.n_nationkey = :n1 - 1))
    and l_shipdate between date '1995-01-01' and date '1996-12-31'
) as shipping
group by supp_nation, cust_nation, l_year
order by supp_nation, cust_nation, l_year;
