#!/usr/bin/env python3
"""Compares two multi-document YAML streams object by object.

    compare.py EXPECTED ACTUAL

Each stream is parsed (comments, key order, quoting and document order vanish), empty documents
are dropped, and objects are matched by (apiVersion, kind, namespace, name). Exit status 0 when
both hold the same objects with the same content; otherwise 1, after printing which objects are
missing or extra and a unified diff of each object that differs (keys sorted).
"""
import difflib
import sys

import yaml


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    objects = {}
    for d in docs:
        meta = d.get("metadata") or {}
        key = (d.get("apiVersion"), d.get("kind"), meta.get("namespace") or "", meta.get("name"))
        if key in objects:
            sys.exit(f"{path}: {'/'.join(map(str, key))} appears twice")
        objects[key] = d
    return objects


def show(key):
    api, kind, ns, name = key
    return f"{kind} {ns + '/' if ns else ''}{name} ({api})"


def dump(obj):
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False).splitlines(keepends=True)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    expected_path, actual_path = sys.argv[1:]
    expected, actual = load(expected_path), load(actual_path)
    problems = 0
    for key in sorted(expected.keys() - actual.keys(), key=str):
        print(f"missing from {actual_path}: {show(key)}")
        problems += 1
    for key in sorted(actual.keys() - expected.keys(), key=str):
        print(f"extra in {actual_path}: {show(key)}")
        problems += 1
    for key in sorted(expected.keys() & actual.keys(), key=str):
        if expected[key] != actual[key]:
            problems += 1
            print(f"differs: {show(key)}")
            sys.stdout.writelines(
                difflib.unified_diff(
                    dump(expected[key]),
                    dump(actual[key]),
                    fromfile=f"{expected_path}: {show(key)}",
                    tofile=f"{actual_path}: {show(key)}",
                )
            )
    if problems:
        print(f"{problems} object(s) differ between {expected_path} and {actual_path}")
        return 1
    print(f"same {len(expected)} objects")
    return 0


if __name__ == "__main__":
    sys.exit(main())
