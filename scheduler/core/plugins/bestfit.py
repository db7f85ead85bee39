from __future__ import annotations

import numpy as np

from scheduler.core.framework import Candidates, CycleContext


class BestFit:
    """Score: the tightest fit: least free resource left on the node (and on the GPU) after placement."""

    name = "best-fit"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        left = ((c.cpu_free[n] - w.cpu_milli) / np.maximum(c.cpu_cap[n], 1)
                + (c.mem_free[n] - w.memory_mib) / np.maximum(c.mem_cap[n], 1)
                + (c.gpu_free[n].sum(axis=1) - w.gpu_milli_total) / np.maximum(c.gpu_cap[n].sum(axis=1), 1))
        if w.num_gpu == 1:
            left = left + (c.gpu_free[n, cand.gpu] - w.gpu_milli) / 1000.0
        return -left
