"""Score, CPU-only workloads: leave a node the CPU its free GPUs will need.

A GPU is only as usable as the CPU beside it: a node whose cores went to CPU-only pods strands its
free GPUs. FGD sees this only when a task type stops fitting; this score charges a CPU-only placement
for every core it takes below what the node's free GPUs need at the mix's CPU per GPU, so CPU-only
work goes first where CPU is spare (CPU-rich nodes, nodes whose GPUs are taken).
"""

from __future__ import annotations

import numpy as np

from scheduler.core.framework import Candidates, CycleContext


class CpuForGpus:
    name = "cpu_for_gpus"

    def __init__(self, cpu_per_gpu: float):
        self.cpu_per_gpu = cpu_per_gpu  # milli-CPU per whole GPU of GPU workloads in the mix

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        if w.num_gpu:
            return np.zeros(len(cand))
        n = cand.node
        needed = np.where(c.gpu_exists[n], c.gpu_free[n], 0).sum(axis=1) / 1000 * self.cpu_per_gpu
        short_before = np.maximum(0.0, needed - c.cpu_free[n])
        short_after = np.maximum(0.0, needed - (c.cpu_free[n] - w.cpu_milli))
        return -(short_after - short_before)
