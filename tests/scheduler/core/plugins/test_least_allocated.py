"""Spreading (least allocated) against packing (best fit)."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.plugins.bestfit import BestFit
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_least_allocated_spreads_and_best_fit_packs():
    c = cluster(4, 4)
    c.allocate(Allocation("busy", 0, [0, 1], [1000, 1000], 8000, 1024))
    assert scheduler_with(LeastAllocated()).schedule(c, Workload("a", 1000, 1024, 1, 1000)).allocation.node == 1
    assert scheduler_with(BestFit()).schedule(c, Workload("b", 1000, 1024, 1, 1000)).allocation.node == 0
