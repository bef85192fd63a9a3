-- TPC-H Q17: small-quantity-order revenue.  BRAND, CONTAINER.
\set bm random(1, 5)
\set bn random(1, 5)
\set c1 random(1, 5)
\set c2 random(1, 8)
select sum(l_extendedprice) / 7.0 as avg_yearly
from @S@.lineitem, @S@.part
where p_partkey = l_partkey
  and p_brand = 'Brand#' || (:bm * 10 + :bn)::text
  and p_container = (array['SM','LG','MED','JUMBO','WRAP'])[:c1] || ' '
                 || (array['CASE','BOX','BAG','JAR','PKG','PACK','CAN','DRUM'])[:c2]
  and l_quantity < (select 0.2 * avg(l_quantity) from @S@.lineitem where l_partkey = p_partkey);
