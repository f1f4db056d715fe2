#!/usr/bin/env python3
"""Every alert of a rule file has, in a promtool test file, a case where it fires (exp_alerts not
empty) and one where it stays quiet (exp_alerts empty).

    coverage.py RULES.yaml TESTS.yaml
"""
import sys

import yaml

rules_path, tests_path = sys.argv[1:]
rules = yaml.safe_load(open(rules_path))
alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
fires, quiet = set(), set()
for test in yaml.safe_load(open(tests_path))["tests"]:
    for case in test.get("alert_rule_test", []):
        (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
problems = [f"{a}: no test where it fires" for a in alerts if a not in fires]
problems += [f"{a}: no test where it stays quiet" for a in alerts if a not in quiet]
problems += [f"{a}: tested, but no such alert in {rules_path}" for a in sorted((fires | quiet) - set(alerts))]
for p in problems:
    print(p)
print(f"{len(alerts)} alerts; {len(problems)} without both cases")
sys.exit(1 if problems else 0)
