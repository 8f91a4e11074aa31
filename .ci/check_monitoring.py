#!/usr/bin/env python3
"""Checks k8s/monitoring against the code: every series the Grafana dashboard
and the Prometheus alert rules query is one a muster service registers (a
string literal naming it in the Rust sources; a histogram's _bucket, _sum and
_count come with it, a counter's name ends in _total), and the dashboard is
well formed (unique panel ids, a Prometheus query in every panel, the
datasource a variable). `--self-test` checks that the check catches a series
nobody serves."""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SERIES = re.compile(r"\b((?:grpc|muster)_[a-z0-9_]+)")
SUFFIXES = ("_bucket", "_sum", "_count")


def served() -> set[str]:
    names = set()
    for path in ROOT.glob("services/**/*.rs"):
        names.update(re.findall(r'"((?:grpc|muster)_[a-z0-9_]+)"', path.read_text()))
    return names


def queried(dashboard: dict, rules: dict) -> dict[str, str]:
    """Every series queried, with where."""
    found = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in SERIES.findall(target["expr"]):
                found.setdefault(name, f"dashboard panel {panel['title']!r}")
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        for name in SERIES.findall(text):
            found.setdefault(name, f"dashboard variable {variable['name']!r}")
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in SERIES.findall(rule["expr"]):
                found.setdefault(name, f"alert {rule['alert']}")
    return found


def problems(dashboard: dict, rules: dict, names: set[str]) -> list[str]:
    found = []
    for series, where in sorted(queried(dashboard, rules).items()):
        if series.startswith("grpc_") and series in {"grpc_service", "grpc_method", "grpc_code", "grpc_type"}:
            continue  # labels, not series
        base = next((series[: -len(suffix)] for suffix in SUFFIXES if series.endswith(suffix)), series)
        if series not in names and base not in names:
            found.append(f"{where} queries {series}, which no muster service serves")
    ids = [panel["id"] for panel in dashboard["panels"]]
    if len(ids) != len(set(ids)):
        found.append(f"the dashboard's panel ids repeat: {ids}")
    for panel in dashboard["panels"]:
        if not panel.get("targets") or panel["datasource"].get("uid") != "${datasource}":
            found.append(f"panel {panel['title']!r} has no query or a fixed datasource")
    return found


def main() -> int:
    monitoring = ROOT / "k8s/monitoring"
    dashboard = json.loads((monitoring / "muster-dashboard.json").read_text())
    rules = yaml.safe_load((monitoring / "muster-alerts.yaml").read_text())
    names = served()
    if "--self-test" in sys.argv:
        broken = json.loads(json.dumps(dashboard))
        broken["panels"][0]["targets"][0]["expr"] = "rate(muster_nothing_total[5m])"
        found = problems(broken, rules, names)
        if not any("muster_nothing_total" in problem for problem in found):
            print("check_monitoring: the self-test's unknown series went unnoticed", file=sys.stderr)
            return 1
        print("check_monitoring: self-test passed")
        return 0
    found = problems(dashboard, rules, names)
    for problem in found:
        print(f"check_monitoring: {problem}", file=sys.stderr)
    if found:
        return 1
    count = len(queried(dashboard, rules))
    print(f"check_monitoring: {len(dashboard['panels'])} panels and {sum(len(g['rules']) for g in rules['groups'])} alerts query {count} series, all served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
