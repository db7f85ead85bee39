"""A GPU turning critical: cordon it on its node (annotation) and move its pods off (checkpoint, then evict).

Acts once per turn: a GPU that stays critical is not cordoned again, one that recovers and turns
critical again is; a cordon the API refused is tried again on the next state update.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kubernetes.client.exceptions import ApiException

from contract.events import DecisionAction, HealthBand
from plumbing import observability
from plumbing.kube.api import TRANSPORT_ERRORS
from scheduler.feed import StateView
from scheduler.kube.cache import ClusterCache
from scheduler.kube.calls import ApiCalls
from scheduler.kube.decisions import DecisionSink, Outcome
from scheduler.kube.evictor import Evictor
from scheduler.kube.tasks import Tasks
from scheduler.metrics import SchedulerStats

log = logging.getLogger(__name__)


class HealthReactions:
    def __init__(self, view: StateView, calls: ApiCalls, cache: ClusterCache, stats: SchedulerStats,
                 sink: DecisionSink, evictor: Evictor, tasks: Tasks):
        self.view, self.calls, self.cache, self.stats = view, calls, cache, stats
        self.sink, self.evictor, self.tasks = sink, evictor, tasks
        self._critical_seen: set[tuple[str, int]] = set()  # (node, GPU index) acted on while it stays critical

    def react(self, where: Mapping[str, tuple[int, int]]) -> None:
        """After live state was applied: act on each GPU (UUID located by ``where``) that turned critical."""
        c = self.cache.cluster
        for gpu_uuid, state in self.view.gpus.items():
            if gpu_uuid not in where:
                continue
            i, g = where[gpu_uuid]
            key = (c.names[i], g)
            if state.health_band != HealthBand.CRITICAL:
                self._critical_seen.discard(key)  # turning critical again (after a repair) acts again
            elif key not in self._critical_seen:
                self._critical_seen.add(key)
                self.tasks.spawn(self.cordon_and_migrate(c.names[i], g, gpu_uuid))

    async def cordon_and_migrate(self, node: str, gpu: int, gpu_uuid: str) -> None:
        # The span continues the trace of the state that turned the GPU critical (agent event -> stream
        # state), so the decisions published inside it carry that trace to scheduler.decisions.v1.
        parent = observability.extract_context(self.view.band_trace.get(gpu_uuid))
        attributes = {"gpuaware.node": node, "gpuaware.gpu.index": gpu, "gpuaware.gpu.uuid": gpu_uuid}
        with observability.tracer(__name__).start_as_current_span("scheduler.cordon_and_migrate", context=parent,
                                                                  attributes=attributes):
            await self.cordon(node, gpu)
            await self.migrate_off(node, gpu)

    async def cordon(self, node: str, gpu: int) -> None:
        try:
            await self.calls.call(self.calls.api.cordon_gpu, node, gpu)
            self.stats.decisions[("CORDON", "gpu-critical")] += 1
            await self.sink.record(Outcome(f"{node}/gpu{gpu}", DecisionAction.CORDON, node,
                                           [f"GPU {gpu} of {node} is critical: cordoned"]), None)
        except ApiException as exc:
            self.calls.failed("patch-node", exc)
            self._critical_seen.discard((node, gpu))  # tried again on the next state update
        except TRANSPORT_ERRORS as exc:
            self.stats.api_errors[("patch-node", 0)] += 1
            self._critical_seen.discard((node, gpu))
            log.warning("could not cordon GPU %d of %s: %s", gpu, node, exc)

    async def migrate_off(self, node: str, gpu: int) -> None:
        i = self.cache.cluster.index.get(node)
        victims = [r for r in list(self.cache.running.values()) if r.allocation.node == i and gpu in r.allocation.gpus]
        for r in victims:
            pod = self.cache.pods.get(r.workload.id)
            if pod is None or not self.evictor.claim(r.workload.id):
                continue
            self.cache.release(r.workload.id)
            reason = f"GPU {gpu} of {node} turned critical: checkpoint and move"
            self.stats.decisions[("MIGRATE", "gpu-critical")] += 1
            await self.sink.record(Outcome(r.workload.id, DecisionAction.MIGRATE, node, [reason]), r.workload)
            self.tasks.spawn(self.evictor.evict(pod, r, reason, "Migrated"))
