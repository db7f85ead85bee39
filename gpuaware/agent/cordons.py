"""The agent's side of a GPU cordon: the node's ``gpuaware.io/cordoned-gpus`` annotation.

The scheduler cordons a GPU (not the node) when the stream reports it critical, by naming it in
that annotation; an operator may edit it too. The agent reads its node's annotation every
``cordon_poll_s`` (a GET the DaemonSet's RBAC allows) and honours it: a cordoned GPU is sampled
at the policy's floor while it drains and is looked at, and ``gpuaware_gpu_cordoned`` shows it.
A failed read keeps the last known cordons and is counted, never fatal.

The same round learns GPU resets: NVML does not announce a reset done by another process, so the
tooling that reset a GPU (answering ``GPUMaintenanceRequired: GPUResetRequired``) stamps it in the
node's ``gpuaware.io/gpu-resets`` annotation, {GPU index: unix time}. A stamp the agent has not seen,
no older than the agent itself (whose state is fresh anyway), makes it judge that GPU afresh
(``AgentCore.gpu_reset``); a GPU with no new stamp keeps its verdict.

The same round acknowledges power caps: when the caps NVML accepted on this node differ from its
``gpuaware.io/power-caps-applied`` annotation, the agent writes them there. Its ServiceAccount may
patch only that annotation, and only on the node its token was issued on (an admission policy on
the token's node claim, deploy/base/agent/rbac.yaml).

And it publishes which pods hold which of its GPUs, from the kubelet's PodResources view, in the node's
``gpuaware.io/gpu-pods`` annotation (written only when it changes; the same admission policy allows that key
too): the scheduler knows the GPUs of the pods it placed, not those of other schedulers' pods, and its
remediation chain must move those off a failing GPU before a reset is requested.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from gpuaware.agent.core import AgentCore
from gpuaware.agent.exporter import AgentStats
from gpuaware.agent.podresources import PodResourcesWatcher
from gpuaware.contract import annotations
from gpuaware.plumbing.kube.reach import api_configured

log = logging.getLogger(__name__)


class CordonWatcher:
    def __init__(self, cores: Sequence[AgentCore], api, stats: AgentStats, every_s: float = 15.0,
                 clock: Callable[[], float] = time.time):
        self.cores = list(cores)
        self.api = api  # gpuaware.plumbing.kube.api.KubeApi
        self.stats = stats
        self.every_s = every_s
        self._missing: set[str] = set()
        self.started = clock()  # a reset stamped before the agent started is older than what it knows
        self._resets_read: dict[str, dict[int, float]] = {}  # node -> the stamps of the last read
        self._resets_seen: dict[tuple[str, int], float] = {}  # (node, GPU) -> the stamp acted on
        self._bad_resets: set[str] = set()
        self.pods: PodResourcesWatcher | None = None  # set when the kubelet's PodResources socket is there

    @classmethod
    def from_settings(cls, cores: Sequence[AgentCore], stats: AgentStats, api_server: str | None,
                      every_s: float) -> CordonWatcher | None:
        """None when there is no API to ask (no ``api_server``, not in a pod, no ``KUBECONFIG``) or polling off."""
        if every_s <= 0 or not api_configured(api_server):
            return None
        from gpuaware.plumbing.kube.api import KubeApi, connect

        return cls(cores, KubeApi(connect(api_server, pool_size=2)), stats, every_s)

    def read(self) -> dict[str, set[int] | None]:
        """Each node's cordoned GPUs; None where the read failed (blocking: run it in a thread)."""
        from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, ApiException

        out: dict[str, set[int] | None] = {}
        for core in self.cores:
            try:
                node = self.api.read_node(core.node)
                out[core.node] = annotations.cordoned_gpus(node)
                self._missing.discard(core.node)
                self._read_resets(core.node, node)
                self._acknowledge(core, node)
                self._publish_pods(core, node)
            except ApiException as exc:
                out[core.node] = None
                if exc.status == 404:  # not a node of this cluster (a simulated one, or renamed)
                    if core.node not in self._missing:
                        self._missing.add(core.node)
                        log.warning("node %s not found in the API: its GPUs cannot be cordoned", core.node)
                    continue
                self.stats.cordon_read_errors += 1
                log.warning("reading node %s for cordons failed: %s %s", core.node, exc.status, exc.reason)
            except TRANSPORT_ERRORS as exc:
                out[core.node] = None
                self.stats.cordon_read_errors += 1
                log.warning("reading node %s for cordons failed: %s", core.node, exc)
        return out

    def _read_resets(self, name: str, node: dict) -> None:
        try:
            self._resets_read[name] = annotations.gpu_resets(node)
            self._bad_resets.discard(name)
        except ValueError as exc:  # the tooling's write is wrong: say so once, act on none of it
            if name not in self._bad_resets:
                self._bad_resets.add(name)
                log.warning("node %s: %s; its GPU resets are not acted on", name, exc)

    def _acknowledge(self, core: AgentCore, node: dict) -> None:
        """Write the caps NVML accepted to the node's acknowledgement annotation, when they differ."""
        from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, ApiException

        if annotations.power_caps(node, annotations.ANN_POWER_CAPS_APPLIED) == core.applied_caps:
            return
        try:
            self.api.annotate_node(core.node, {
                annotations.ANN_POWER_CAPS_APPLIED: annotations.power_caps_value(dict(core.applied_caps))})
        except (ApiException, *TRANSPORT_ERRORS) as exc:  # tried again next round
            self.stats.cordon_read_errors += 1
            log.warning("acknowledging power caps on %s failed: %s", core.node, exc)

    def gpu_pods(self, core: AgentCore) -> dict[int, list[str]]:
        """{GPU index: ["ns/name"]} of the pods PodResources says hold this core's GPUs."""
        owners = self.pods.owners if self.pods is not None else {}
        return {t.device.index: [f"{ns}/{name}" for name, ns, _ in owners.get(t.device.uuid, ())]
                for t in core.tracks}

    def _publish_pods(self, core: AgentCore, node: dict) -> None:
        """Write the GPU -> pods map to the node's annotation, when it differs from what is there."""
        from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, ApiException

        if self.pods is None or not self.pods.available:
            return  # no view: say nothing rather than "no pods"
        value = annotations.gpu_pods_value(self.gpu_pods(core))
        if (node["metadata"].get("annotations") or {}).get(annotations.ANN_GPU_PODS) == value:
            return
        try:
            self.api.annotate_node(core.node, {annotations.ANN_GPU_PODS: value})
        except (ApiException, *TRANSPORT_ERRORS) as exc:  # tried again next round
            self.stats.cordon_read_errors += 1
            log.warning("publishing the pods on the GPUs of %s failed: %s", core.node, exc)

    def apply(self, cordons: dict[str, set[int] | None]) -> None:
        for core in self.cores:
            for index, at in sorted(self._resets_read.pop(core.node, {}).items()):
                key = (core.node, index)
                if at == self._resets_seen.get(key) or index >= len(core.tracks):
                    continue
                self._resets_seen[key] = at
                if at >= self.started:
                    log.warning("GPU %d of %s was reset (%s): judged afresh", index, core.node,
                                annotations.ANN_GPU_RESETS)
                    core.gpu_reset(index)
            gpus = cordons.get(core.node)
            if gpus is None:
                continue
            for index in core.set_cordoned(gpus):
                log.warning("GPU %d of %s %s", index, core.node, "cordoned" if index in gpus else "released")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # The read blocks; applying it stays on the loop that ticks the cores.
            self.apply(await asyncio.to_thread(self.read))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
