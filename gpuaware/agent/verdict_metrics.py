"""The verdict metric families of the agent's ``/metrics`` (docs/health.md), built at scrape time.

Kept out of ``gpuaware.agent.exporter`` so the DCGM families there and the verdicts here change apart. Both
families are state sets: one series per GPU (node) at 1, labelled with its verdict and action.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuaware.agent.core import AgentCore


def verdict_families(cores: Iterable[AgentCore], node_label: str = "Hostname") -> Iterator[Metric]:
    """``node_label`` follows the metrics schema (``Hostname`` legacy, ``hostname`` in dcgm-exporter 4.9)."""
    gpu = GaugeMetricFamily(
        "gpuaware_gpu_health_verdict",
        "1 for the GPU's graded verdict (pass, info, warning, critical, unknown) and recommended action.",
        labels=["gpu", "UUID", node_label, "modelName", "verdict", "action"])
    node = GaugeMetricFamily("gpuaware_node_health_verdict",
                             "1 for the node's verdict (its worst GPU's) and recommended action.",
                             labels=[node_label, "verdict", "action"])
    for core in cores:
        for t in core.tracks:
            d, v = t.device, t.verdict
            gpu.add_metric([str(d.index), d.uuid, core.node, d.model, v.verdict.value.lower(),
                            v.action.value.lower()], 1.0)
        n = core.verdicts.node()
        node.add_metric([core.node, n.verdict.value.lower(), n.action.value.lower()], 1.0)
    yield gpu
    yield node
