"""The simulated cluster `gpuaware up` schedules on, and the openb pods it is given."""

from __future__ import annotations

from typing import Any

from gpuaware.agent.collectors.sim import load_scenario
from gpuaware.local.stack_scheduler import PodLoad, cluster_objects


class _Recorder:
    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []

    def create(self, kind: str, obj: dict[str, Any]) -> None:
        self.pods.append(obj)


def _gib(quantity: str) -> float:
    for suffix, per_gib in (("Gi", 1.0), ("Mi", 1 / 1024), ("Ti", 1024.0)):
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * per_gib
    raise ValueError(quantity)


def _cpus(quantity: str) -> float:
    return float(quantity.removesuffix("m")) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_demo_nodes_run_out_of_gpus_before_cpu_or_memory():
    """Else most decisions are UNSCHEDULABLE "insufficient cpu" and the demo shows no GPU placement."""
    scenario = load_scenario("demo")
    nodes, _ = cluster_objects(scenario)
    recorder = _Recorder()
    load = PodLoad(recorder, scenario.nodes * scenario.gpus_per_node, seed=scenario.seed)  # type: ignore[arg-type]
    for seq in range(3000):
        load.submit(seq)
    # What the pods hold over their run time, per GPU they hold (a GPU-second each GPU-second of load).
    gpu = cpu = mem = 0.0
    for pod in recorder.pods:
        ann = pod["metadata"]["annotations"]
        resources = pod["spec"]["containers"][0]["resources"]
        run = float(ann["gpuaware.io/duration-s"])
        gpus = (int(ann["gpuaware.io/gpu-milli"]) / 1000 if "gpuaware.io/gpu-milli" in ann
                else int(resources["limits"].get("nvidia.com/gpu", 0)))
        gpu += gpus * run
        cpu += _cpus(resources["requests"]["cpu"]) * run
        mem += _gib(resources["requests"]["memory"]) * run
    assert {(n["status"]["allocatable"]["cpu"], n["status"]["allocatable"]["memory"]) for n in nodes} == {
        (nodes[0]["status"]["allocatable"]["cpu"], nodes[0]["status"]["allocatable"]["memory"])}
    alloc = nodes[0]["status"]["allocatable"]
    node_gpus = int(alloc["nvidia.com/gpu"])
    # The load asks for more GPUs than the cluster has (``load.load`` > 1: the queue, preemption); the CPU
    # and memory that come with them must fit, with room left for imperfect packing.
    assert load.load > 1
    assert load.load * cpu / gpu <= 0.9 * _cpus(alloc["cpu"]) / node_gpus
    assert load.load * mem / gpu <= 0.9 * _gib(alloc["memory"]) / node_gpus
