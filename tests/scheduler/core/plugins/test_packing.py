"""GPU packing."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.plugins.packing import GpuPacking
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_packing_fills_a_shared_gpu_first():
    c = cluster(2, 2)
    c.allocate(Allocation("half", 1, [1], [500], 1000, 1024))
    d = scheduler_with(GpuPacking()).schedule(c, Workload("w", 1000, 1024, 1, 300))
    assert (d.allocation.node, d.allocation.gpus) == (1, [1])
