"""A placement made real: wait for its victims to be gone, one Binding carrying the GPUs, a ``Scheduled`` Event.

kube-apiserver sets a Binding's annotations on the pod together with its node, in one write, so the
device plugin never sees the pod on a node without its GPUs. A 409 (bound already, e.g. by this
scheduler before a restart) keeps the API's answer; a 404 (gone) just releases the reservation;
anything else requeues the pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.contract.events import DecisionAction, GpuAssignment
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, PodReplaced
from gpuaware.scheduler.core.framework import Decision
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import SCHEDULED, ApiCalls
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.kube.dra.writer import ClaimsRefused, ClaimWriter, Written
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


def _nothing(*_: object) -> None:
    pass


class Binder:
    def __init__(self, calls: ApiCalls, cache: ClusterCache, settings: SchedulerSettings, stats: SchedulerStats,
                 sink: DecisionSink, departures: Departures, view: StateView | None = None,
                 on_bound: Callable[[str], None] = _nothing, wake: Callable[[], None] = _nothing):
        """``on_bound(key)``: the pod has its node; ``wake()``: the queue changed, schedule again."""
        self.calls, self.cache, self.settings, self.stats = calls, cache, settings, stats
        self.sink, self.departures, self.view = sink, departures, view
        self.on_bound, self.wake = on_bound, wake
        self._slots = asyncio.Semaphore(settings.bind_workers)
        self.claims = ClaimWriter(calls)

    def gpu_uuids(self, node: str) -> dict[int, str]:
        """GPU index -> UUID on ``node``, as the live state knows them (empty without it)."""
        if self.view is None or node not in self.view.nodes:
            return {}
        return {g.index: g.uuid for g in self.view.nodes[node].gpus}

    async def bind(self, w: Workload, d: Decision, victims: list[str], uid: str | None = None) -> None:
        """``uid``: of the pod the decision was made for; the Binding carries it as a precondition, so a pod
        deleted and recreated under the same name since then is not bound to the old pod's GPUs."""
        key, alloc = w.id, d.allocation
        assert alloc is not None
        ns, name = key.split("/", 1)
        node = self.cache.node_name(alloc.node)
        uuids = self.gpu_uuids(node)
        try:
            # The preemptor lands only once its victims are gone. It waits outside the bind slots: a slot is
            # for an API call in flight, and waiting minutes for a checkpoint must not stall other placements.
            for v in victims:
                gone = self.departures.expect(v)
                if v in self.cache.pods:
                    await asyncio.wait_for(gone.wait(), self.settings.checkpoint_timeout_s
                                           + self.settings.eviction_timeout_s)
        except TimeoutError:
            self.requeue(key, f"victims of {key} were not gone in time; placement withdrawn")
            return
        async with self._slots:
            started = time.perf_counter()
            written: Written | None = None
            picks, shared = self.cache.dra_picks.get(key), self.cache.dra_shared.get(key)
            if picks is not None or shared is not None:
                # Claims first, as kube-scheduler's PreBind: the pod has its devices from the moment it has a node.
                pod = self.cache.pods.get(key)
                try:
                    if pod is None or (uid and pod["metadata"].get("uid") != uid):
                        raise ClaimsRefused(f"{key} is gone or replaced", conflict=True)
                    if picks is not None:
                        written = await self.claims.allocate(self.cache.dra.claims, node, picks, pod)
                    else:
                        written = await self.claims.share(self.cache.dra.claims, shared or [], node, pod)
                except ClaimsRefused as exc:
                    self.stats.decisions[("DROP", "claim-conflict" if exc.conflict else "claim-write-failed")] += 1
                    if exc.lasting:  # asking again every pass would only hammer the apiserver with the same refusal
                        self.cache.withdraw(key)
                        self.cache.refuse(key, f"the apiserver refused its claims' allocation: {exc}")
                        log.warning("%s: claims not allocated, left alone until it or its claims change: %s", key, exc)
                        self.wake()
                    else:
                        self.requeue(key, f"claims not allocated: {exc}")
                    return
            try:
                # One write: the GPUs are on the pod from the moment it has a node (the device plugin reads them).
                await self.calls.call(self.calls.api.bind, ns, name, node, {
                    annotations.ANN_GPUS: objects.gpus_annotation(alloc, uuids),
                    annotations.ANN_SHARING: objects.sharing_annotation(alloc)}, uid)
            except TRANSPORT_ERRORS as exc:
                self.stats.api_errors[("bind", 0)] += 1
                await self.claims.release(written)
                # Unknown whether the Binding landed: the pod's next watch event says; until then it is requeued
                # and a second Binding would get 409 (kept as the API's answer).
                self.requeue(key, f"bind interrupted: {exc}")
                return
            except PodReplaced:
                # Deleted and recreated under its name since this placement was made: the new pod is pending on
                # its own (its ADDED event queues it); this placement is dropped, and it is no API error.
                log.info("%s: replaced by a new pod of the same name; placement dropped", key)
                await self.claims.release(written)
                self.cache.withdraw(key)
                self.stats.decisions[("DROP", "pod-replaced")] += 1
                self.wake()
                return
            except ApiException as exc:
                code, reason, message = self.calls.failed("bind", exc)
                await self.claims.release(written)
                self.cache.withdraw(key)
                if code == 409:
                    log.info("%s: %s (already bound elsewhere: keeping the API's answer)", key, message)
                elif code != 404:
                    log.warning("%s: bind failed %s %s: %s; requeued", key, code, reason, message)
                    self.requeue(key, f"bind failed: {reason}")
                self.wake()
                return
            self.stats.bind_latency.observe(time.perf_counter() - started)
        pod = self.cache.pods.get(key, {"metadata": {"name": name, "namespace": ns}})
        gpus = ", ".join(f"{g}:{m}m" for g, m in zip(alloc.gpus, alloc.milli, strict=True)) or "none"
        self.stats.decisions[("PLACE", "preempted" if victims else "fits")] += 1
        self.stats.stream_steered(d.steered_by)
        self.stats.waited(w.tenant, w.priority, time.time() - w.submit_s)
        self.on_bound(key)
        assignments = [GpuAssignment(uuids.get(g) or f"{node}/{g}", m, w.gpu_memory_mib)
                       for g, m in zip(alloc.gpus, alloc.milli, strict=True)]
        self.calls.event(pod, SCHEDULED,
                         f"Successfully assigned {key} to {node} (GPUs {gpus}; {'; '.join(d.reasons)})")
        await self.sink.record(Outcome(key, DecisionAction.PLACE, node, d.reasons, d.signals, d.steered_by), w,
                               assignments, objects.sharing_annotation(alloc), d.score, d.latency_s)

    def requeue(self, key: str, why: str) -> None:
        """Withdraw a placement: the pod gives its GPUs back and, while unbound, waits in the queue again."""
        self.cache.withdraw(key)
        pod = self.cache.pods.get(key)
        if pod is not None and not pod.get("spec", {}).get("nodeName"):
            self.cache.queue_if_ours(pod)
        log.info("%s: %s", key, why)
        self.wake()
