"""The Prometheus rules: each alert is annotated and has a runbook section; promtool checks and unit-tests them."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from gpuaware.dashboards.build import RUNBOOK_URL, rules_path
from gpuaware.dashboards.definitions import VARIANTS
from tests.support import REPO, RULES, prometheus_rules


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {"#" + re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"^## (.+)$", runbooks, flags=re.M)}
    alerts = [r for r in prometheus_rules() if "alert" in r]
    assert len(alerts) >= 11
    for r in alerts:
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], r["alert"]
        assert ann["runbook_url"].startswith(RUNBOOK_URL + "#"), r["alert"]  # absolute: it is opened from a page
        assert "#" + ann["runbook_url"].split("#", 1)[1] in anchors, (r["alert"], ann["runbook_url"])
        (section,) = re.findall(rf"^## {r['alert']}\n(.*?)(?=^## |\Z)", runbooks, flags=re.M | re.S)
        for part in ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Mitigation.**"):
            assert part in section, (r["alert"], part)
        # Something to run: a command or a query, not only prose.
        assert re.search(r"`(kubectl|nvidia-smi|dcgmi|crictl|kafka-|sum |max |gpuaware_|DCGM_|up\{)[^`]*`", section), \
            r["alert"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(RULES.with_name("rules_test.yml"))],
                          capture_output=True, text=True, timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES.with_name("rules_test.yml").read_text()))
    assert tested == {r["alert"] for r in prometheus_rules() if "alert" in r}  # every alert has firing and quiet cases


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
@pytest.mark.parametrize("folder", [f for f in VARIANTS if f])
def test_promtool_checks_each_schema_and_prefix_variant_of_the_rules(folder: str) -> None:
    path = rules_path(folder)
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


AGGREGATION = re.compile(r"\b(sum|min|max|avg|count|stddev|stdvar|topk|bottomk|quantile|group)\s*"
                         r"(?:(by|without)\s*\(([^)]*)\))?\s*\(")
# Series that do not get the PodMonitors' cluster label (kube-state-metrics', kube-scheduler's): these compare
# within one Prometheus and are meant for each cluster's own. absent() has no series to carry a label.
WHOLE_PROMETHEUS = {"GpuNodeWithoutAgent", "SchedulerExtenderBypassed"}


def test_no_rule_aggregates_the_cluster_away() -> None:
    """One Prometheus may hold several clusters: every aggregation keeps `cluster`, every join matches on it."""
    wrong = []
    rules = prometheus_rules()
    for r in rules:
        name = r.get("alert") or r["record"]
        if name in WHOLE_PROMETHEUS:
            continue
        for op, modifier, labels in AGGREGATION.findall(r["expr"]):
            names = {x.strip() for x in labels.split(",")}
            if modifier == "without" and "cluster" not in names:
                continue
            if modifier != "by" or "cluster" not in names:
                wrong.append((name, f"{op} {modifier}({labels})"))
        wrong += [(name, f"on ({m})") for m in re.findall(r"\bon\s*\(([^)]*)\)", r["expr"])
                  if "cluster" not in {x.strip() for x in m.split(",")}]
    assert not wrong, wrong
    assert {r.get("alert") for r in rules} >= WHOLE_PROMETHEUS


def test_docs_list_every_alert_and_only_those_with_their_severity() -> None:
    """docs/dashboards.md's alert table is the rules: each alert once with its severity, none that is gone,
    and the counts its text gives."""
    page = (REPO / "docs" / "dashboards.md").read_text()
    table = page.split("\n## Alerts\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\|[^|]*\| (\w+) \| (critical|warning|info) \| [^|]+ \|$", table, flags=re.M)
    rules = prometheus_rules()
    alerts = {r["alert"]: r["labels"]["severity"] for r in rules if "alert" in r}
    assert sorted(rows) == sorted(alerts.items())
    records = sum("record" in r for r in rules)
    assert f"{records} recording rules and {len(alerts)} alerts" in table
