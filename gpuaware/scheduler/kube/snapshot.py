"""The queue and allocation gauges (``QueueSnapshot``) as the cache and the live state have them now."""

from __future__ import annotations

from gpuaware.scheduler.core.queue import jain_index
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache_view import CacheView
from gpuaware.scheduler.metrics import PRIORITY_NAMES, QueueSnapshot


def queue_snapshot(cache: CacheView, view: StateView | None, now: float) -> QueueSnapshot:
    c = cache.cluster
    snap = QueueSnapshot()
    for pw in cache.pending.values():
        k = (pw.workload.tenant, PRIORITY_NAMES.get(pw.workload.priority, "low"))
        snap.pending[k] = snap.pending.get(k, 0) + 1
        snap.oldest_wait_s[k] = max(snap.oldest_wait_s.get(k, 0.0), now - pw.workload.submit_s)
    weights = {}
    for q in cache.queues.values():
        snap.gpus_quota[q.tenant] = q.quota_gpus
        weights[q.tenant] = q.weight
    busy = allocated = 0.0
    for r in cache.running.values():
        t = r.workload.tenant
        snap.gpus_used[t] = snap.gpus_used.get(t, 0.0) + sum(r.allocation.milli) / 1000
        for g, m in zip(r.allocation.gpus, r.allocation.milli, strict=True):
            busy += float(c.util[r.allocation.node, g]) / 100 * m / 1000
            allocated += m / 1000
    if allocated and view is not None:  # without live state there is no utilisation to speak of
        snap.allocated_busy_ratio = round(busy / allocated, 4)
    for t, used in snap.gpus_used.items():
        if t in snap.gpus_quota:
            snap.gpus_borrowed[t] = max(0.0, used - snap.gpus_quota[t])
    shares = [snap.gpus_used.get(t, 0.0) / w for t, w in weights.items()]
    snap.jain = jain_index(shares)
    snap.running = len(cache.running)
    snap.cordoned_gpus = sum(len(v) for v in cache.cordoned.values())
    if view is not None:
        snap.stale_gpus = view.stale_count(int(now * 1000))
    snap.allocated_gpu_share = c.allocated_gpu_milli / c.total_gpu_milli if c.total_gpu_milli else 0.0
    return snap
