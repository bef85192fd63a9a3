"""TPC-H data: generated with the pure-Rust tpchgen-cli, loaded with COPY into one schema
per scale factor, keyed, indexed and analysed.  Idempotent: a schema recorded in
public.bench_loaded is skipped; a half-loaded one is dropped and loaded again."""

import os
import shutil
from pathlib import Path

from .common import DATA, PG_BIN, SQL, log, run
from .pgserver import Server

TABLES = ["region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
TPCHGEN_VERSION = "4.0.0"


def schema_name(sf: float) -> str:
    """sf0_03 for SF 0.03: the scale factor is part of the name so that changing it never
    mixes data sets."""
    text = f"{sf:g}".replace(".", "_")
    return f"sf{text}"


def tpchgen_bin() -> str:
    cand = os.environ.get("TPCHGEN_CLI") or shutil.which("tpchgen-cli")
    if not cand:
        raise RuntimeError("tpchgen-cli not found: bench/run installs it into its venv from PyPI")
    return cand


def _ensure_meta(server: Server, db: str):
    server.psql("create table if not exists public.bench_loaded ("
                "name text primary key, scale_factor float8, generator text, "
                "loaded_at timestamptz default now())", db=db)


def is_loaded(server: Server, db: str, name: str) -> bool:
    _ensure_meta(server, db)
    return server.psql(f"select count(*) from public.bench_loaded where name = '{name}'",
                       db=db) == "1"


def ensure_database(server: Server, db: str):
    if server.psql(f"select count(*) from pg_database where datname = '{db}'") != "1":
        server.psql(f"create database {db}")


def render(path: Path, schema: str) -> str:
    return path.read_text().replace("@S@", schema)


def generate(sf: float) -> Path:
    """tpchgen-cli output for one scale factor (kept under bench/data/tpch)."""
    outdir = DATA / "tpch" / schema_name(sf)
    done = outdir / ".complete"
    if done.exists():
        return outdir
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    log(f"generating TPC-H SF {sf:g} into {outdir}")
    run([tpchgen_bin(), "csv", "--scale-factor", f"{sf:g}", "--output-dir", outdir, "--quiet"],
        capture=True)
    done.write_text(TPCHGEN_VERSION + "\n")
    return outdir


def _table_file(outdir: Path, table: str) -> Path:
    for cand in (outdir / f"{table}.csv", outdir / table / f"{table}.csv"):
        if cand.exists():
            return cand
    hits = sorted(outdir.rglob(f"{table}*.csv"))
    if len(hits) == 1:
        return hits[0]
    raise RuntimeError(f"no CSV for table {table} under {outdir}")


def load(server: Server, db: str, sf: float):
    schema = schema_name(sf)
    ensure_database(server, db)
    if is_loaded(server, db, schema):
        log(f"TPC-H SF {sf:g} already loaded in {db}.{schema}")
        return
    outdir = generate(sf)
    log(f"loading TPC-H SF {sf:g} into {db}.{schema}")
    server.psql(f"drop schema if exists {schema} cascade", db=db)
    server.psql(render(SQL / "schema.sql", schema), db=db)
    for table in TABLES:
        f = _table_file(outdir, table)
        server.psql(f"\\copy {schema}.{table} from '{f}' with (format csv, header true)", db=db)
    log(f"keys, indexes and ANALYZE for {schema}")
    server.psql(render(SQL / "keys.sql", schema), db=db)
    server.psql("vacuum (freeze, analyze) " +
                ", ".join(f"{schema}.{t}" for t in TABLES), db=db)
    server.psql(f"insert into public.bench_loaded (name, scale_factor, generator) values "
                f"('{schema}', {sf}, 'tpchgen-cli {TPCHGEN_VERSION}')", db=db)
    server.psql("checkpoint")


def load_pgbench(server: Server, db: str, scale: int):
    """pgbench's TPC-B-like tables for the mixed and overhead measurements."""
    ensure_database(server, db)
    name = f"pgbench_scale_{scale}"
    if is_loaded(server, db, name):
        log(f"pgbench tables (scale {scale}) already loaded in {db}")
        return
    log(f"pgbench -i -s {scale} {db}")
    run([PG_BIN / "pgbench", "-i", "-q", "-s", scale, *server.conn_args(db)], capture=True)
    server.psql(f"insert into public.bench_loaded (name, scale_factor, generator) values "
                f"('{name}', {scale}, 'pgbench -i')", db=db)
    server.psql("checkpoint")
