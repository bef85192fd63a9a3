-- TPC-H Q22: global sales opportunity.  Seven different country codes in 10 .. 34.
\set c random(0, 24)
select cntrycode, count(*) as numcust, sum(c_acctbal) as totacctbal
from (
  select substring(c_phone from 1 for 2) as cntrycode, c_acctbal
  from @S@.customer
  where substring(c_phone from 1 for 2) in (
          ((:c + 0) % 25 + 10)::text, ((:c + 3) % 25 + 10)::text, ((:c + 6) % 25 + 10)::text,
          ((:c + 9) % 25 + 10)::text, ((:c + 12) % 25 + 10)::text, ((:c + 15) % 25 + 10)::text,
          ((:c + 18) % 25 + 10)::text)
    and c_acctbal > (
          select avg(c_acctbal) from @S@.customer
          where c_acctbal > 0.00
            and substring(c_phone from 1 for 2) in (
                  ((:c + 0) % 25 + 10)::text, ((:c + 3) % 25 + 10)::text, ((:c + 6) % 25 + 10)::text,
                  ((:c + 9) % 25 + 10)::text, ((:c + 12) % 25 + 10)::text, ((:c + 15) % 25 + 10)::text,
                  ((:c + 18) % 25 + 10)::text))
    and not exists (select * from @S@.orders where o_custkey = c_custkey)
) as custsale
group by cntrycode
order by cntrycode;
