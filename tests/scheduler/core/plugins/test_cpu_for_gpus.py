"""Leaving each node the CPU its free GPUs need."""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.plugins.cpu_for_gpus import CpuForGpus
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.workload import Workload
from tests.support import scheduler_with


def test_placements_leave_each_node_the_cpu_its_free_gpus_need():
    c = ClusterState([NodeSpec("gpus-free", 16000, 65536, 2, "V100"), NodeSpec("gpus-taken", 16000, 65536, 2, "V100")])
    c.allocate(Allocation("busy", 1, [0, 1], [1000, 1000], 4000, 1024))
    etl = Workload("etl", 8000, 1024, 0)
    assert c.names[scheduler_with(LeastAllocated()).schedule(c, etl).allocation.node] == "gpus-free"  # spreading
    c.release("etl")
    assert c.names[scheduler_with(CpuForGpus(cpu_per_gpu=6000.0)).schedule(c, etl).allocation.node] == "gpus-taken"
    c.release("etl")
    both = Candidates(np.array([0, 1]), np.array([-1, -1]))
    # two free GPUs need 12 cores; 16 free, 8 taken: 4 short. The other node has no free GPU to starve.
    assert CpuForGpus(6000.0).score(CycleContext(c, etl), both).tolist() == [-4000.0, 0.0]
    # A GPU pod takes its GPU's share of CPU along: a lean one leaves no shortage, a CPU-hungry one does
    one_gpu = Candidates(np.array([0]), np.array([0]))
    assert CpuForGpus(6000.0).score(CycleContext(c, Workload("lean", 4000, 1024, 1)), one_gpu).tolist() == [0.0]
    hungry = Workload("hungry", 14000, 1024, 1)  # leaves 2 cores beside a free GPU that needs 6
    assert CpuForGpus(6000.0).score(CycleContext(c, hungry), one_gpu).tolist() == [-4000.0]
