"""The GPU-model filter."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.workload import Workload
from tests.support import scheduler_with


def test_model_affinity_keeps_workloads_on_allowed_models():
    c = ClusterState([NodeSpec("t4", 32000, 65536, 2, "T4"), NodeSpec("v100", 32000, 65536, 2, "V100")])
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("w", 1000, 1024, 1, 1000, models=("V100",)))
    assert c.names[d.allocation.node] == "v100"
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("x", 1000, 1024, 1, 1000, models=("A100",)))
    assert d.allocation is None and "gpu model not allowed" in d.reasons[0]
