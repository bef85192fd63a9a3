-- TPC-H Q18: large volume customer.  QUANTITY in [312, 315].
\set q random(312, 315)
select c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity)
from @S@.customer, @S@.orders, @S@.lineitem
where o_orderkey in (select l_orderkey from @S@.lineitem
                     group by l_orderkey having sum(l_quantity) > :q)
  and c_custkey = o_custkey
  and o_orderkey = l_orderkey
group by c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
order by o_totalprice desc, o_orderdate
limit 100;
