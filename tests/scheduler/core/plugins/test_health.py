"""The health filter."""

from __future__ import annotations

from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_critical_gpus_take_nothing_and_degraded_only_preemptible_work():
    c = cluster(2)
    c.set_band(0, 0, HealthBand.CRITICAL)
    c.set_band(0, 1, HealthBand.DEGRADED)
    s = scheduler_with(LeastAllocated())
    assert s.schedule(c, Workload("strict", 0, 0, 1, 500, preemptible=False)).allocation is None
    d = s.schedule(c, Workload("batch", 0, 0, 1, 500, preemptible=True))
    assert d.allocation.gpus == [1]
