"""A second workload that is not TPC-H (`bench/run --workload synthetic`): an event log
and its accounts, generated in the server, and sixteen statements whose sizes spread over
three orders of magnitude (0.2 ms to 0.6 s alone on the benchmark's machine), from an
index range of a few thousand rows to sorts of the whole log.

Why another workload: TPC-H's two classes are the same 22 queries at two scale factors,
so "short" and "long" differ by a factor of ten in every query, and a scheduler could be
tuned to that ratio without anyone noticing. Here the classes are different statements
(point-range reads, top-N, small joins against full scans, hash aggregates of the whole
log, a window, a percentile sort); within each class the sizes spread geometrically, so
that the mix is heavy-tailed: most arrivals are small, and most of the CPU goes to a few
large ones. Each class has as many statements as the other, so that the workload's
3:1 class weights (workload.CLASS_WEIGHT) give 3 short arrivals for 1 long one, as in
the TPC-H mix.

The data: `synth.events` (EVENTS rows, one a second from 2026-01-01, so that time and id
ranges select the same rows, as in an append-only log) and `synth.accounts` (ACCOUNTS
rows, each with a region and a tier); an event's account, kind and amount are drawn from
a fixed-seed generator, so every load gives the same data.
"""

from pathlib import Path

from . import data, queries
from .common import log
from .pgserver import Server

SCHEMA = "synth"
EVENTS = 2_000_000
ACCOUNTS = 20_000
START = "timestamp '2026-01-01'"

LOAD = f"""
drop schema if exists {SCHEMA} cascade;
create schema {SCHEMA};
select setseed(0.20210);
create table {SCHEMA}.accounts (
    id int primary key, region int not null, tier int not null, opened date not null);
insert into {SCHEMA}.accounts
    select i, (random() * 9)::int, (random() * 3)::int,
           date '2020-01-01' + (random() * 2000)::int
    from generate_series(1, {ACCOUNTS}) i;
create table {SCHEMA}.events (
    id bigint primary key, account_id int not null, kind int not null,
    amount float8 not null, at timestamp not null, note text);
insert into {SCHEMA}.events
    select i, 1 + (random() * ({ACCOUNTS} - 1))::int, (random() * 15)::int,
           round((exp(random() * 8) - 1)::numeric, 2),
           {START} + i * interval '1 second', md5(i::text)
    from generate_series(1, {EVENTS}) i;
create index on {SCHEMA}.events (account_id);
create index on {SCHEMA}.events (at);
"""

# pgbench variables every statement may use: the start of an id range, of a wider one,
# an account, an hour and a day of the log, a region and a tier.
SETS = f"""\\set x random(1, {EVENTS} - 100000)
\\set w random(1, {EVENTS} - 600000)
\\set a random(1, {ACCOUNTS})
\\set h random(0, {EVENTS} / 3600 - 25)
\\set d random(0, {EVENTS} / 86400 - 8)
\\set r random(0, 9)
\\set t random(0, 3)
"""

E = f"{SCHEMA}.events"
A = f"{SCHEMA}.accounts"

# name -> (class, statement). Roughly in order of size within each class.
STATEMENTS = {
    "s01": ("short", f"SELECT sum(amount), count(*) FROM {E} WHERE id BETWEEN :x AND :x + 2000"),
    "s02": ("short", f"SELECT * FROM {E} WHERE at >= {START} + :h * interval '1 hour' "
                     f"AND at < {START} + :h * interval '1 hour' + interval '10 minutes' "
                     f"ORDER BY amount DESC LIMIT 20"),
    "s03": ("short", f"SELECT kind, count(*), avg(amount) FROM {E} WHERE account_id = :a "
                     f"GROUP BY kind"),
    "s04": ("short", f"SELECT kind, percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) "
                     f"FROM {E} WHERE id BETWEEN :x AND :x + 10000 GROUP BY kind"),
    "s05": ("short", f"SELECT a.region, sum(e.amount) FROM {E} e JOIN {A} a "
                     f"ON a.id = e.account_id WHERE e.id BETWEEN :x AND :x + 20000 "
                     f"GROUP BY a.region"),
    "s06": ("short", f"SELECT e.kind, count(*) FROM {E} e WHERE e.account_id IN "
                     f"(SELECT id FROM {A} WHERE region = :r AND tier = :t LIMIT 50) "
                     f"GROUP BY e.kind"),
    "s07": ("short", f"SELECT count(DISTINCT account_id) FROM {E} "
                     f"WHERE id BETWEEN :x AND :x + 50000"),
    "s08": ("short", f"SELECT date_trunc('hour', at), sum(amount) FROM {E} "
                     f"WHERE at >= {START} + :h * interval '1 hour' "
                     f"AND at < {START} + :h * interval '1 hour' + interval '1 day' "
                     f"GROUP BY 1 ORDER BY 1"),
    "l01": ("long", f"SELECT a.tier, count(*) FROM {A} a WHERE EXISTS "
                    f"(SELECT 1 FROM {E} e WHERE e.account_id = a.id AND e.amount > 2900 "
                    f"AND e.kind = :t) GROUP BY a.tier"),
    "l02": ("long", f"SELECT kind, count(*), sum(amount) FROM {E} GROUP BY kind"),
    "l03": ("long", f"SELECT count(DISTINCT account_id) FROM {E} "
                    f"WHERE at >= {START} + :d * interval '1 day' "
                    f"AND at < {START} + :d * interval '1 day' + interval '7 days'"),
    "l04": ("long", f"SELECT account_id, sum(amount) FROM {E} GROUP BY account_id "
                    f"ORDER BY 2 DESC LIMIT 100"),
    "l05": ("long", f"SELECT date_trunc('day', at), kind, sum(amount) FROM {E} "
                    f"GROUP BY 1, 2 ORDER BY 1, 2"),
    "l06": ("long", f"SELECT a.region, a.tier, count(*), avg(e.amount) FROM {E} e "
                    f"JOIN {A} a ON a.id = e.account_id GROUP BY 1, 2"),
    "l07": ("long", f"SELECT count(*) FROM (SELECT amount - avg(amount) OVER "
                    f"(PARTITION BY account_id) AS above FROM {E} "
                    f"WHERE id BETWEEN :w AND :w + 500000) s "
                    f"WHERE above > 0"),
    "l08": ("long", f"SELECT kind, percentile_disc(0.99) WITHIN GROUP (ORDER BY amount) "
                    f"FROM {E} GROUP BY kind"),
}

# The speed probe (workload.speed_probe): a serial, CPU-bound scan of the log.
PROBE = f"SELECT count(*), sum(amount * kind) FROM {E}"


def names(cls: str) -> list:
    return [n for n, (c, _) in STATEMENTS.items() if c == cls]


def script(name: str) -> str:
    """The pgbench script of statement `name`."""
    return SETS + STATEMENTS[name][1] + ";\n"


def load(server: Server, db: str):
    """Generates the data in `db`, unless it is there already."""
    data.ensure_database(server, db)
    # the record names the log's size: a log generated with other constants is made again
    name = f"{SCHEMA}_{EVENTS}_{ACCOUNTS}"
    if data.is_loaded(server, db, name):
        log(f"synthetic event log already loaded in {db}.{SCHEMA}")
        return
    log(f"generating the synthetic event log ({EVENTS} events) in {db}.{SCHEMA}")
    server.psql(LOAD, db=db)
    # its own command: psql -c runs the statements above in one transaction
    server.psql(f"vacuum (freeze, analyze) {SCHEMA}.accounts, {SCHEMA}.events", db=db)
    server.psql(f"delete from public.bench_loaded where name like '{SCHEMA}%'", db=db)
    server.psql(f"insert into public.bench_loaded (name, scale_factor, generator) values "
                f"('{name}', {EVENTS}, 'bench/stride_bench/synthetic.py')", db=db)
    server.psql("checkpoint")


def write_scripts(outdir: Path, lead_of=None, comment_of=None) -> dict:
    """One pgbench script per statement, keyed (name, class) in class order (short, then
    long), like the TPC-H mix's. `lead_of(cls)` / `comment_of(cls)`: a statement sent
    before, or a comment inside, each statement of class `cls` (queries.with_lead,
    queries.with_comment)."""
    outdir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for cls in ("short", "long"):
        for name in names(cls):
            text = script(name)
            if lead_of:
                text = queries.with_lead(text, lead_of(cls))
            if comment_of:
                text = queries.with_comment(text, comment_of(cls))
            path = outdir / f"{SCHEMA}_{name}.sql"
            path.write_text(text)
            paths[(name, cls)] = path
    return paths
