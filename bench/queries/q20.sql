-- TPC-H Q20: potential part promotion.  COLOR, DATE = Jan 1 of 1993 .. 1997, NATION.
\set c random(1, 92)
\set y random(1993, 1997)
\set n random(0, 24)
select s_name, s_address
from @S@.supplier, @S@.nation
where s_suppkey in (
        select ps_suppkey from @S@.partsupp
        where ps_partkey in (select p_partkey from @S@.part
                             where p_name like (@COLORS@)[:c] || '%')
          and ps_availqty > (
                select 0.5 * sum(l_quantity) from @S@.lineitem
                where l_partkey = ps_partkey
                  and l_suppkey = ps_suppkey
                  and l_shipdate >= make_date(:y, 1, 1)
                  and l_shipdate < make_date(:y + 1, 1, 1)))
  and s_nationkey = n_nationkey
  and n_nationkey = :n
order by s_name;
