"""Score: leave every node the CPU its free GPUs will need.

A GPU is only as usable as the CPU beside it. FGD sees CPU only at the cliff, when a task type stops
fitting a node; until then it packs CPU-hungry pods next to free GPUs as readily as lean ones, and on
the openb traces the cluster ends with GPUs free on nodes whose cores are gone (about 0.6% of all GPU
capacity, multigpu30 at 130% load). This score keeps a node's free CPU in step with its free GPUs:
a node is short by ``free GPUs x CPU per GPU of the mix - free CPU`` (never below zero), and a
placement is charged for the shortage it adds. CPU-only work then goes where CPU is spare, and a
CPU-hungry GPU pod to a node with CPU to spare for it.
"""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class CpuForGpus:
    name = "cpu_for_gpus"

    def __init__(self, cpu_per_gpu: float):
        self.cpu_per_gpu = cpu_per_gpu  # milli-CPU per whole GPU of GPU workloads in the mix

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        # Per node once, then per candidate: one-GPU workloads have a candidate per free GPU.
        gpus_free = (np.where(c.gpu_exists, c.gpu_free, 0).sum(axis=1) / 1000)[n]
        short_before = np.maximum(0.0, gpus_free * self.cpu_per_gpu - c.cpu_free[n])
        short_after = np.maximum(0.0, (gpus_free - w.gpu_milli_total / 1000) * self.cpu_per_gpu
                                 - (c.cpu_free[n] - w.cpu_milli))
        return -(short_after - short_before)
