"""GPUQueue status: admitted, running and pending pods, GPUs used per model and borrowed; written when it changes."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.queues import Queue
from gpuaware.scheduler.metrics import SchedulerStats


class QueueStatusWriter:
    def __init__(self, calls: ApiCalls, cache: CacheView, stats: SchedulerStats):
        self.calls, self.cache, self.stats = calls, cache, stats
        self.sent: dict[str, dict[str, Any]] = {}  # queue -> last status written

    def status(self, q: Queue) -> dict[str, Any]:
        c = self.cache.cluster
        tenant, quota = q.tenant, q.quota_gpus
        running = [r for r in self.cache.running.values() if r.workload.tenant == tenant]
        by_model: dict[str, float] = {}
        for r in running:
            model = str(c.models[r.allocation.node])
            by_model[model] = by_model.get(model, 0.0) + sum(r.allocation.milli) / 1000
        used = sum(by_model.values())
        return {
            "admitted": len(running),  # placed: bound, or binding in flight
            "running": sum(1 for r in running if r.workload.id not in self.cache.assumed),
            "pending": sum(1 for pw in self.cache.pending.values() if pw.workload.tenant == tenant),
            "borrowedGpus": round(max(0.0, used - quota), 3),
            "quotaUsed": [{"model": m, "gpus": round(v, 3)} for m, v in sorted(by_model.items())],
            "observedGeneration": q.generation,
        }

    async def write(self) -> None:
        for name, q in list(self.cache.queues.items()):
            status = self.status(q)
            if self.sent.get(name) == status:
                continue
            try:
                await self.calls.call(self.calls.api.patch_queue_status, name, status)
                self.sent[name] = status
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                self.stats.api_errors[("patch-queue-status", getattr(exc, "status", 0) or 0)] += 1
