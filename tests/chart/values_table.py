#!/usr/bin/env python3
"""Writes the chart's values table, made from charts/stickyvol/values.yaml, into
docs/operations/install.md between the lines <!-- values-table:begin --> and
<!-- values-table:end -->: a row per value with its path, its default and the comment above it
(and after it, on its line). A map is a row of its own where it is one setting (an
updateStrategy, a nodeSelector, a container's resources or securityContext: ONE_ROW), else each
of its keys is one.
Every row needs a comment: a value without one fails, and so does --check when the committed
table is not what this would write.

    tests/chart/values_table.py           # writes the table
    tests/chart/values_table.py --check   # fails, with a diff, if it is out of date
    tests/chart/values_table.py --check VALUES PAGE   # other files (tests/chart/run's own test)
"""
import difflib
import fnmatch
import os
import re
import sys

import yaml

args = [a for a in sys.argv[1:] if a != "--check"]
if not args:
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
VALUES, PAGE = args or ["charts/stickyvol/values.yaml", "docs/operations/install.md"]
BEGIN, END = "<!-- values-table:begin -->", "<!-- values-table:end -->"
ONE_ROW = [
    "node.updateStrategy",
    "*.nodeSelector",
    "*.resources.*",
    "*.securityContext",
    "*.podSecurityContext",
    "monitoring.dashboard.labels",
]
KEY = re.compile(r"^( *)([\w./-]+):(\s.*|)$")


def comments():
    """Each key's path → its comment: the comment lines just above it, less their indented
    examples, and the comment after it on its line."""
    found, above, stack = {}, [], []
    for line in open(VALUES):
        line = line.rstrip("\n")
        if line.lstrip().startswith("#"):
            text = line.lstrip()[1:]
            if not text.startswith("   "):  # "#   key: value" is an example
                above.append(text.strip())
            continue
        m = KEY.match(line)
        if m:
            indent, key = len(m.group(1)), m.group(2)
            after = m.group(3).partition(" #")[2].strip()
            stack = [(i, k) for i, k in stack if i < indent] + [(indent, key)]
            found[".".join(k for _, k in stack)] = " ".join(above + ([after] if after else []))
        above = []
    return found


def default(value):
    """The value as YAML would write it, on one line: `'on'`, `""`, `{type: RollingUpdate}`."""
    flow = yaml.safe_dump(value, default_flow_style=True, width=1000, sort_keys=False)
    return "`" + flow.removesuffix("\n").removesuffix("\n...").replace("''", '""', flow == "''\n") + "`"


def markdown(text):
    """A comment as a table cell: docs/ paths become links (from docs/operations/, where the table
    is), `<x>` and `|` stay text."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        part = parts[i].replace("<", "&lt;")
        parts[i] = re.sub(
            r"(?<![\w/])(docs/[\w./-]+?\.md)(#[\w-]+)?",
            lambda m: f"[{m.group(0)}]({os.path.relpath(m.group(1), 'docs/operations')}{m.group(2) or ''})",
            part,
        )
    return "".join(parts).replace("|", "\\|")


def rows(values, said, prefix=""):
    for key, value in values.items():
        path = prefix + key
        whole = any(fnmatch.fnmatch(path, p) for p in ONE_ROW)
        if isinstance(value, dict) and value and not whole:
            if said.get(path):  # a group's own comment, as a row of its own
                yield path, "", said[path]
            yield from rows(value, said, path + ".")
        else:
            yield path, default(value), said.get(path, "")


def table():
    said = comments()
    lines = ["| value | default | what it sets |", "|---|---|---|"]
    bare = []
    for path, value, text in rows(yaml.safe_load(open(VALUES)), said):
        if not text:
            bare.append(path)
        lines.append(f"| `{path}` | {value} | {markdown(text)} |")
    if bare:
        sys.exit(f"{VALUES}: no comment above {', '.join(bare)}: say what each sets")
    return "\n".join(lines)


page = open(PAGE).read()
start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
new = page[:start] + "\n\n" + table() + "\n\n" + page[end:]
if "--check" in sys.argv:
    if new != page:
        sys.stdout.writelines(difflib.unified_diff(
            page.splitlines(True), new.splitlines(True), PAGE, f"{PAGE} (from {VALUES})"))
        sys.exit(f"{PAGE}: the values table is not {VALUES}'s: run tests/chart/values_table.py")
    print(f"{PAGE}: the values table is {VALUES}'s")
elif new != page:
    open(PAGE, "w").write(new)
    print(f"{PAGE}: values table written")
