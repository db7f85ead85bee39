"""Series the agent's ``/metrics`` carries per GPU: the cardinality an operator's Prometheus pays per GPU.

    python -m gpuaware.bench.agent_series            # 8 simulated GPUs per model, each schema
    python -m gpuaware.bench.agent_series --json

One simulated node of 8 GPUs per model, ticked 60 s in process, rendered as ``/metrics`` is served
(``AgentCollector``); a series is one sample line. Per GPU: the lines whose ``gpu`` label is that GPU
(DCGM families and gpuaware's own), the most over the node's GPUs; per node: the lines without a
``gpu`` label. Also what one MIG instance and one more pod sharing a GPU add, and the most labels
on any line.
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpuaware.agent.collectors.sim import SimCluster, load_scenario
from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentCollector, AgentStats, render
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract.dcgm import SCHEMAS, Schema

MODELS = ("H100", "A100", "L4")


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


def count(update: dict, schema: Schema = "dcgm-legacy", seconds: int = 60) -> dict[str, int]:
    """Series per GPU (the most over the node's GPUs), per node, and the most labels on one series."""
    core, cluster = ticked_core({"gpus_per_node": 8, **update}, seconds)
    registry = CollectorRegistry()
    registry.register(AgentCollector([core], AgentStats(), cluster.attribution(), schema))
    samples = [s for f in text_string_to_metric_families(render(registry).decode()) for s in f.samples]
    per_gpu = Counter(s.labels["gpu"] for s in samples if "gpu" in s.labels)
    return {"per_gpu": max(per_gpu.values()), "per_node": sum(1 for s in samples if "gpu" not in s.labels),
            "max_labels": max(len(s.labels) for s in samples)}


def measure() -> dict:
    out: dict = {}
    for model in MODELS:
        out[model] = {schema: count({"models": [model]}, schema) for schema in SCHEMAS}
    whole = out["A100"]["dcgm-legacy"]["per_gpu"]
    out["mig_instance_adds"] = count({"models": ["A100"], "mig": {0: ["3g.40gb"]}})["per_gpu"] - whole
    one, two = (count({"models": ["A100"], "shared": {0: n}})["per_gpu"] for n in (2, 3))
    out["shared_pod_adds"] = two - one
    return out


def main(argv: list[str]) -> int:
    result = measure()
    if "--json" in argv:
        print(json.dumps(result, indent=2))
        return 0
    for model in MODELS:
        for schema, r in result[model].items():
            print(f"{model:5} {schema:12} {r['per_gpu']:3} series per GPU, {r['per_node']:3} per node, "
                  f"at most {r['max_labels']} labels on one")
    print(f"one MIG instance adds {result['mig_instance_adds']}; one more pod sharing a GPU adds "
          f"{result['shared_pod_adds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
