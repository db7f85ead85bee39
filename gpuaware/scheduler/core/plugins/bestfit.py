from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class BestFit:
    """Score: the tightest fit: least free resource left on the node (and on the GPU) after placement."""

    name = "best-fit"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        # Per node once, then gathered: candidates outnumber nodes for workloads on one GPU.
        node_left = ((c.cpu_free - w.cpu_milli) / np.maximum(c.cpu_cap, 1)
                     + (c.mem_free - w.memory_mib) / np.maximum(c.mem_cap, 1)
                     + (c.gpu_free.sum(axis=1) - w.gpu_milli_total) / np.maximum(c.gpu_cap.sum(axis=1), 1))
        left = node_left[n]
        if w.num_gpu == 1:
            left = left + (c.gpu_free[n, cand.gpu] - w.gpu_milli) / 1000.0
        return -left
