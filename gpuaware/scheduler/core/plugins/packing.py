from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class GpuPacking:
    """Score: keep whole GPUs and nodes free: shared GPUs first, then the most-used node."""

    name = "gpu-packing"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        node_used = 1 - c.gpu_free[n].sum(axis=1) / np.maximum(c.gpu_cap[n].sum(axis=1), 1)
        if w.num_gpu == 1:
            gpu_used = 1 - c.gpu_free[n, cand.gpu] / 1000.0
            return 2 * gpu_used + node_used
        return node_used
