#!/usr/bin/env python3
"""The compatibility tables of docs/compatibility.md, from the runs recorded beside it.

    compat_table.py add RUNS.tsv ROW        put ROW (tab-separated) into RUNS.tsv, replacing the
                                            row with the same key (the columns KEYS names)
    compat_table.py render DOC              write every table of DOC again from its runs file:
                                            a table sits between `<!-- runs: PATH -->` and
                                            `<!-- end of runs -->`, PATH relative to DOC

A runs file is TSV with a header line; its columns are the table's, in order. Rows are sorted
by their key, so a table reads the same whatever order the runs were made in.
"""
import os
import sys

# The columns that name one setup, those of them a runs file has: a new run of the same setup
# replaces the old row.
SETUP = ("Kubernetes", "node filesystems", "kernel", "cgroup", "suite", "part")
BEGIN, END = "<!-- runs: ", "<!-- end of runs -->"


def read(path):
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    return lines[0].split("\t"), [line.split("\t") for line in lines[1:]]


def key_of(header, row):
    return tuple(row[header.index(column)] for column in SETUP if column in header)


def add(path, row_text):
    header, rows = read(path)
    row = row_text.split("\t")
    if len(row) != len(header):
        sys.exit(f"compat_table: {len(row)} columns, {path} has {len(header)}: {row_text!r}")
    rows = [r for r in rows if key_of(header, r) != key_of(header, row)] + [row]
    rows.sort(key=lambda r: key_of(header, r))
    with open(path, "w", encoding="utf-8") as f:
        for r in [header] + rows:
            f.write("\t".join(r) + "\n")


def table(path):
    header, rows = read(path)
    cell = lambda text: text.replace("|", "\\|")
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render(doc):
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    out, rest = [], text
    while BEGIN in rest:
        before, _, after = rest.partition(BEGIN)
        marker, _, after = after.partition(" -->")
        if END not in after:
            sys.exit(f"compat_table: {doc}: a table for {marker} has no {END!r}")
        _, _, rest = after.partition(END)
        runs = os.path.join(os.path.dirname(doc), marker)
        out.append(f"{before}{BEGIN}{marker} -->\n{table(runs)}\n{END}")
    out.append(rest)
    with open(doc, "w", encoding="utf-8") as f:
        f.write("".join(out))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "add":
        add(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "render":
        render(sys.argv[2])
    else:
        sys.exit(__doc__)
