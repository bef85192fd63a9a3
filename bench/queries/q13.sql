-- TPC-H Q13: customer distribution.  WORD1, WORD2.
\set w1 random(1, 4)
\set w2 random(1, 4)
select c_count, count(*) as custdist
from (
  select c_custkey, count(o_orderkey) as c_count
  from @S@.customer left outer join @S@.orders
       on c_custkey = o_custkey
      and o_comment not like '%' || (array['special','pending','unusual','express'])[:w1]
                          || '%' || (array['packages','requests','accounts','deposits'])[:w2] || '%'
  group by c_custkey
) as c_orders
group by c_count
order by custdist desc, c_count desc;
