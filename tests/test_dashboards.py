"""Dashboards and rules: generated JSON is what is committed, every query names exported metrics,
and promtool checks and unit-tests every rule."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.collectors.sim import SimCluster, load_scenario
from agent.core import AgentCore
from agent.exporter import AgentCollector, AgentStats
from agent.sampling import SamplingPolicy
from contract.events import ModelDemand
from dashboards.build import rendered
from dashboards.definitions import DASHBOARDS
from scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats
from stream.gpu_state import GpuTracker
from stream.metrics import StreamCollector, StreamStats

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "dashboards" / "prometheus" / "rules.yml"
METRIC = re.compile(r"\b(DCGM_FI_[A-Z_]+|gpuaware_[a-z_]+|gpuaware:[a-z_:0-9]+|up)\b")


def _exported_names() -> set[str]:
    """Every sample name the agent, a stream worker and the scheduler expose, from their real collectors."""
    scenario = load_scenario("xid")
    clock = [0.0]
    cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(0, 460):  # past the scenario's XID 79 at 450 s
        clock[0] = float(s)
        core.tick(float(s))
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats()))
    stats = StreamStats()
    stats.records["gpu.telemetry.v1"] += 1
    stats.dlq["gpu.telemetry.v1"] += 1
    stats.published["gpu.state.v1"] += 1
    stats.observe_latency(0.3)
    stats.demand = [ModelDemand("H100", 300, 1.0, 0.5, 1.5, 8.0)]
    tracker = GpuTracker("GPU-x")
    tracker._models()
    for v in range(30):
        tracker._learn_minute(float(v), 100.0)
    registry.register(StreamCollector(stats, lambda: [tracker], lambda: {("gpu.telemetry.v1", 0): 3}))
    sched = SchedulerStats()
    sched.decisions[("PLACE", "fits")] += 1
    sched.api_errors[("bind", 409)] += 1
    sched.extender_requests[("filter", 200)] += 1
    sched.waited("vision", 2, 3.0)
    snapshot = QueueSnapshot(pending={("vision", "high"): 1}, oldest_wait_s={("vision", "high"): 5.0},
                             gpus_used={"vision": 2.0}, gpus_quota={"vision": 1.0}, gpus_borrowed={"vision": 1.0},
                             jain=0.9, allocated_busy_ratio=0.5)
    registry.register(SchedulerCollector(sched, lambda: snapshot))
    text = generate_latest(registry).decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_committed_dashboards_are_what_the_code_generates() -> None:
    for path, text in rendered().items():
        assert path.exists(), f"{path.name} is not committed: run python -m dashboards.build"
        assert path.read_text() == text, f"{path.name} differs from the code: run python -m dashboards.build"


def test_every_query_names_only_metrics_that_are_exported() -> None:
    exported = _exported_names() | {r["record"] for r in _rules() if "record" in r} | {"up"}
    queries = [(uid, q) for uid, d in DASHBOARDS.items() for q in d.queries()]
    queries += [(r.get("alert") or r["record"], r["expr"]) for r in _rules()]
    assert len(queries) > 40
    missing = sorted({(where, name) for where, q in queries for name in METRIC.findall(q) if name not in exported})
    assert not missing, missing


def test_every_alert_has_severity_summary_description_and_a_runbook_section() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {"#" + re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"^## (.+)$", runbooks, flags=re.M)}
    alerts = [r for r in _rules() if "alert" in r]
    assert len(alerts) >= 11
    for r in alerts:
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
        ann = r["annotations"]
        assert ann["summary"] and ann["description"], r["alert"]
        assert ann["runbook_url"].startswith("docs/runbooks.md#"), r["alert"]
        assert "#" + ann["runbook_url"].split("#", 1)[1] in anchors, (r["alert"], ann["runbook_url"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(RULES.with_name("rules_test.yml"))],
                          capture_output=True, text=True, timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULES.with_name("rules_test.yml").read_text()))
    assert tested == {r["alert"] for r in _rules() if "alert" in r}  # every alert has firing and quiet cases
