"""The cluster's tooling in `gpuaware up`: it answers a node's ``GPUMaintenanceRequired: GPUResetRequired``
condition by resetting those GPUs, as NVSentinel's fault remediation or an operator's runbook would.

The scheduler hands a reset off (it has no hands on the GPU, docs/health.md "The remediation chain"); here
the simulator does it: the reset ends the faults a reset clears. Like NVML, the simulated GPU does not tell
the agent; the tool stamps the reset in the node's ``gpuaware.io/gpu-resets`` annotation, as a site's reset
job must, and the agent reads it there (gpuaware/agent/cordons.py) and judges the GPU afresh, so the chain can run
on to validation and return to service. Only resets: a reboot or a service request is left
waiting, as it would be for a person. Each request is answered once, until the condition clears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gpuaware.agent.collectors.sim import SimCluster
from gpuaware.contract import annotations
from gpuaware.contract.events import HealthAction
from gpuaware.local.kube_cluster import LocalCluster
from gpuaware.scheduler.kube import node_conditions

log = logging.getLogger(__name__)


class ResetTool:
    def __init__(self, kube: LocalCluster, sim: SimCluster):
        self.kube, self.sim = kube, sim
        self.names = {sim.scenario.node_name(n): n for n in range(sim.scenario.nodes)}
        self.done: set[tuple[str, int]] = set()  # answered, the condition still asking
        self.resets: list[tuple[str, int]] = []

    def once(self) -> None:
        asking: set[tuple[str, int]] = set()
        nodes = self.kube.nodes()
        for node in nodes:
            name = node["metadata"]["name"]
            req = node_conditions.requested(node)
            if name not in self.names or req is None or req[0] != HealthAction.RESET_GPU:
                continue
            asking.update((name, g) for g in req[1])
        stamps: dict[str, dict[int, float]] = {}
        for name, gpu in sorted(asking - self.done):
            log.info("resetting GPU %d of %s (GPUResetRequired)", gpu, name)
            self.sim.node(self.names[name]).reset_gpu(gpu, announce=False)
            self.resets.append((name, gpu))
            stamps.setdefault(name, {})[gpu] = time.time()
        for name, new in stamps.items():
            node = next(n for n in nodes if n["metadata"]["name"] == name)
            try:
                done = annotations.gpu_resets(node)
            except ValueError:  # someone else's bad write: ours replaces it
                done = {}
            self.kube.annotate_node(name, {annotations.ANN_GPU_RESETS: annotations.gpu_resets_value({**done, **new})})
        self.done = asking

    async def run(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.once)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
