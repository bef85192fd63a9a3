-- TPC-H Q16: parts/supplier relationship.  BRAND, TYPE (syllables 1-2), 8 different SIZEs.
\set bm random(1, 5)
\set bn random(1, 5)
\set a random(1, 6)
\set b random(1, 5)
\set s random(0, 49)
select p_brand, p_type, p_size, count(distinct ps_suppkey) as supplier_cnt
from @S@.partsupp, @S@.part
where p_partkey = ps_partkey
  and p_brand <> 'Brand#' || (:bm * 10 + :bn)::text
  and p_type not like (array['STANDARD','SMALL','MEDIUM','LARGE','ECONOMY','PROMO'])[:a] || ' '
                   || (array['ANODIZED','BURNISHED','PLATED','POLISHED','BRUSHED'])[:b] || '%'
  and p_size in ((:s + 0) % 50 + 1, (:s + 6) % 50 + 1, (:s + 12) % 50 + 1, (:s + 18) % 50 + 1,
                 (:s + 24) % 50 + 1, (:s + 30) % 50 + 1, (:s + 36) % 50 + 1, (:s + 42) % 50 + 1)
  and ps_suppkey not in (select s_suppkey from @S@.supplier
                         where s_comment like '%Customer%Complaints%')
group by p_brand, p_type, p_size
order by supplier_cnt desc, p_brand, p_type, p_size;
