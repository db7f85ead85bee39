"""Alert rules against the labels the shipped PodMonitors really give targets: prometheus-operator's scrape
configs for them (gpuaware.deploy.scrape), applied by a real Prometheus (Debian package `prometheus`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from gpuaware.agent.exporter import serve
from gpuaware.deploy.scrape import local_scrape_configs, operator_scrape_configs
from gpuaware.local.processes import free_port
from gpuaware.local.prometheus import LocalPrometheus, available
from tests.support import RULES, missing_part, prometheus_rules

WORKLOADS = ("gpuaware-agent", "gpuaware-stream", "gpuaware-scheduler")


class _Workload:
    """One GPU series attributed to a workload's pod, as the agent exports it."""

    def collect(self):
        fam = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "util", labels=["gpu", "pod", "namespace", "container"])
        fam.add_metric(["0", "train-0", "vision", "main"], 50.0)
        yield fam


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_the_operator_scrape_configs_of_the_shipped_monitors_are_valid(tmp_path: Path) -> None:
    configs = operator_scrape_configs()
    assert [c["job_name"] for c in configs] == [f"podMonitor/gpuaware/{w}/0" for w in WORKLOADS]
    assert all(c["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["gpuaware"]}}] for c in configs)
    # Debian's Prometheus is built without Kubernetes discovery: check the same configs with static targets.
    local = local_scrape_configs({w: [9400] for w in WORKLOADS})
    assert [c["relabel_configs"] for c in local] == [c["relabel_configs"] for c in configs]
    (tmp_path / "prometheus.yml").write_text(json.dumps({"scrape_configs": local}))
    check = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def _up_series_in_promtool_tests() -> list[dict[str, str]]:
    tests = yaml.safe_load(RULES.with_name("rules_test.yml").read_text())["tests"]
    out = []
    for test in tests:
        for s in test.get("input_series", []):
            if s["series"].startswith("up{"):
                out.append(dict(re.findall(r'(\w+)="([^"]*)"', s["series"])))
    return out


def test_rules_select_the_jobs_and_labels_the_shipped_pod_monitors_produce(tmp_path: Path) -> None:
    if not available():
        missing_part("Debian package prometheus not installed")
    registry = CollectorRegistry()
    registry.register(_Workload())
    port = free_port()
    serve(registry, "127.0.0.1", port)
    prometheus = LocalPrometheus(tmp_path / "prometheus", {w: [port] for w in WORKLOADS})
    prometheus.start()
    try:
        deadline, rows = time.monotonic() + 90, []
        while time.monotonic() < deadline and len(rows) < len(WORKLOADS):
            assert prometheus.running(), prometheus.log_tail()
            try:
                rows = prometheus.query("up == 1")
            except OSError:
                rows = []  # still starting
            time.sleep(0.5)  # a scrape interval is 1 s
        produced = {r["metric"]["job"]: r["metric"] for r in rows}
        assert set(produced) == set(WORKLOADS), produced
        agent = produced["gpuaware-agent"]
        assert agent["namespace"] == "gpuaware" and agent["container"] == "agent" and agent["endpoint"] == "metrics"
        assert agent["node"] and agent["cluster"], agent
        # Every job a rule names is one the monitors produce (the operator's default would be namespace/name).
        named = {j for r in prometheus_rules() for j in re.findall(r'\bjob="([^"]+)"', r["expr"])}
        assert named and named <= set(produced), named - set(produced)
        # The promtool tests feed exactly the label names a target gets.
        ups = _up_series_in_promtool_tests()
        assert ups
        for labels in ups:
            assert labels["job"] in produced, labels
            assert set(labels) == set(produced[labels["job"]]) - {"__name__"}, (labels, produced[labels["job"]])
        # honorLabels: the workload's pod stays `pod` on the agent's series (not exported_pod).
        (util,) = prometheus.query('DCGM_FI_DEV_GPU_UTIL{job="gpuaware-agent"}')
        assert util["metric"]["pod"] == "train-0" and "exported_pod" not in util["metric"], util
    finally:
        prometheus.stop()
