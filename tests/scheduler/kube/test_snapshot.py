"""queue_snapshot: the gauges from the cache (pending, quota, use, borrowing, fairness) and the live state."""

from __future__ import annotations

import time

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.snapshot import queue_snapshot


def cache() -> ClusterCache:
    c = ClusterCache(scheduler_name="gpuaware")
    c.sync_nodes([make_node("n0", gpus=4)])
    c.sync_queues([{"metadata": {"name": t}, "spec": {"tenant": t, "namespaces": [t], "weight": w,
                                                      "quota": [{"model": "*", "gpus": 1}]}}
                   for t, w in (("a", 2), ("b", 1))])
    bound = make_pod("run", namespace="a", gpus=2)
    bound["spec"]["nodeName"] = "n0"
    c.sync_pods([bound, make_pod("wait", namespace="b", gpus=8, priority=200_000)])
    return c


def test_pending_use_quota_and_borrowing_per_tenant():
    now = time.time()
    snap = queue_snapshot(cache().view(), None, now)
    assert snap.pending == {("b", "high"): 1}
    assert snap.oldest_wait_s[("b", "high")] >= 0
    assert snap.gpus_quota == {"a": 1.0, "b": 1.0}
    assert snap.gpus_used == {"a": 2.0} and snap.gpus_borrowed == {"a": 1.0}
    assert snap.running == 1 and snap.allocated_gpu_share == 0.5
    assert snap.jain is not None and snap.jain < 1.0  # b uses nothing of its share
    assert snap.allocated_busy_ratio is None and snap.stale_gpus == 0  # no live state: nothing to say


def test_live_state_adds_utilisation_of_the_allocated_gpus_and_stale_gpus():
    view = StateView(stale_after_ms=1000)
    snap = queue_snapshot(cache().view(), view, time.time())
    assert snap.allocated_busy_ratio == 0.0
    assert snap.stale_gpus == 0
