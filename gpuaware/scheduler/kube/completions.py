"""Jobs that ended successfully, published on ``job.completions.v1`` for the stream's runtime forecaster.

A pod of this scheduler that reaches ``Succeeded`` completed its runtime: from ``status.startTime`` to the latest
``finishedAt`` of its containers. The scheduler computes its signature keys (``contract.runtime.signature_keys``
of the pod's request and ``owner_of``), the ones a pending pod of the same kind is looked up under
(``signature``), and, when the pod declared ``gpuaware.io/duration-s``, the keys its declared duration is
calibrated under. A pod preempted, evicted, failed or deleted while running did not complete its runtime and is
not published.

The pod watch leaves out terminal pods (a field selector), so a pod that turns ``Succeeded`` usually arrives as a
deletion carrying its last running state; such a pod, gone without being deleted and not preempted by this
scheduler, is read back once (``read_pod``) to learn how it ended. Only a replica that may act publishes (the
leader): each completion is learned once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from gpuaware.contract.events import JobCompletion
from gpuaware.contract.runtime import JobFeatures, declared_keys, owner_of, signature_keys
from gpuaware.scheduler.core.workload import Workload

log = logging.getLogger(__name__)

CompletionPublisher = Callable[[JobCompletion], Awaitable[None]]


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
    """From the pod watch to ``job.completions.v1``. ``workload``: the pod as the core's workload (raises on a pod
    it cannot parse); ``read_pod``: (namespace, name) -> the pod now; ``preempted``: was it evicted by us."""

    def __init__(self, publish: CompletionPublisher, workload: Callable[[dict[str, Any]], Workload],
                 read_pod: Callable[[str, str], dict[str, Any]], preempted: Callable[[str], bool],
                 may_act: Callable[[], bool], spawn: Callable[[Awaitable[Any]], Any], scheduler_name: str):
        self.publish, self.workload, self.read_pod, self.preempted = publish, workload, read_pod, preempted
        self.may_act, self.spawn, self.scheduler_name = may_act, spawn, scheduler_name
        self.published = 0

    def left(self, key: str, pod: dict[str, Any]) -> None:
        """``pod`` (its last state the watch delivered) left; publish it if it completed."""
        if (pod.get("spec") or {}).get("schedulerName") != self.scheduler_name or not self.may_act():
            return
        if pod["metadata"].get("deletionTimestamp") or self.preempted(key):
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            self.spawn(self._send(pod))
        elif phase not in ("Failed",) and (pod.get("spec") or {}).get("nodeName"):
            self.spawn(self._look(pod))  # left the watch's selector: read how it ended

    async def _look(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            now = await asyncio.to_thread(self.read_pod, meta.get("namespace", ""), meta["name"])
        except Exception as exc:  # gone already, or the API is away: this completion is not learned
            log.debug("could not read %s/%s after it left: %s", meta.get("namespace"), meta["name"], exc)
            return
        if now["metadata"].get("uid") == meta.get("uid"):
            await self._send(now)

    async def _send(self, pod: dict[str, Any]) -> None:
        try:
            record = completion_of(pod, self.workload(pod))
        except Exception as exc:
            log.debug("no completion for %s: %s", pod["metadata"].get("name"), exc)
            return
        if record is None:
            return
        try:
            await self.publish(record)
            self.published += 1
        except Exception as exc:  # a completion lost costs one sample of history, never scheduling
            log.warning("could not publish the completion of %s: %s", record.workload_id, exc)
