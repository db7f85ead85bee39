"""Capability requests pick the GPU models that meet them."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.workload import Workload


def test_capability_requests_pick_models_that_meet_them():
    from gpuaware.scheduler.core.plugins.capabilities import Capabilities

    c = ClusterState([NodeSpec("p100", 32000, 65536, 2, "P100"), NodeSpec("t4", 32000, 65536, 2, "T4"),
                      NodeSpec("a100", 32000, 65536, 2, "NVIDIA A100-SXM4-80GB"),
                      NodeSpec("g2", 32000, 65536, 8, "G2")])
    s = Scheduler(Profile("t", [Capabilities()], [(LeastAllocated(), 1.0)]))
    tensor = s.schedule(c, Workload("tc", 0, 0, 1, 1000, needs_tensor_cores=True, min_gpu_memory_gib=20))
    assert c.names[tensor.allocation.node] == "a100"
    nvlink_tc = s.schedule(c, Workload("nv", 0, 0, 1, 1000, needs_nvlink=True, min_memory_bandwidth_gbs=800))
    assert c.names[nvlink_tc.allocation.node] == "a100"
    none = s.schedule(c, Workload("x", 0, 0, 1, 1000, min_gpu_memory_gib=100))
    assert none.allocation is None and "gpu capabilities" in none.reasons[0]
    plain = s.schedule(c, Workload("plain", 0, 0, 1, 1000))  # no capability asked: any model, G2 included
    assert plain.allocation is not None
