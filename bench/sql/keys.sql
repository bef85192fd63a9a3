-- TPC-H primary and foreign keys (specification §1.4.2), plus indexes on the foreign-key
-- columns and the date columns the queries filter on: the usual PostgreSQL set-up.
alter table @S@.region   add primary key (r_regionkey);
alter table @S@.nation   add primary key (n_nationkey);
alter table @S@.part     add primary key (p_partkey);
alter table @S@.supplier add primary key (s_suppkey);
alter table @S@.partsupp add primary key (ps_partkey, ps_suppkey);
alter table @S@.customer add primary key (c_custkey);
alter table @S@.orders   add primary key (o_orderkey);
alter table @S@.lineitem add primary key (l_orderkey, l_linenumber);

alter table @S@.nation   add foreign key (n_regionkey) references @S@.region;
alter table @S@.supplier add foreign key (s_nationkey) references @S@.nation;
alter table @S@.customer add foreign key (c_nationkey) references @S@.nation;
alter table @S@.partsupp add foreign key (ps_partkey) references @S@.part;
alter table @S@.partsupp add foreign key (ps_suppkey) references @S@.supplier;
alter table @S@.orders   add foreign key (o_custkey) references @S@.customer;
alter table @S@.lineitem add foreign key (l_orderkey) references @S@.orders;
alter table @S@.lineitem add foreign key (l_partkey, l_suppkey) references @S@.partsupp;

create index on @S@.supplier (s_nationkey);
create index on @S@.customer (c_nationkey);
create index on @S@.partsupp (ps_suppkey);
create index on @S@.orders   (o_custkey);
create index on @S@.orders   (o_orderdate);
create index on @S@.lineitem (l_partkey, l_suppkey);
create index on @S@.lineitem (l_suppkey);
create index on @S@.lineitem (l_shipdate);
