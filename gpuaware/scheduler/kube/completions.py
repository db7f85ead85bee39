"""Jobs that ended successfully, published on ``job.completions.v1`` for the stream's runtime forecaster.

A pod of this scheduler that reaches ``Succeeded`` completed its runtime: from ``status.startTime`` to the latest
``finishedAt`` of its containers. The scheduler computes its signature keys (``contract.runtime.signature_keys``
of the pod's request and ``owner_of``), the ones a pending pod of the same kind is looked up under
(``signature``), and, when the pod declared ``gpuaware.io/duration-s``, the keys its declared duration is
calibrated under. A pod preempted, evicted, failed or deleted while running did not complete its runtime and is
not published.

The pod watch leaves out terminal pods (``status.phase!=Succeeded,status.phase!=Failed``). On kube-apiserver a
pod that turns ``Succeeded`` leaves that watch as a ``DELETED`` event carrying its *previous* object (still
``Running``, no container terminated), so the watch alone never tells how it ended, and reading the pod back
loses every job whose pod is deleted as soon as it ends (a Job's ``ttlSecondsAfterFinished: 0``, an operator).
Completions therefore come from a watch of their own (``WATCH_SELECTOR``: this scheduler's ``Succeeded`` pods):
a pod that enters it arrives as ``ADDED`` with its final status, before any deletion. Scheduling does not wait
for its list, which is read in pages keeping only the pods past the watermark whole (``keep``). ``seen`` holds
the uids of the scheduler's ``Succeeded`` pods that exist (what the list holds), so each completion is taken once
per scheduler process; a pod listed again after a watch gap (410, re-list) that was not seen before is taken then.

No completion is lost while no replica publishes (a restart, a leader change). The watermark is the end of the
newest completion the runtime table (``job.runtime.v1``) holds, or ``lookback_s`` ago when it holds none or that
is later: the first list takes every pod that ended after the watermark, and only a replica that may act
publishes (the leader); a standby holds the pods it takes (``held``, those past the watermark) and publishes them
when it starts leading (``lead``). A completion published twice (by the old and the new leader at a handover, or
again after a restart before the table shows it) is learned once: the stream's learner drops a workload id and end
it learned already (``gpuaware.stream.runtime_topic``).

Each completion published is also scored against the estimate the scheduler had when it placed the pod
(``gpuaware.scheduler.forecast_quality``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from gpuaware.contract.events import JobCompletion
from gpuaware.contract.runtime import JobFeatures, declared_keys, owner_of, signature_keys
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.forecast_quality import ForecastQuality

log = logging.getLogger(__name__)

CompletionPublisher = Callable[[JobCompletion], Awaitable[None]]


def watch_selector(scheduler_name: str) -> str:
    """The completions watch's field selector: ``scheduler_name``'s pods that succeeded."""
    return f"spec.schedulerName={scheduler_name},status.phase=Succeeded"


async def discard_completion(record: JobCompletion) -> None:
    """The default publisher: nothing learns runtimes."""


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def runtime_of(pod: Mapping[str, Any]) -> tuple[float, float] | None:
    """(seconds run, end in unix seconds) of a pod whose containers have all terminated; None otherwise."""
    status = pod.get("status") or {}
    start = status.get("startTime")
    ends = []
    for cs in status.get("containerStatuses") or []:
        done = (cs.get("state") or {}).get("terminated")
        if not done or not done.get("finishedAt"):
            return None
        ends.append(_ts(done["finishedAt"]))
    if not start or not ends:
        return None
    end = max(ends)
    return end - _ts(start), end


def keys_of(w: Workload, pod: Mapping[str, Any]) -> list[str]:
    """A pod's runtime signature keys, most specific first (the same for a pending pod and a completed one)."""
    return signature_keys(JobFeatures(w.tenant, w.num_gpu, w.gpu_milli, w.cpu_milli, w.memory_mib, w.qos, w.models,
                                      owner_of(pod)))


def completion_of(pod: Mapping[str, Any], w: Workload) -> JobCompletion | None:
    """The completion record of a ``Succeeded`` pod; None for any other pod (or one with no runtime to tell)."""
    if (pod.get("status") or {}).get("phase") != "Succeeded":
        return None
    ran = runtime_of(pod)
    if ran is None or ran[0] <= 0:
        return None
    declared = w.duration_s if w.duration_s and w.duration_s > 0 else None
    return JobCompletion(w.id, int(ran[1] * 1000), w.tenant, ran[0], keys_of(w, pod), declared,
                         declared_keys(w.tenant, owner_of(pod)) if declared else [])


class Completions:
    """From the completions watch to ``job.completions.v1``. ``workload``: the pod as the core's workload (raises
    on a pod it cannot parse); ``preempted``: was it evicted by us; ``quality``: scores each completion against
    the estimate placed with it."""

    def __init__(self, publish: CompletionPublisher, workload: Callable[[dict[str, Any]], Workload],
                 preempted: Callable[[str], bool], may_act: Callable[[], bool],
                 spawn: Callable[[Awaitable[Any]], Any], quality: ForecastQuality | None = None,
                 newest_ms: Callable[[], int] | None = None, lookback_s: float = 86_400.0,
                 clock: Callable[[], float] = time.time, held_max: int = 50_000):
        self.publish, self.workload, self.preempted = publish, workload, preempted
        self.may_act, self.spawn = may_act, spawn
        self.quality = quality if quality is not None else ForecastQuality()
        self.newest_ms = newest_ms or (lambda: 0)
        self.lookback_s = lookback_s if lookback_s > 0 else 86_400.0
        self.clock, self.held_max = clock, held_max
        self.seen: set[str] = set()
        self.held: dict[str, dict[str, Any]] = {}  # uid -> a pod taken while this replica could not publish
        self.listed = False

    def watermark_ms(self) -> int:
        """Pods that ended at or before this are learned already (or older than ``lookback_s``)."""
        return max(self.newest_ms(), int((self.clock() - self.lookback_s) * 1000))

    @staticmethod
    def end_ms(pod: Mapping[str, Any]) -> int | None:
        try:
            ran = runtime_of(pod)
        except (ValueError, TypeError):
            return None
        return None if ran is None else int(ran[1] * 1000)

    def keep(self, pod: dict[str, Any]) -> dict[str, Any]:
        """What the list keeps of a pod (in the informer's thread, page by page): a pod that ended at or before the
        watermark is only its uid, name and namespace (never taken: its completion was learned)."""
        end = self.end_ms(pod)
        if end is not None and end > self.watermark_ms():
            return pod
        meta = pod.get("metadata") or {}
        return {"metadata": {k: meta[k] for k in ("uid", "name", "namespace") if k in meta}}

    def sync(self, pods: list[dict[str, Any]]) -> None:
        """The watch (re-)listed ``pods``: the first list takes those that ended after the watermark; a later one
        takes a pod not seen (a completion the watch's gap hid)."""
        uids = {p["metadata"].get("uid", "") for p in pods}
        mark = None if self.listed else self.watermark_ms()
        for pod in pods:
            if mark is None:
                if pod["metadata"].get("uid", "") not in self.seen:
                    self._take(pod)
            elif (end := self.end_ms(pod)) is not None and end > mark:
                self._take(pod)
        self.seen, self.listed = uids, True

    def event(self, kind: str, pod: dict[str, Any]) -> None:
        """A watch event: ``ADDED`` (or ``MODIFIED``, from a server that does not turn a selector's entry into
        ``ADDED``) of a pod not seen is a completion; ``DELETED`` forgets its uid."""
        uid = pod["metadata"].get("uid", "")
        if kind == "DELETED":
            self.seen.discard(uid)
        elif uid not in self.seen:
            self.seen.add(uid)
            self._take(pod)

    def lead(self) -> None:
        """This replica started leading: publish the pods held while it could not, those past the watermark."""
        held, self.held = self.held, {}
        mark = self.watermark_ms()
        for pod in held.values():
            end = self.end_ms(pod)
            if end is not None and end > mark:
                self._take(pod)

    def _hold(self, pod: dict[str, Any]) -> None:
        end = self.end_ms(pod)
        if end is None or end <= self.watermark_ms():
            return
        self.held[pod["metadata"].get("uid", "")] = pod
        if len(self.held) > self.held_max:  # learned since, then the oldest ends
            mark = self.watermark_ms()
            keep = sorted(((e, u) for u, p in self.held.items() if (e := self.end_ms(p) or 0) > mark), reverse=True)
            self.held = {u: self.held[u] for _, u in keep[: self.held_max]}

    def _take(self, pod: dict[str, Any]) -> None:
        key = f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}"
        if not self.may_act():
            self.quality.forget(key)
            self._hold(pod)
            return
        if pod["metadata"].get("deletionTimestamp") or self.preempted(key):
            self.quality.forget(key)
            return
        try:
            record = completion_of(pod, self.workload(pod))
        except Exception as exc:
            log.debug("no completion for %s: %s", key, exc)
            record = None
        if record is None:
            self.quality.forget(key)
            return
        self.quality.completed(key, record.runtime_s)
        self.spawn(self._send(record))

    async def _send(self, record: JobCompletion) -> None:
        try:
            await self.publish(record)
            self.quality.published += 1
        except Exception as exc:  # a completion lost costs one sample of history, never scheduling
            log.warning("could not publish the completion of %s: %s", record.workload_id, exc)
