#!/usr/bin/env python3
"""Upgrading: each kept release's SQL (releases/pg_stride--VERSION.sql, installed beside
the current one by scripts/install-extension) updates to the current version with
ALTER EXTENSION pg_stride UPDATE, and the result is the extension a fresh CREATE
EXTENSION gives, with the DBA's groups and role assignments kept.

- in the groups' database (pg_stride.database), the old release is created, given two
  groups (one with rules and a memory budget) and a role assigned to one of them with
  ALTER ROLE … SET, then updated: its version is the current one, the groups table and
  pg_stride.groups hold the same groups, and a session of the role runs in its group;
- the updated extension's objects equal a fresh install's in another database: its
  members (pg_describe_object of the extension's dependencies) and their definitions,
  owners, grants and comments (pg_dump --schema-only --binary-upgrade, which writes each
  member out);
- the kept SQL of the current version is the script the build installs, so that the
  next release's update is written against what users have.

Prints one line per check, then "upgrade: N passed, N failed".
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402
from concurrency import AS_POSTGRES, ENV, PGBIN  # noqa: E402

PORT = int(os.environ.get("UPGRADE_PORT", "5520"))
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
RELEASES = os.path.join(ROOT, "releases")
APP = "regress_upgrade_app"

CHECKS = []
check = concurrency.collector(CHECKS)


def sql_in(s, database, sql):
    """Runs SQL as the superuser in `database` and returns its output."""
    args = s.psql_args(sql)
    args[args.index("-d") + 1] = database
    out = subprocess.run(args, env=ENV, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{sql!r} in {database} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def current_version(s):
    return s.sql("SELECT default_version FROM pg_available_extensions WHERE name = 'pg_stride'")


def kept_versions():
    """The versions whose SQL releases/ keeps, oldest first."""
    versions = [m.group(1) for f in os.listdir(RELEASES)
                if (m := re.fullmatch(r"pg_stride--([0-9.]+)\.sql", f))]
    return sorted(versions, key=lambda v: [int(p) for p in v.split(".")])


def members(s, database):
    return sql_in(s, database, """
        SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
         WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
           AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_stride')
         ORDER BY 1""").splitlines()


def schema_dump(s, database):
    """The database's schema as pg_dump writes it for pg_upgrade (every extension member
    spelled out), without what differs between any two databases: OIDs given to
    pg_upgrade's helper functions, a table's freeze horizon, the random key of
    \\restrict, comments."""
    out = subprocess.run(AS_POSTGRES + [f"{PGBIN}/pg_dump", "-h", s.dir, "-p", str(s.port),
                                        "-U", "postgres", "--schema-only", "--binary-upgrade",
                                        database],
                         env=ENV, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()
            if line and not line.startswith("--") and "binary_upgrade_" not in line
            and not re.match(r"\\(un)?restrict |SET relfrozenxid = |WHERE oid = '[0-9]+';", line)]


def blocks(sql):
    """A generated script's objects, in an order of their own (pgrx's is not stable), and
    without the source locations and Rust types it notes: a column whose Rust type becomes an
    Option is the same SQL."""
    def schema_of(block):
        block = re.sub(r"^-- src/.*\n", "", block, flags=re.M)
        return re.sub(r"[ \t]*/\* [^<][^*]*\*/", "", block).strip()
    return sorted(schema_of(block) for block in sql.split("/* <begin connected objects> */"))


def setup(s):
    s.sql(f"CREATE ROLE {APP} LOGIN")


@check
def every_kept_release_updates_with_its_groups_and_role_assignments(s):
    current = current_version(s)
    old = [v for v in kept_versions() if v != current]
    assert old, f"releases/ keeps no release before {current}"
    for version in old:
        s.sql("DROP EXTENSION IF EXISTS pg_stride CASCADE")
        s.sql(f"CREATE EXTENSION pg_stride VERSION '{version}'")
        s.sql("SELECT pg_stride.create_group('reports', weight => 300, max_concurrency => 2, "
              "memory_budget => 65536, rules => 'cpu_time > 600s: cancel')")
        s.sql("SELECT pg_stride.create_group('oltp', weight => 50, priority_min => 10)")
        s.sql(f"ALTER ROLE {APP} SET pg_stride.resource_group = 'reports'")
        table = "SELECT * FROM pg_stride.resource_groups ORDER BY name"
        view = ("SELECT name, weight, max_concurrency, memory_budget, rules "
                "FROM pg_stride.groups ORDER BY name")
        before = (s.sql(table), s.sql(view))
        s.sql("ALTER EXTENSION pg_stride UPDATE")
        got = s.sql("SELECT extversion FROM pg_extension WHERE extname = 'pg_stride'")
        assert got == current, f"{version} updated to {got}, not {current}"
        after = (s.sql(table), s.sql(view))
        assert after == before, f"groups before the update from {version}: {before}; after: {after}"
        assert "reports" in after[1] and "oltp" in after[1], after
        setting = s.sql(f"SELECT setconfig FROM pg_db_role_setting WHERE setrole = '{APP}'::regrole")
        assert "pg_stride.resource_group=reports" in setting, setting
        group = s.sql("SELECT \"group\" FROM pg_stride.activity WHERE pid = pg_backend_pid()",
                      user=APP)
        assert group == "reports", f"a session of {APP} runs in {group!r} after the update"
        print(f"       {version} -> {current}: groups {after[1].splitlines()}")


@check
def the_updated_extension_has_the_objects_of_a_fresh_install(s):
    sql_in(s, "postgres", "DROP DATABASE IF EXISTS fresh")
    sql_in(s, "postgres", "CREATE DATABASE fresh")
    sql_in(s, "fresh", "CREATE EXTENSION pg_stride")
    updated, fresh = members(s, "postgres"), members(s, "fresh")
    assert len(fresh) > 20, f"a fresh install has {len(fresh)} members"
    assert updated == fresh, (f"only after the update: {sorted(set(updated) - set(fresh))}; "
                              f"only in a fresh install: {sorted(set(fresh) - set(updated))}")
    updated, fresh = schema_dump(s, "postgres"), schema_dump(s, "fresh")
    differ = [(a, b) for a, b in zip(updated, fresh) if a != b]
    assert updated == fresh, (f"the schemas differ ({len(updated)} against {len(fresh)} lines), "
                              f"first: {differ[:1] or 'in length'}")
    print(f"       {len(members(s, 'fresh'))} members, {len(fresh)} lines of schema alike")


@check
def the_kept_sql_of_the_current_release_is_what_the_build_installs(s):
    current = current_version(s)
    pg_config = os.environ.get("PG_CONFIG") or f"{PGBIN}/pg_config"
    sharedir = subprocess.run([pg_config, "--sharedir"], capture_output=True, text=True,
                              check=True).stdout.strip()
    with open(os.path.join(sharedir, "extension", f"pg_stride--{current}.sql")) as f:
        installed = blocks(f.read())
    kept_path = os.path.join(RELEASES, f"pg_stride--{current}.sql")
    assert os.path.exists(kept_path), (
        f"releases/ does not keep {current}'s SQL: write it with "
        f"cargo pgrx schema --out {os.path.relpath(kept_path, ROOT)}")
    with open(kept_path) as f:
        kept = blocks(f.read())
    assert kept == installed, (
        f"releases/pg_stride--{current}.sql is not what the build installs: "
        f"{len(set(kept) ^ set(installed))} objects differ; a schema change needs a new "
        "version, its kept SQL and an update script in sql/")


def main():
    return concurrency.run_suite("upgrade", concurrency.Server(port=PORT), CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
