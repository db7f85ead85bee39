"""A drill: the real agent, stream worker and scheduler scraped by a real Prometheus (through the shipped
PodMonitors' scrape configs) that sends to a real Alertmanager with the shipped inhibit rules and the
shipped alert rules, `for:` as shipped. Each component killed in turn pages once, for its own cause: the
stream worker, the agent, then the scheduler (the leader, its only replica) on the session's broker; and,
on a broker of the test's own, the broker. Debian packages `prometheus` and `prometheus-alertmanager`;
skipped where they are not installed, failed under ``CI=true``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuaware.local.alertmanager import LocalAlertmanager, binary
from gpuaware.local.broker import BrokerError, BrokerSettings, LocalBroker
from gpuaware.local.fake_apiserver import make_node
from gpuaware.local.processes import ChildProcess, free_port
from gpuaware.local.prometheus import LocalPrometheus, available
from gpuaware.local.stream_workers import StreamWorkerProcess, worker_env
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.real_kube import Kube
from tests.support import missing_part

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(autouse=True)
def _prometheus_and_alertmanager() -> None:
    if not available() or binary() is None:
        missing_part("Debian packages prometheus and prometheus-alertmanager not installed")

JOBS = {"gpuaware-agent", "gpuaware-stream", "gpuaware-scheduler"}
PIPELINE_PAGES = {"GpuawareStreamWorkersDown", "GpuawareAgentDown", "GpuawareSchedulerDown",
                  "GpuawareSchedulerFeedOutage", "GpuawareSchedulerNoLeader"}


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


@dataclass
class Drill:
    agent: ChildProcess
    stream: StreamWorkerProcess
    scheduler: ChildProcess
    prometheus: LocalPrometheus
    alertmanager: LocalAlertmanager
    children: list[ChildProcess]  # those that must stay up
    baseline: set[str]  # what pages in this simulated cluster before the drill

    def kill(self, child: ChildProcess) -> None:
        child.kill()
        self.children.remove(child)

    def until(self, what: str, cond: Callable[[], object], timeout_s: float) -> None:
        _until(what, cond, timeout_s, self.children)

    def paging(self) -> set[str]:
        return self.alertmanager.active() - self.baseline

    def pages_once(self, expected: set[str]) -> None:
        """Exactly ``expected`` pages beyond the baseline, one alert of each name (one cluster, one node)."""
        paging, firing = self.paging(), self.prometheus.firing()
        assert paging == expected, (paging, firing)
        names = [a["labels"]["alertname"] for a in self.alertmanager.alerts() if a["status"]["state"] == "active"]
        assert all(names.count(n) == 1 for n in expected), names

    def report(self, step: str) -> None:
        print(step, {"paging": sorted(self.paging()), "firing_in_prometheus": sorted(self.prometheus.firing()),
                     "baseline": sorted(self.baseline)})


@contextmanager
def drill(kafka: KafkaSettings, tmp_path: Path, unique: str, kube: Kube,
          scheduler_env: dict[str, str] | None = None) -> Iterator[Drill]:
    """One simulated node with two GPUs, its agent, a stream worker and the scheduler, all scraped and evaluated;
    yields once GPU state reaches the scheduler; stops what is left afterwards."""
    (tmp_path / "drill.yaml").write_text(f"name: drill-{unique}\nseed: 3\nnodes: 1\ngpus_per_node: 2\n"
                                         f"models: [H100]\nnode_prefix: drill-{unique}\nfaults: []\n")
    kube.create("nodes", make_node(f"drill-{unique}-000", gpus=2))
    agent_port, scheduler_port = free_port(), free_port()
    agent = ChildProcess("agent", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "agent",
                                   "--collector", "sim", "--scenario", str(tmp_path / "drill.yaml"),
                                   "--spool-dir", str(tmp_path / "spool"), "--metrics-port", str(agent_port)],
                         tmp_path / "agent.log", {**worker_env(kafka), "GPUAWARE_AGENT__CORDON_POLL_S": "0"})
    stream = StreamWorkerProcess(kafka, f"drill-{unique}", tmp_path, "stream", node_identity="off")
    scheduler = ChildProcess("scheduler", [sys.executable, "-m", "gpuaware", "--log-level", "warning", "scheduler",
                                           "--metrics-port", str(scheduler_port), "--extender-port", "0"],
                             tmp_path / "scheduler.log",
                             {**worker_env(kafka), "KUBECONFIG": str(kube.accounts["gpuaware-scheduler"]),
                              **(scheduler_env or {})})
    alertmanager = LocalAlertmanager(tmp_path / "alertmanager")
    prometheus = LocalPrometheus(tmp_path / "prometheus", {"gpuaware-agent": [agent_port],
                                                           "gpuaware-stream": [stream.metrics_port],
                                                           "gpuaware-scheduler": [scheduler_port]},
                                 alertmanager_port=alertmanager.port)
    children = [alertmanager, prometheus, agent, stream, scheduler]
    try:
        for child in children:
            child.start()
        _until("every component scraped", lambda: {r["metric"]["job"] for r in prometheus.query("up == 1")} >= JOBS,
               240, children)
        # The scheduler holds GPU state from the stream, so the stream's death silences its feed.
        _until("GPU state reached the scheduler",
               lambda: prometheus.query("gpuaware_scheduler_feed_records_total > 0"), 240, children)
        baseline = alertmanager.active()
        assert not baseline & PIPELINE_PAGES, baseline
        yield Drill(agent, stream, scheduler, prometheus, alertmanager, list(children), baseline)
    finally:
        for child in reversed(children):
            if child.running():
                child.stop()


def test_killing_each_component_pages_once_for_its_cause(kafka_settings: KafkaSettings, tmp_path: Path,
                                                         unique: str, kube: Kube) -> None:
    with drill(kafka_settings, tmp_path, unique, kube) as d:
        d.kill(d.stream)  # no stream worker left: one page, not one per symptom downstream
        d.until("GpuawareStreamWorkersDown pages", lambda: "GpuawareStreamWorkersDown" in d.alertmanager.active(), 180)
        d.pages_once({"GpuawareStreamWorkersDown"})
        # 90 s later the scheduler's feed is out too: Prometheus fires it, the inhibit rules keep it from paging.
        d.until("GpuawareSchedulerFeedOutage fires", lambda: "GpuawareSchedulerFeedOutage" in d.prometheus.firing(),
                300)
        d.until("Alertmanager holds it", lambda: "GpuawareSchedulerFeedOutage" in
                {a["labels"]["alertname"] for a in d.alertmanager.alerts()}, 60)
        d.pages_once({"GpuawareStreamWorkersDown"})
        d.report("stream worker killed")

        d.kill(d.agent)  # the node's agent too: its own page
        d.until("GpuawareAgentDown pages", lambda: "GpuawareAgentDown" in d.alertmanager.active(), 240)
        d.pages_once({"GpuawareStreamWorkersDown", "GpuawareAgentDown"})
        assert "GpuawareSchedulerFeedOutage" in d.prometheus.firing()
        d.report("agent killed")

        # The scheduler last: its only replica, so the leader. With no replica up, no leader series is left
        # either: GpuawareSchedulerDown pages, not GpuawareSchedulerNoLeader (which it would mute).
        assert [r["value"][1] for r in d.prometheus.query("gpuaware_scheduler_leader")] == ["1"]
        d.kill(d.scheduler)
        d.until("GpuawareSchedulerDown pages", lambda: "GpuawareSchedulerDown" in d.alertmanager.active(), 180)
        d.pages_once({"GpuawareStreamWorkersDown", "GpuawareAgentDown", "GpuawareSchedulerDown"})
        d.report("scheduler killed")


def test_killing_the_broker_pages_once_for_the_feed(tmp_path: Path, unique: str, kube: Kube) -> None:
    """The broker of the test's own (the embedded one, so the session's broker stays up for other tests). The
    scheduler's state feed goes silent: GpuawareSchedulerFeedOutage pages, alone. ``stale_after_s`` is 30 s
    here instead of 90 s; every `for:` is as shipped."""
    try:
        broker = LocalBroker(BrokerSettings(port=0), run_dir=tmp_path / "broker").start()
    except BrokerError as exc:
        missing_part(str(exc))
    try:
        kafka = broker.kafka_settings(session_timeout_ms=6000)
        with drill(kafka, tmp_path, unique, kube, {"GPUAWARE_SCHEDULER__STALE_AFTER_S": "30"}) as d:
            broker.kill()
            d.until("GpuawareSchedulerFeedOutage pages",
                    lambda: "GpuawareSchedulerFeedOutage" in d.alertmanager.active(), 240)
            d.pages_once({"GpuawareSchedulerFeedOutage"})
            d.report("broker killed")
    finally:
        broker.stop()
