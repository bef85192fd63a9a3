"""Paths, logging and process helpers shared by the benchmark modules."""

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent          # .../bench
DATA = BENCH / "data"                                   # generated data, server dir (git-ignored)
OUT = BENCH / "out"                                     # runs, logs, venv (git-ignored)
QUERIES = BENCH / "queries"
SQL = BENCH / "sql"
RESULTS_MD = BENCH / "RESULTS.md"
RESULTS_DIR = BENCH / "results"

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
PGBOUNCER = Path(os.environ.get("PGBOUNCER", "/usr/sbin/pgbouncer"))

PG_PORT = int(os.environ.get("BENCH_PG_PORT", "5497"))
BOUNCER_PORT = int(os.environ.get("BENCH_BOUNCER_PORT", "6497"))

IS_ROOT = os.geteuid() == 0
# initdb, postgres and pgbouncer refuse to run as root: as root they run as this user.
SERVER_USER = os.environ.get("BENCH_SERVER_USER", "postgres")
# Every measured query is sent by this role: LOGIN, not a superuser, with the rights an
# application has on the benchmark's tables. pg_stride then admits and schedules it as it
# would an application's (a superuser's statements skip admission, exempt_superuser).
# Set-up, prewarming and the views are read as SERVER_USER.
APP_ROLE = "stride_app"

_t0 = time.monotonic()


class MachineBusy(Exception):
    """Another benchmark run holds the machine; the argument is its pid, as it wrote it."""


def claim_machine(lock_path: Path):
    """Takes the benchmark's lock for as long as the returned file stays open: two runs
    at once would stop and start each other's servers (they share one data directory)
    and measure each other's load. Raises MachineBusy when another run holds it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(lock_path, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        other = fh.read().strip() or "unknown"
        fh.close()
        raise MachineBusy(other) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def parse_settings(lines: list) -> dict:
    """`name = value` setting lines as a dict, quotes around a value dropped; lines
    without `=` are skipped."""
    out = {}
    for line in lines:
        if "=" in line:
            k, v = (x.strip().strip("'") for x in line.split("=", 1))
            out[k] = v
    return out


def log(msg: str) -> None:
    el = time.monotonic() - _t0
    print(f"[bench {int(el) // 60:3d}:{int(el) % 60:02d}] {msg}", flush=True)


def ncpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def as_server_user(cmd: list) -> list:
    """Prefix a command so that it runs as the server user when we are root."""
    if IS_ROOT:
        return ["runuser", "-u", SERVER_USER, "--"] + [str(c) for c in cmd]
    return [str(c) for c in cmd]


def chown_server(path: Path) -> None:
    """Give a directory we created to the server user (no-op when not root)."""
    if IS_ROOT:
        pw = pwd.getpwnam(SERVER_USER)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def run(cmd, check=True, capture=False, env=None, cwd=None, timeout=None, quiet=False):
    cmd = [str(c) for c in cmd]
    if not quiet:
        log("$ " + " ".join(cmd))
    res = subprocess.run(cmd, check=False, env=env, cwd=cwd, timeout=timeout,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None, text=True)
    if check and res.returncode != 0:
        err = (res.stderr or "").strip() if capture else ""
        raise RuntimeError(f"command failed ({res.returncode}): {' '.join(cmd)}\n{err}")
    return res


def which(name: str) -> str | None:
    return shutil.which(name)


def die(msg: str) -> None:
    print(f"bench: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def load_configs() -> dict:
    """configs.toml, with every configuration that `extends` another resolved."""
    with open(BENCH / "configs.toml", "rb") as fh:
        cfg = tomllib.load(fh)
    cfg["config"] = resolve_extends(cfg["config"])
    return cfg


def resolve_extends(configs: list) -> list:
    """Each configuration with `extends = "<name>"` gets that one's keys (resolved in
    turn) under its own: its `settings` and `requires` come after the other's (the later
    of two lines setting one parameter wins in postgresql.conf), its other keys replace
    the other's. Its `name` and `label` are its own."""
    by_name = {c["name"]: c for c in configs}

    def resolve(c: dict, seen: tuple) -> dict:
        base_name = c.get("extends")
        if base_name is None:
            return c
        if base_name not in by_name or base_name in seen:
            die(f"bench/configs.toml: {c['name']} extends "
                f"{'an unknown' if base_name not in by_name else 'circularly the'} "
                f"configuration {base_name!r}")
        base = resolve(by_name[base_name], seen + (c["name"],))
        merged = {k: v for k, v in base.items() if k not in ("name", "label")}
        for k, v in c.items():
            if k in ("settings", "requires"):
                merged[k] = base.get(k, []) + v
            elif k != "extends":
                merged[k] = v
        return merged

    return [resolve(c, ()) for c in configs]


def expand(settings: list) -> list:
    n = ncpus()
    return [s.replace("@2xCPUS@", str(2 * n)).replace("@CPUS+1@", str(n + 1))
            .replace("@CPUS@", str(n)) for s in settings]
