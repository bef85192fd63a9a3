#!/usr/bin/env python3
"""The documentation against the code: what README.md and docs/ say about settings and
views must be what a server with pg_stride reports.

- docs/configuration.md's table of settings has one row per registered setting
  (pg_settings, name LIKE 'pg_stride.%') and no other, and each row's type, default,
  range (min and max, or an enum's values), unit and context (reload = sighup, restart =
  postmaster, superuser, user) are pg_settings'; its "when to change it" says something;
- docs/views.md documents exactly the views of schema pg_stride, each with its columns
  in order and their types as information_schema.columns gives them (udt_name, read
  through TYPES below); every function of the schema is named there, and a function
  documented with a table of columns has exactly those result columns;
- every relative link in README.md and docs/**/*.md points at a file that exists, and
  every #anchor at a heading of that file (GitHub's anchors);
- README.md has at most README_MAX_LINES lines.

Starts its own temporary server (pg_stride preloaded, the extension created), port
DOCS_PORT (default 5519). Prints one line per check, then "docs: N passed, N failed".
Run as root, the server runs as postgres. Check names on the command line run only
those checks.
"""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import concurrency  # noqa: E402

PORT = int(os.environ.get("DOCS_PORT", "5519"))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 260

# pg_settings' context as the documentation names it.
CONTEXTS = {"sighup": "reload", "postmaster": "restart", "superuser": "superuser", "user": "user"}
# information_schema.columns' udt_name as docs/views.md names the type; a type not here
# is named by its data_type.
TYPES = {"int2": "smallint", "int4": "integer", "int8": "bigint", "float4": "real",
         "float8": "double precision", "numeric": "numeric", "bool": "boolean",
         "text": "text", "name": "name", "oid": "oid", "timestamptz": "timestamptz",
         "_int4": "integer[]", "_int8": "bigint[]", "_float8": "double precision[]",
         "_text": "text[]"}
# format_type() as docs/views.md names the type (for functions' result columns).
FORMAT_TYPES = {"timestamp with time zone": "timestamptz"}

CHECKS = []
check = concurrency.collector(CHECKS)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def section(text, heading):
    """The text under the `## heading` line, up to the next heading of level 2 or above."""
    lines = text.split("\n")
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"#{1,2} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def cells(line):
    """A Markdown table row's cells, split at pipes that are not escaped (`0\\|1`)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def ticked(cell):
    """The `code` spans of a cell, in order."""
    return re.findall(r"`([^`]*)`", cell)


def same_number(a, b):
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


@check
def the_configuration_page_lists_every_setting_as_registered(s):
    table = section(read("docs/configuration.md"), "## Settings")
    rows = [cells(line) for line in table.splitlines() if line.startswith("|")]
    header = rows[0]
    want = ["setting", "type", "default", "range or values", "unit", "context", "when to change it"]
    col = {name: header.index(name) for name in want if name in header}
    assert len(col) == len(want), f"the table's header {header} lacks {set(want) - set(col)}"
    documented = {}
    for row in rows[2:]:
        assert len(row) == len(header), f"{len(row)} cells, not {len(header)}: {row}"
        name = row[col["setting"]].strip("`")
        assert name not in documented, f"{name} twice"
        documented[name] = row
    registered = {}
    for line in s.sql("SELECT name, vartype, boot_val, coalesce(min_val, ''), coalesce(max_val, ''), "
                      "coalesce(unit, ''), context, coalesce(array_to_string(enumvals, ','), '') "
                      "FROM pg_settings WHERE name LIKE 'pg_stride.%' ORDER BY name").splitlines():
        name, vartype, boot, lo, hi, unit, context, enumvals = line.split("|")
        registered[name] = (vartype, boot, lo, hi, unit, context, enumvals)
    assert set(documented) == set(registered), (
        f"only in docs/configuration.md: {sorted(set(documented) - set(registered))}; "
        f"not in it: {sorted(set(registered) - set(documented))}")
    wrong = []
    for name, (vartype, boot, lo, hi, unit, context, enumvals) in sorted(registered.items()):
        row = documented[name]
        if row[col["type"]] != vartype:
            wrong.append(f"{name}: type {row[col['type']]!r}, registered {vartype!r}")
        default = (ticked(row[col["default"]]) or [""])[0]
        if not (default == boot or (vartype in ("integer", "real") and same_number(default, boot))):
            wrong.append(f"{name}: default {default!r}, registered {boot!r}")
        values = ticked(row[col["range or values"]])
        if vartype == "enum":
            if values != enumvals.split(","):
                wrong.append(f"{name}: values {values}, registered {enumvals.split(',')}")
        elif vartype in ("integer", "real"):
            if len(values) != 2 or not (same_number(values[0], lo) and same_number(values[1], hi)):
                wrong.append(f"{name}: range {values}, registered {lo} – {hi}")
        elif values:
            wrong.append(f"{name}: a range {values} for a {vartype}")
        doc_unit = row[col["unit"]].strip("`")
        if doc_unit != unit:
            wrong.append(f"{name}: unit {doc_unit!r}, registered {unit!r}")
        if row[col["context"]] != CONTEXTS.get(context, context):
            wrong.append(f"{name}: context {row[col['context']]!r}, registered {context!r} "
                         f"({CONTEXTS.get(context, context)})")
        if len(row[col["when to change it"]]) < 20:
            wrong.append(f"{name}: no \"when to change it\"")
    assert not wrong, "; ".join(wrong)


def documented_tables(text):
    """{name: [(column, type)]} of each `### \\`pg_stride.NAME\\`` heading of `text`
    followed by a table of columns; NAME keeps a trailing `()`."""
    tables = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"### `pg_stride\.([a-z_]+(?:\(\))?)`\s*$", line)
        if m:
            name = m.group(1)
            continue
        if line.startswith("#"):
            name = None
        elif name and line.startswith("| `"):
            row = cells(line)
            tables.setdefault(name, []).append((row[0].strip("`"), row[1]))
    return tables


@check
def the_views_page_lists_every_view_with_its_columns(s):
    views = documented_tables(section(read("docs/views.md"), "## Views"))
    actual = {}
    for line in s.sql("SELECT c.table_name, c.column_name, c.udt_name, c.data_type "
                      "FROM information_schema.columns c JOIN information_schema.views v "
                      "USING (table_schema, table_name) WHERE c.table_schema = 'pg_stride' "
                      "ORDER BY c.table_name, c.ordinal_position").splitlines():
        view, column, udt, data_type = line.split("|")
        actual.setdefault(view, []).append((column, TYPES.get(udt, data_type)))
    plain = {name for name in views if not name.endswith("()")}
    assert plain == set(actual), (
        f"only in docs/views.md: {sorted(plain - set(actual))}; "
        f"not in it: {sorted(set(actual) - plain)}")
    wrong = [f"pg_stride.{view}: {column_differences(views[view], columns)}"
             for view, columns in sorted(actual.items()) if views[view] != columns]
    assert not wrong, "; ".join(wrong)


def column_differences(documented, actual):
    """What differs between two lists of (column, type), in a few words."""
    doc, act = dict(documented), dict(actual)
    parts = [f"only documented: {[c for c, _ in documented if c not in act]}",
             f"not documented: {[c for c, _ in actual if c not in doc]}",
             f"types: {[(c, doc[c], t) for c, t in actual if c in doc and doc[c] != t]}"]
    if [c for c, _ in documented if c in act] != [c for c, _ in actual if c in doc]:
        parts.append(f"order: documented {[c for c, _ in documented]}, the server has {[c for c, _ in actual]}")
    return "; ".join(p for p in parts if not p.endswith("[]")) or f"documented {documented}, the server has {actual}"


@check
def the_views_page_names_every_function(s):
    text = read("docs/views.md")
    functions = s.sql("SELECT DISTINCT proname FROM pg_proc "
                      "WHERE pronamespace = 'pg_stride'::regnamespace ORDER BY 1").split()
    missing = [f for f in functions if not re.search(rf"\b{f}\b", text)]
    assert not missing, f"not named in docs/views.md: {missing}"
    wrong = []
    for name, columns in documented_tables(section(text, "## Functions")).items():
        if not name.endswith("()"):
            continue
        out = s.sql(
            "SELECT string_agg(n || ':' || format_type(t, NULL), ',' ORDER BY i) "
            "FROM pg_proc p, unnest(p.proargnames, p.proallargtypes, p.proargmodes) "
            "WITH ORDINALITY AS a(n, t, m, i) "
            f"WHERE p.oid = 'pg_stride.{name[:-2]}'::regproc AND m IN ('o', 't', 'b')")
        have = [(c, FORMAT_TYPES.get(t, t)) for c, t in (x.split(":") for x in out.split(","))]
        if have != columns:
            wrong.append(f"pg_stride.{name}: {column_differences(columns, have)}")
    assert not wrong, "; ".join(wrong)


def without_code_blocks(text):
    """`text` with fenced code blocks blanked (lines kept, for line numbers)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def without_code(text):
    """`text` without code: fenced blocks blanked, inline code spans removed."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def slug(heading):
    """GitHub's anchor of a heading: its text without Markdown, lower-cased, without
    punctuation, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen, result = {}, set()
    for line in without_code_blocks(open(path, encoding="utf-8").read()).split("\n"):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
    return result


@check
def every_link_and_anchor_resolves(s):
    pages = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                   glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    broken, count = [], 0
    for page in pages:
        for number, line in enumerate(without_code(read(page)).split("\n"), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                count += 1
                path, _, anchor = target.partition("#")
                here = os.path.join(ROOT, page)
                file = os.path.normpath(os.path.join(os.path.dirname(here), path)) if path else here
                if not os.path.exists(file):
                    broken.append(f"{page}:{number}: {target} (no such file)")
                elif anchor and file.endswith(".md") and anchor not in anchors(file):
                    broken.append(f"{page}:{number}: {target} (no such heading)")
    assert count > 0, "no links found"
    assert not broken, "; ".join(broken)


@check
def the_readme_is_short(s):
    lines = read("README.md").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}"


def setup(s):
    s.sql("CREATE EXTENSION pg_stride")


def main():
    return concurrency.run_suite("docs", concurrency.Server(port=PORT), CHECKS, setup)


if __name__ == "__main__":
    sys.exit(main())
