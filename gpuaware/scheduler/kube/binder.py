"""A placement made real: wait for its victims to be gone, one Binding carrying the GPUs, a ``Scheduled`` Event.

kube-apiserver sets a Binding's annotations on the pod together with its node, in one write, so the
device plugin never sees the pod on a node without its GPUs. Every failure of the cycle (victims not
gone in time, claims refused, the Binding refused or interrupted) goes through one handler
(``Binder._failed``): what was written is taken back, the cache forgets the placement, and then a 409
(bound already, e.g. by this scheduler before a restart), a 404 (gone) or a replaced pod keep the API's
answer; a lasting claim refusal leaves the pod alone; anything else requeues it.
"""

from __future__ import annotations

import asyncio
import functools
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
from gpuaware.scheduler.kube.calls import SCHEDULED, ApiCalls, NotLeading
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.kube.dra.writer import ClaimsRefused, ClaimWriter, Written
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

REQUEUE, REFUSE, DROP = "requeue", "refuse", "drop"  # what becomes of a pod whose binding cycle failed


class BindFailure(Exception):
    """A binding cycle that did not land: ``then`` (``REQUEUE``, ``REFUSE``, ``DROP``), why (logged at
    ``level``; a refusal's Event), and the DROP decision it counts, if any."""

    def __init__(self, then: str, why: str, drop: str | None = None, level: int = logging.INFO):
        super().__init__(why)
        self.then, self.why, self.drop, self.level = then, why, drop, level


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
        deleted and recreated under the same name since then is not bound to the old pod's GPUs. Every way this
        cycle can fail raises ``BindFailure`` and ends in ``_failed``, as kube-scheduler sends every
        binding-cycle failure through one handler."""
        key, alloc = w.id, d.allocation
        assert alloc is not None
        ns, name = key.split("/", 1)
        node = self.cache.node_name(alloc.node)
        uuids = self.gpu_uuids(node)
        written: list[Written] = []  # what the claims' writes left written, for ``_failed`` to take back
        try:
            # The preemptor lands only once its victims are gone. It waits outside the bind slots: a slot is
            # for an API call in flight, and waiting minutes for a checkpoint must not stall other placements.
            await self._victims_gone(key, victims)
            async with self._slots:
                started = time.perf_counter()
                await self._write(key, ns, name, node, {
                    annotations.ANN_GPUS: objects.gpus_annotation(alloc, uuids),
                    annotations.ANN_SHARING: objects.sharing_annotation(alloc)}, uid, written)
                self.stats.bind_latency.observe(time.perf_counter() - started)
        except BindFailure as failure:
            await self._failed(key, written[0] if written else None, failure)
            return
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

    async def _victims_gone(self, key: str, victims: list[str]) -> None:
        try:
            for v in victims:
                gone = self.departures.expect(v)
                if v in self.cache.pods:
                    await asyncio.wait_for(gone.wait(), self.settings.checkpoint_timeout_s
                                           + self.settings.eviction_timeout_s)
        except TimeoutError:
            raise BindFailure(REQUEUE, f"victims of {key} were not gone in time; placement withdrawn") from None

    async def _write(self, key: str, ns: str, name: str, node: str, ann: dict[str, str], uid: str | None,
                     written: list[Written]) -> None:
        """The pod's claims written, as kube-scheduler's DRA PreBind (it has its devices from the moment it has a
        node), then one Binding carrying the GPUs (the device plugin reads them from the moment it has a node).
        All of it on one API thread, with no turn of the event loop between the writes: a pass holding the loop
        does not hold them (``gpuaware.scheduler.kube.dra.writer``). What the claims' writes left is appended to
        ``written``."""
        claims = self._claims_to_write(key, node, uid)

        def claims_then_binding() -> None:
            if claims is not None:
                written.append(claims())
            if not self.calls.may_act():
                raise NotLeading()
            self.calls.api.bind(ns, name, node, ann, uid)

        try:
            await self.calls.call(claims_then_binding, checked=False)
        except ClaimsRefused as exc:
            drop = "claim-conflict" if exc.conflict else "claim-write-failed"
            if exc.lasting:  # asking again every pass would only hammer the apiserver with the same refusal
                raise BindFailure(REFUSE, f"the apiserver refused its claims' allocation: {exc}", drop,
                                  logging.WARNING) from exc
            raise BindFailure(REQUEUE, f"claims not allocated: {exc}", drop) from exc
        except TRANSPORT_ERRORS as exc:
            self.stats.api_errors[("bind", 0)] += 1
            # Unknown whether the Binding landed: the pod's next watch event says; until then it is requeued
            # and a second Binding would get 409 (kept as the API's answer).
            raise BindFailure(REQUEUE, f"bind interrupted: {exc}") from exc
        except PodReplaced as exc:
            # Deleted and recreated under its name since this placement was made: the new pod is pending on
            # its own (its ADDED event queues it); this placement is dropped, and it is no API error.
            raise BindFailure(DROP, "replaced by a new pod of the same name; placement dropped",
                              "pod-replaced") from exc
        except ApiException as exc:
            code, reason, message = self.calls.failed("bind", exc)
            if code == 409:
                raise BindFailure(DROP, f"{message} (already bound elsewhere: keeping the API's answer)") from exc
            if code == 404:
                raise BindFailure(DROP, f"gone: {message}") from exc
            raise BindFailure(REQUEUE, f"bind failed {code} {reason}: {message}; requeued", None,
                              logging.WARNING) from exc

    def _claims_to_write(self, key: str, node: str, uid: str | None) -> Callable[[], Written] | None:
        """What writes the pod's claims on an API thread (``ClaimsRefused`` if they cannot be), read from the cache
        here on the loop; None for a pod without claims."""
        dra = self.cache.dra
        picks, shared = dra.picks.get(key), dra.shared.get(key)
        if picks is None and shared is None:
            return None
        pod = self.cache.pods.get(key)

        def gone() -> Written:
            raise ClaimsRefused(f"{key} is gone or replaced", conflict=True)

        if pod is None or (uid and pod["metadata"].get("uid") != uid):
            return gone
        # The claims as the informer has them now: the writes take their resourceVersion as the precondition.
        keys = sorted({r.claim for r, _ in picks} if picks is not None else set(shared or []))
        claims = {k: dra.state.claims[k] for k in keys if k in dra.state.claims}
        if picks is not None:
            return functools.partial(self.claims.allocate_now, claims, node, picks, pod)
        return functools.partial(self.claims.share_now, claims, keys, node, pod)

    async def _failed(self, key: str, written: Written | None, failure: BindFailure) -> None:
        """The one failure path: what the placement wrote is taken back, the cache forgets it, and the pod
        waits in the queue again (``REQUEUE``), is left alone until it or its claims change (``REFUSE``), or
        is left to the API's answer (``DROP``)."""
        await self.claims.release(written)
        self.cache.forget(key)
        pod = self.cache.pods.get(key)
        if failure.then == REQUEUE and pod is not None and not pod.get("spec", {}).get("nodeName"):
            self.cache.queue_if_ours(pod)
        elif failure.then == REFUSE:
            self.cache.refuse(key, failure.why)
        if failure.drop is not None:
            self.stats.decisions[("DROP", failure.drop)] += 1
        log.log(failure.level, "%s: %s", key, failure.why)
        self.wake()
