"""Evictions (preemption, migration off a critical GPU): checkpoint first when the pod can, then the Eviction API.

A checkpointable pod is asked through an annotation and given ``checkpoint_timeout_s`` to answer;
the eviction is retried while a PodDisruptionBudget blocks it (429), up to ``eviction_timeout_s``.
A pod that cannot be evicted keeps its GPUs (the cache accounts it again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, api_error, now_rfc3339
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)

CHECKPOINT_POLL_S = 0.2  # the cache follows the pod's watch: its answer shows up there


class Evictor:
    def __init__(self, calls: ApiCalls, cache: ClusterCache, settings: SchedulerSettings, stats: SchedulerStats):
        self.calls, self.cache, self.settings, self.stats = calls, cache, settings, stats
        self._evicting: set[str] = set()

    def claim(self, key: str) -> bool:
        """True, and ``key`` counts as being evicted until its ``evict`` ends, unless it already is."""
        if key in self._evicting:
            return False
        self._evicting.add(key)
        return True

    def evicting(self, key: str) -> bool:
        return key in self._evicting

    async def evict(self, pod: dict[str, Any], r: Running | None, reason: str, event_reason: str,
                    checkpoint: bool = True) -> None:
        """Evict a claimed pod, writing ``event_reason`` (e.g. Preempted, Migrated) as its Event; ``checkpoint``
        False skips the checkpoint request (a namespace whose eviction mode is ``evict``); ``r`` None: a pod the
        cache does not charge (another scheduler's, named by its node's agent), never asked to checkpoint."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        key = objects.key(pod)
        api = self.calls.api
        try:
            if checkpoint and r is not None and r.workload.checkpointable and self.settings.checkpoint_timeout_s > 0:
                asked = now_rfc3339()
                await self.calls.call(api.annotate_pod, ns, name, {annotations.ANN_CHECKPOINT_REQUEST: asked})
                await self.await_checkpoint(key, asked)
            self.calls.event(pod, event_reason, reason, "Normal")
            deadline = time.monotonic() + self.settings.eviction_timeout_s
            while True:
                try:
                    await self.calls.call(api.evict, ns, name)
                    return
                except ApiException as exc:
                    if exc.status == 404:  # already gone (finished, or deleted by its owner): nothing to do
                        return
                    code, _, message = self.calls.failed("evict", exc)
                    if code != 429 or time.monotonic() > deadline:
                        raise
                    log.info("%s: eviction blocked (%s); retrying", key, message)
                    await asyncio.sleep(self.settings.eviction_retry_s)
                except TRANSPORT_ERRORS:
                    self.stats.api_errors[("evict", 0)] += 1
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(self.settings.eviction_retry_s)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            code, reason_, message = api_error(exc) if isinstance(exc, ApiException) else (0, "transport", str(exc))
            log.warning("%s: could not evict (%s %s: %s); it keeps its GPUs", key, code, reason_, message)
            self.cache.rebuild()  # it still runs: account it again
            self.calls.event(pod, "EvictionFailed", f"{reason}: eviction failed: {message}", "Warning")
        finally:
            self._evicting.discard(key)

    async def await_checkpoint(self, key: str, asked: str) -> None:
        """Until the pod answers a checkpoint request made at ``asked``, leaves, or the timeout passes."""
        deadline = time.monotonic() + self.settings.checkpoint_timeout_s
        while time.monotonic() < deadline:
            pod = self.cache.pods.get(key)
            if pod is None:
                return
            done = (pod["metadata"].get("annotations") or {}).get(annotations.ANN_CHECKPOINT_DONE, "")
            if done and done >= asked:
                return
            await asyncio.sleep(CHECKPOINT_POLL_S)
        log.info("%s: no checkpoint within %.0fs; evicting anyway", key, self.settings.checkpoint_timeout_s)
