#!/usr/bin/env python3
"""Counts the results of tests/e2e/run kubernetes-suite from ginkgo's JSON reports.

    count.py RESULTS_DIR PART...      (reads RESULTS_DIR/PART.json)

A test the focus or skip left out is not counted; a test that started and skipped itself (a
capability the driver does not claim, a pattern that does not apply) is, with its reason, in
RESULTS_DIR/skips.txt (reasons counted, most frequent first). Prints the failed tests, then
"N passed, N failed, N skipped"; exits 1 when a test failed or a part has no report.
"""
import collections
import json
import os
import re
import sys

FAILED = {"failed", "panicked", "timedout", "interrupted", "aborted"}


def main():
    results, parts = sys.argv[1], sys.argv[2:]
    passed, failed, skipped = 0, [], collections.Counter()
    missing = []
    for part in parts:
        path = os.path.join(results, part + ".json")
        if not os.path.exists(path):
            missing.append(part)
            continue
        with open(path) as f:
            reports = json.load(f)
        for report in reports:
            for spec in report.get("SpecReports") or []:
                if spec.get("LeafNodeType") != "It":
                    continue
                state = spec.get("State")
                full = " ".join((spec.get("ContainerHierarchyTexts") or []) + [spec.get("LeafNodeText", "")])
                if state == "passed":
                    passed += 1
                elif state in FAILED:
                    failed.append(f"[{part}] {full}")
                elif state == "skipped":
                    message = (spec.get("Failure") or {}).get("Message", "").strip()
                    if message:
                        # One reason per line: the driver's name and sizes vary, the reason not.
                        skipped[re.sub(r"\s+", " ", message.splitlines()[0])] += 1
    with open(os.path.join(results, "skips.txt"), "w") as f:
        for reason, count in skipped.most_common():
            f.write(f"{count:5d}  {reason}\n")
    for test in failed:
        print("FAILED " + test)
    for part in missing:
        print(f"no report for the {part} tests (see {os.path.join(results, part + '.log')})")
    print(f"{passed} passed, {len(failed)} failed, {sum(skipped.values())} skipped")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
