"""Clustering like-shaped work."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.plugins.clustering import Clustering
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_clustering_puts_like_with_like():
    c = cluster(4, 4)
    c.allocate(Allocation("same-shape", 1, [0], [300], 1000, 1024))
    c.allocate(Allocation("other-shape", 0, [0], [1000], 1000, 1024))
    d = scheduler_with(Clustering()).schedule(c, Workload("w", 1000, 1024, 1, 300))
    assert d.allocation.node == 1
