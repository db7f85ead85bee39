"""The shipped inhibit_rules: one failure, one page. Checked against the labels the alerts really carry
(the promtool tests' expected alerts) and run in a real Alertmanager (Debian package
prometheus-alertmanager; skipped where it is not installed)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from gpuaware.local.alertmanager import INHIBIT_RULES as INHIBIT
from gpuaware.local.alertmanager import LocalAlertmanager, binary
from tests.support import RULES, prometheus_rules


def _names(matchers: list[str]) -> set[str]:
    (m,) = [re.fullmatch(r'alertname=~?"([^"]+)"', x) for x in matchers]
    return set(m.group(1).split("|"))


def _labels_of_each_alert() -> dict[str, list[set[str]]]:
    """alertname -> the label names of each alert the promtool tests expect to fire."""
    out: dict[str, list[set[str]]] = {}
    for test in yaml.safe_load(RULES.with_name("rules_test.yml").read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            for alert in case["exp_alerts"]:
                out.setdefault(case["alertname"], []).append(set(alert["exp_labels"]))
    return out


def test_inhibit_rules_name_real_alerts_and_labels_both_sides_carry() -> None:
    alerts = {r["alert"] for r in prometheus_rules() if "alert" in r}
    labels = _labels_of_each_alert()
    for rule in yaml.safe_load(INHIBIT.read_text())["inhibit_rules"]:
        sources, targets = _names(rule["source_matchers"]), _names(rule["target_matchers"])
        assert sources | targets <= alerts, (sources | targets) - alerts
        assert not sources & targets  # an alert muting its own kind would mute itself
        for name in sources | targets:
            for seen in labels[name]:
                assert set(rule["equal"]) <= seen, (name, rule["equal"], seen)


def _alert(name: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {"labels": {"alertname": name, "cluster": "a", **labels}, "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat()}


@pytest.mark.skipif(binary() is None, reason="Debian package prometheus-alertmanager not installed")
def test_one_failure_pages_once_per_gpu_node_and_cluster(tmp_path: Path) -> None:
    gpu1 = {"UUID": "GPU-1", "gpu": "1", "Hostname": "n1", "node": "n1"}
    gpu2 = {"UUID": "GPU-2", "gpu": "2", "Hostname": "n1", "node": "n1"}
    sent = [
        # GPU 1 fell off the bus: its band, verdict and XIDs follow.
        _alert("GpuLost", severity="critical", **gpu1),
        _alert("GpuHealthCritical", severity="critical", band="critical", **gpu1),
        _alert("GpuRemediationRecommended", severity="warning", verdict="critical", action="reboot_node", **gpu1),
        _alert("GpuXidBurst", severity="warning", **gpu1),
        # GPU 2 went critical on double-bit errors: one page, the critical band.
        _alert("GpuHealthCritical", severity="critical", band="critical", **gpu2),
        _alert("GpuDoubleBitEcc", severity="critical", **gpu2),
        _alert("GpuRemediationRecommended", severity="warning", verdict="critical", action="drain", **gpu2),
        # The same GPU UUID in another cluster is another GPU.
        _alert("GpuXidBurst", severity="warning", **{**gpu1, "cluster": "b"}),
        # n2's agent is down; n3's is up but silent.
        _alert("GpuawareAgentDown", severity="critical", node="n2", job="gpuaware-agent"),
        _alert("GpuawareAgentSilent", severity="warning", node="n2", Hostname="n2"),
        _alert("GpuawareAgentSilent", severity="warning", node="n3", Hostname="n3"),
        # No stream worker in cluster a: the feed outage and stale GPUs downstream do not page.
        _alert("GpuawareStreamWorkersDown", severity="critical"),
        _alert("GpuawareSchedulerFeedOutage", severity="critical"),
        _alert("GpuawareSchedulerStaleGpus", severity="warning"),
        # Cluster c's broker is down: the scheduler's feed is out and the agents cannot deliver; the feed pages.
        _alert("GpuawareSchedulerFeedOutage", severity="critical", cluster="c"),
        _alert("GpuawareAgentPublishErrors", severity="warning", cluster="c"),
        _alert("GpuawareSchedulerStaleGpus", severity="warning", cluster="c"),
    ]
    expected = {("GpuLost", "a", "GPU-1", ""), ("GpuHealthCritical", "a", "GPU-2", ""),
                ("GpuXidBurst", "b", "GPU-1", ""), ("GpuawareAgentDown", "a", "", "n2"),
                ("GpuawareAgentSilent", "a", "", "n3"), ("GpuawareStreamWorkersDown", "a", "", ""),
                ("GpuawareSchedulerFeedOutage", "c", "", "")}
    am = LocalAlertmanager(tmp_path / "am")
    am.start()
    try:
        deadline, active = time.monotonic() + 60, set()
        while time.monotonic() < deadline:
            assert am.running(), am.log_tail()
            try:
                am.call("/api/v2/alerts", sent)
                got = am.alerts()
            except OSError:
                time.sleep(0.5)  # still starting
                continue
            active = {(a["labels"]["alertname"], a["labels"]["cluster"], a["labels"].get("UUID", ""),
                       a["labels"].get("node", "") if a["labels"]["alertname"].startswith("GpuawareAgent") else "")
                      for a in got if a["status"]["state"] == "active"}
            if len(got) == len(sent) and active == expected:
                break
            time.sleep(0.5)  # the inhibitor takes each alert as it arrives
        assert active == expected, sorted(active ^ expected)
    finally:
        am.stop()
