"""Helpers the agent's metrics tests share: an agent core ticked on a simulated node, its text and families."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render
from gpuaware.agent.sampling import SamplingPolicy

LEGACY_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def metrics_text(core: AgentCore, **kwargs) -> str:
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats(), **kwargs))
    return render(registry).decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def ticked_core(update: dict, seconds: int = 30) -> tuple[AgentCore, SimCluster]:
    """One node of the baseline scenario (with ``update``) after ``seconds`` one-second ticks."""
    scenario = load_scenario("baseline").model_copy(update={"nodes": 1, **update})
    clock = [0.0]
    cluster = SimCluster(scenario, clock=lambda: clock[0], epoch=0.0)
    core = AgentCore(cluster.node(0), SamplingPolicy(), clock=lambda: clock[0])
    for s in range(seconds):
        clock[0] = float(s)
        core.tick(float(s))
    return core, cluster
