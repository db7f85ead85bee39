"""Helpers the agent's metrics tests share: an agent core ticked on a simulated node, its text and families."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render

LEGACY_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def metrics_text(core: AgentCore, **kwargs) -> str:
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats(), **kwargs))
    return render(registry).decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


