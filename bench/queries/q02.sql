-- TPC-H Q2: minimum cost supplier.  SIZE in [1, 50], TYPE syllable 3, REGION.
\set size random(1, 50)
\set t random(1, 5)
\set r random(1, 5)
select s_acctbal, s_name, n_name, p_partkey, p_mfgr, s_address, s_phone, s_comment
from @S@.part, @S@.supplier, @S@.partsupp, @S@.nation, @S@.region
where p_partkey = ps_partkey
  and s_suppkey = ps_suppkey
  and p_size = :size
  and p_type like '%' || (array['TIN','NICKEL','BRASS','STEEL','COPPER'])[:t]
  and s_nationkey = n_nationkey
  and n_regionkey = r_regionkey
  and r_name = (array['AFRICA','AMERICA','ASIA','EUROPE','MIDDLE EAST'])[:r]
  and ps_supplycost = (
        select min(ps_supplycost)
        from @S@.partsupp, @S@.supplier, @S@.nation, @S@.region
        where p_partkey = ps_partkey
          and s_suppkey = ps_suppkey
          and s_nationkey = n_nationkey
          and n_regionkey = r_regionkey
          and r_name = (array['AFRICA','AMERICA','ASIA','EUROPE','MIDDLE EAST'])[:r])
order by s_acctbal desc, n_name, s_name, p_partkey
limit 100;
