from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class DotProduct:
    """Score: alignment of the request with the node's free vector (Tetris, SIGCOMM'14), both normalized."""

    name = "dot-product"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        cpu_cap, mem_cap = np.maximum(c.cpu_cap[n], 1), np.maximum(c.mem_cap[n], 1)
        gcap = np.maximum(c.gpu_cap[n].sum(axis=1), 1)
        req = np.stack([w.cpu_milli / cpu_cap, w.memory_mib / mem_cap, w.gpu_milli_total / gcap], axis=1)
        free = np.stack([c.cpu_free[n] / cpu_cap, c.mem_free[n] / mem_cap, c.gpu_free[n].sum(axis=1) / gcap], axis=1)
        dot = (req * free).sum(axis=1)
        if w.num_gpu == 1:
            # The same idea inside the node: the GPU whose free share is closest to the request.
            dot = dot - 1e-3 * (c.gpu_free[n, cand.gpu] - w.gpu_milli) / 1000.0
        return -dot  # Tetris picks the largest alignment of *remaining* demand; smaller = less waste here
