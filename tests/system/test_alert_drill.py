"""A drill: the real agent, stream worker and scheduler scraped by a real Prometheus (through the shipped
PodMonitors' scrape configs) that sends to a real Alertmanager with the shipped inhibit rules; each
component killed in turn pages once, for its own cause. Debian packages `prometheus` and
`prometheus-alertmanager`; skipped where they are not installed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuaware.local.alertmanager import LocalAlertmanager, binary
from gpuaware.local.fake_apiserver import make_node
from gpuaware.local.processes import ChildProcess, free_port
from gpuaware.local.prometheus import LocalPrometheus, available
from gpuaware.local.stream_workers import StreamWorkerProcess, worker_env
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.real_kube import Kube

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not available() or binary() is None,
                                 reason="Debian packages prometheus and prometheus-alertmanager not installed")]

JOBS = {"gpuaware-agent", "gpuaware-stream", "gpuaware-scheduler"}


def _until(what: str, cond: Callable[[], object], timeout_s: float, children: list[ChildProcess]) -> None:
    """Wait for ``cond``; ``children`` must stay up meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in children:
            assert child.running(), f"{child.name} exited:\n{child.log_tail()}"
        try:
            if cond():
                return
        except OSError:
            pass  # a server still starting
        time.sleep(1)  # the scrape and evaluation interval
    logs = "\n".join(f"{c.name}: {c.log_tail()}" for c in children)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{logs}")


def test_killing_each_component_pages_once_for_its_cause(kafka_settings: KafkaSettings, tmp_path: Path,
                                                         unique: str, kube: Kube) -> None:
    (tmp_path / "drill.yaml").write_text(f"name: drill-{unique}\nseed: 3\nnodes: 1\ngpus_per_node: 2\n"
                                         f"models: [H100]\nnode_prefix: drill-{unique}\nfaults: []\n")
    kube.create("nodes", make_node(f"drill-{unique}-000", gpus=2))
    agent_port, scheduler_port = free_port(), free_port()
    agent = ChildProcess("agent", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "agent",
                                   "--collector", "sim", "--scenario", str(tmp_path / "drill.yaml"),
                                   "--spool-dir", str(tmp_path / "spool"), "--metrics-port", str(agent_port)],
                         tmp_path / "agent.log", {**worker_env(kafka_settings), "GPUAWARE_AGENT__CORDON_POLL_S": "0"})
    stream = StreamWorkerProcess(kafka_settings, f"drill-{unique}", tmp_path, "stream", node_identity="off")
    scheduler = ChildProcess("scheduler", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "scheduler",
                                           "--metrics-port", str(scheduler_port), "--extender-port", "0"],
                             tmp_path / "scheduler.log",
                             {**worker_env(kafka_settings), "KUBECONFIG": str(kube.accounts["gpuaware-scheduler"])})
    alertmanager = LocalAlertmanager(tmp_path / "alertmanager")
    prometheus = LocalPrometheus(tmp_path / "prometheus", {"gpuaware-agent": [agent_port],
                                                           "gpuaware-stream": [stream.metrics_port],
                                                           "gpuaware-scheduler": [scheduler_port]},
                                 alertmanager_port=alertmanager.port)
    children = [alertmanager, prometheus, agent, stream, scheduler]
    for child in children:
        child.start()
    try:
        _until("every component scraped", lambda: {r["metric"]["job"] for r in prometheus.query("up == 1")} >= JOBS,
               180, children)
        # The scheduler holds GPU state from the stream, so the stream's death silences its feed.
        _until("GPU state reached the scheduler",
               lambda: prometheus.query("gpuaware_scheduler_feed_records_total > 0"), 180, children)
        baseline = alertmanager.active()  # what pages in this simulated cluster before the drill
        assert not baseline & {"GpuawareStreamWorkersDown", "GpuawareAgentDown", "GpuawareSchedulerFeedOutage"}

        stream.kill()  # no stream worker left: one page, not one per symptom downstream
        children.remove(stream)
        _until("GpuawareStreamWorkersDown pages", lambda: "GpuawareStreamWorkersDown" in alertmanager.active(),
               180, children)
        assert alertmanager.active() - baseline == {"GpuawareStreamWorkersDown"}
        # 90 s later the scheduler's feed is out too: Prometheus fires it, the inhibit rules keep it from paging.
        _until("GpuawareSchedulerFeedOutage fires", lambda: "GpuawareSchedulerFeedOutage" in prometheus.firing(),
               300, children)
        _until("Alertmanager holds it", lambda: "GpuawareSchedulerFeedOutage" in
               {a["labels"]["alertname"] for a in alertmanager.alerts()}, 60, children)
        assert alertmanager.active() - baseline == {"GpuawareStreamWorkersDown"}

        agent.kill()  # the node's agent too: its own page
        children.remove(agent)
        _until("GpuawareAgentDown pages", lambda: "GpuawareAgentDown" in alertmanager.active(), 240, children)
        paging, firing = alertmanager.active() - baseline, prometheus.firing()
        assert paging == {"GpuawareStreamWorkersDown", "GpuawareAgentDown"}, (paging, firing)
        assert "GpuawareSchedulerFeedOutage" in firing
        # Each cause pages once: one alert of each name, whatever else Prometheus fires and the rules mute.
        names = [a["labels"]["alertname"] for a in alertmanager.alerts() if a["status"]["state"] == "active"]
        assert names.count("GpuawareStreamWorkersDown") == names.count("GpuawareAgentDown") == 1, names
        print({"paging": sorted(paging), "firing_in_prometheus": sorted(firing), "baseline": sorted(baseline)})
    finally:
        for child in (scheduler, stream, agent, prometheus, alertmanager):
            if child.running():
                child.stop()
