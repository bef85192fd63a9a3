"""Which TPC-H queries the workload uses, and why the others are left out."""

from pathlib import Path

from .common import QUERIES

ALL = [f"q{i:02d}" for i in range(1, 23)]

# Left out of the workload, with the reason (measured on this suite's data, see
# bench/README.md).  Their scripts stay in bench/queries/ so they can be brought back.
EXCLUDED = {
}

INCLUDED = [q for q in ALL if q not in EXCLUDED]

# Colours of p_name (TPC-H specification §4.2.3), for Q9 and Q20.
COLORS = (
    "almond antique aquamarine azure beige bisque black blanched blue blush brown burlywood "
    "burnished chartreuse chiffon chocolate coral cornflower cornsilk cream cyan dark deep "
    "dim dodger drab firebrick floral forest frosted gainsboro ghost goldenrod green grey "
    "honeydew hot indian ivory khaki lace lavender lawn lemon light lime linen magenta "
    "maroon medium metallic midnight mint misty moccasin navajo navy olive orange orchid "
    "pale papaya peach peru pink plum powder puff purple red rose rosy royal saddle salmon "
    "sandy seashell sienna sky slate smoke snow spring steel tan thistle tomato turquoise "
    "violet wheat white yellow").split()
assert len(COLORS) == 92


def render(query: str, schema: str, sf: float) -> str:
    """The pgbench script of `query` against `schema` (scale factor `sf`)."""
    text = (QUERIES / f"{query}.sql").read_text()
    colors = "array[" + ",".join(f"'{c}'" for c in COLORS) + "]"
    return (text.replace("@S@", schema).replace("@SF@", repr(float(sf)))
            .replace("@COLORS@", colors))


def write_scripts(outdir: Path, queries, schema: str, sf: float, lead: str = "",
                  comment: str = "") -> dict:
    """Write one pgbench script per query; returns query -> path. A `lead` statement
    (SQL without its semicolon) goes in front of the query (`with_lead`), a `comment`
    into its statement (`with_comment`)."""
    outdir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for q in queries:
        p = outdir / f"{schema}_{q}.sql"
        text = render(q, schema, sf)
        if lead:
            text = with_lead(text, lead)
        if comment:
            text = with_comment(text, comment)
        p.write_text(text)
        paths[q] = p
    return paths


def is_sql_line(line: str) -> bool:
    """Whether a script line is SQL: not blank, not a comment, not a meta-command."""
    return bool(line.strip()) and not line.lstrip().startswith(("--", "\\"))


def _first_sql_line(lines: list) -> int:
    return next(i for i, ln in enumerate(lines) if is_sql_line(ln))


def with_lead(script: str, lead: str) -> str:
    """`script` with `lead` as a command of its own before its SQL statement: before the
    first line that is not a comment or a meta-command. It costs a round trip.

    Not in the query's message (pgbench's compound `\\;`, as before 2026-11-27): for a
    compound command, pgbench's thread reads the first statement's result and then waits
    in a blocking PQgetResult for the next, which the server sends in parts when it
    outgrows its 8-kB output buffer. pgbench's one thread then served no other client
    until the query ended. Measured with two scripts at 50/s on 4 clients and one
    thread: `SELECT 1` beside a compound whose 5,000 rows pause for 300 ms midway took
    266 ms on average (schedule lag 231 ms); with separate commands, 0.34 ms (0.14 ms).
    In the benchmark, points with a lead had schedule lags of 12-206 ms where the
    others had at most 4 (pgbouncer aside, whose points ran out of clients)."""
    lines = script.splitlines(keepends=True)
    i = _first_sql_line(lines)
    return "".join(lines[:i]) + lead + ";\n" + "".join(lines[i:])


def with_comment(script: str, comment: str) -> str:
    """`script` with the block comment `comment` on a line of its own directly before
    its SQL statement's first line: pgbench sends it as part of the statement."""
    lines = script.splitlines(keepends=True)
    i = _first_sql_line(lines)
    return "".join(lines[:i]) + comment + "\n" + "".join(lines[i:])


# The nice value of a query's backend in the `prioritize` configuration, by class.
NICE = {"short": 0, "long": 19}


def nice_lead(cls: str) -> str:
    """The statement a `prioritize` script sends with its query: set this backend's nice
    value."""
    return f"SELECT set_backend_priority(pg_backend_pid(), {NICE[cls]})"


# The resource group of a query's class in the configurations with `class_groups`.
GROUP = {"short": "interactive", "long": "analytics"}


def group_lead(cls: str) -> str:
    """The statement a `class_groups` script with `group_by = "set"` sends before its
    query: put the session's statements into its class's resource group."""
    return f"SET pg_stride.resource_group = '{GROUP[cls]}'"


def group_tag(cls: str) -> str:
    """The comment by which a `class_groups` script's query names its class's resource
    group (the default, `group_by = "tag"`): no statement, no round trip."""
    return f"/* pg_stride.resource_group={GROUP[cls]} */"
