"""What the chart's check_*.py scripts share: a rendering's objects, and checks that print each
verdict and count the failures."""
import sys

import yaml

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def rendered(path):
    """The objects of a `helm template` output, with its text."""
    with open(path) as f:
        text = f.read()
    return [d for d in yaml.safe_load_all(text) if d], text


def finish(what):
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print(f"all {what} checks pass")
