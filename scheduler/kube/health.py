"""A GPU turning critical: cordon it on its node (annotation) and move its pods off (checkpoint, then evict).

A GPU turns "critical" here when its band is CRITICAL or its graded verdict recommends a remediation
(drain, reset, reboot, service request: docs/health.md). Acts once per turn: a GPU that stays
critical is not cordoned again, one that recovers and turns critical again is; a cordon the API
refused is tried again on the next state update. The safety net is decided here, once for the
cluster (scheduler.core.breaker): a circuit breaker on how many nodes may be newly quarantined in
a window (a held cordon is retried on the next state update), ``remediation_dry_run`` (decisions
recorded, no API call), and the lemon-node ledger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from kubernetes.client.exceptions import ApiException

from contract.events import DecisionAction, GpuState, HealthAction, HealthBand
from plumbing import observability
from plumbing.kube.api import TRANSPORT_ERRORS
from scheduler.core.breaker import QuarantineBreaker, RemediationLedger
from scheduler.feed import StateView
from scheduler.kube.cache import ClusterCache
from scheduler.kube.calls import ApiCalls
from scheduler.kube.decisions import DecisionSink, Outcome
from scheduler.kube.device_taints import DeviceTaints
from scheduler.kube.evictor import Evictor
from scheduler.kube.tasks import Tasks
from scheduler.metrics import SchedulerStats

log = logging.getLogger(__name__)

REMEDIATE = frozenset({HealthAction.DRAIN, HealthAction.RESET_GPU, HealthAction.REBOOT_NODE,
                       HealthAction.SERVICE_REQUEST})


def needs_remediation(state: GpuState) -> bool:
    return state.health_band == HealthBand.CRITICAL or state.recommended_action in REMEDIATE


class HealthReactions:
    def __init__(self, view: StateView, calls: ApiCalls, cache: ClusterCache, stats: SchedulerStats,
                 sink: DecisionSink, evictor: Evictor, tasks: Tasks, device_taints: DeviceTaints | None = None):
        self.view, self.calls, self.cache, self.stats = view, calls, cache, stats
        self.device_taints = device_taints  # DRA: the GPU's devices tainted while it is critical
        self.sink, self.evictor, self.tasks = sink, evictor, tasks
        self._critical_seen: set[tuple[str, int]] = set()  # (node, GPU index) acted on while it stays critical
        settings = evictor.settings
        self.breaker = QuarantineBreaker(settings.breaker_max_fraction, settings.breaker_window_s)
        self.dry_run = settings.remediation_dry_run
        self.ledger = RemediationLedger()
        self._held: set[tuple[str, int]] = set()
        # (node, GPU) -> unix times of the chain's steps (cordoned, moved) and whether the breaker held it
        self.timeline: dict[tuple[str, int], dict[str, float | bool]] = {}

    def react(self, where: Mapping[str, tuple[int, int]]) -> None:
        """After live state was applied: act on each GPU (UUID located by ``where``) that turned critical."""
        c = self.cache.cluster
        for gpu_uuid, state in self.view.gpus.items():
            if gpu_uuid not in where:
                continue
            i, g = where[gpu_uuid]
            key = (c.names[i], g)
            if not needs_remediation(state):
                lift = self.device_taints.lift_if_tainted(self.calls, *key) if self.device_taints else None
                if lift is not None:
                    self.tasks.spawn(lift)
                self._critical_seen.discard(key)  # turning critical again (after a repair) acts again
                self._held.discard(key)
            elif key not in self._critical_seen:
                if not self.breaker.allow(c.names[i], time.time(), len(c.names)):
                    if key not in self._held:  # recorded once; tried again on every state update
                        self._held.add(key)
                        self.timeline.setdefault(key, {})["breaker_held"] = True
                        self.stats.decisions[("DEFER", "breaker-held")] += 1
                        self.tasks.spawn(self.sink.record(Outcome(
                            f"{c.names[i]}/gpu{g}", DecisionAction.DEFER, c.names[i],
                            [f"GPU {g} of {c.names[i]} needs remediation; circuit breaker held (more than "
                             f"{self.breaker.max_fraction:.0%} of nodes in {self.breaker.window_s:.0f} s)"]), None))
                    continue
                self._held.discard(key)
                self._critical_seen.add(key)
                if self.ledger.record(c.names[i], time.time()) is not None and self.ledger.lemon(c.names[i]):
                    log.warning("node %s is a lemon: %d GPU remediations in 7 days", c.names[i],
                                len(self.ledger.history[c.names[i]]))
                if self.dry_run:
                    self.stats.decisions[("CORDON", "dry-run")] += 1
                    self.tasks.spawn(self.sink.record(Outcome(
                        f"{c.names[i]}/gpu{g}", DecisionAction.CORDON, c.names[i],
                        [f"dry run: GPU {g} of {c.names[i]} would be cordoned and its pods moved"]), None))
                    continue
                self.tasks.spawn(self.cordon_and_migrate(c.names[i], g, gpu_uuid))

    async def cordon_and_migrate(self, node: str, gpu: int, gpu_uuid: str) -> None:
        # The span continues the trace of the state that turned the GPU critical (agent event -> stream
        # state), so the decisions published inside it carry that trace to scheduler.decisions.v1.
        parent = observability.extract_context(self.view.band_trace.get(gpu_uuid))
        attributes = {"gpuaware.node": node, "gpuaware.gpu.index": gpu, "gpuaware.gpu.uuid": gpu_uuid}
        with observability.tracer(__name__).start_as_current_span("scheduler.cordon_and_migrate", context=parent,
                                                                  attributes=attributes):
            await self.cordon(node, gpu)
            if self.device_taints is not None:
                await self.device_taints.taint_async(self.calls, node, gpu, "critical")
            await self.migrate_off(node, gpu)

    async def cordon(self, node: str, gpu: int) -> None:
        try:
            await self.calls.call(self.calls.api.cordon_gpu, node, gpu)
            self.timeline.setdefault((node, gpu), {})["cordoned"] = time.time()
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
        # Every pod on the GPU is released from it and its checkpoint-and-evict under way.
        self.timeline.setdefault((node, gpu), {})["moved"] = time.time()
