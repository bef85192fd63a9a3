-- TPC-H Q19: discounted revenue.  QUANTITY1 in [1,10], QUANTITY2 in [10,20],
-- QUANTITY3 in [20,30], three BRANDs.
\set q1 random(1, 10)
\set q2 random(10, 20)
\set q3 random(20, 30)
\set b1 random(1, 5)
\set b2 random(1, 5)
\set b3 random(1, 5)
\set b4 random(1, 5)
\set b5 random(1, 5)
\set b6 random(1, 5)
select sum(l_extendedprice * (1 - l_discount)) as revenue
from @S@.lineitem, @S@.part
where (p_partkey = l_partkey
       and p_brand = 'Brand#' || (:b1 * 10 + :b2)::text
       and p_container in ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
       and l_quantity >= :q1 and l_quantity <= :q1 + 10
       and p_size between 1 and 5
       and l_shipmode in ('AIR', 'AIR REG')
       and l_shipinstruct = 'DELIVER IN PERSON')
   or (p_partkey = l_partkey
       and p_brand = 'Brand#' || (:b3 * 10 + :b4)::text
       and p_container in ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
       and l_quantity >= :q2 and l_quantity <= :q2 + 10
       and p_size between 1 and 10
       and l_shipmode in ('AIR', 'AIR REG')
       and l_shipinstruct = 'DELIVER IN PERSON')
   or (p_partkey = l_partkey
       and p_brand = 'Brand#' || (:b5 * 10 + :b6)::text
       and p_container in ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
       and l_quantity >= :q3 and l_quantity <= :q3 + 10
       and p_size between 1 and 15
       and l_shipmode in ('AIR', 'AIR REG')
       and l_shipinstruct = 'DELIVER IN PERSON');
