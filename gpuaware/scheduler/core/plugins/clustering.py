from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class Clustering:
    """Score: put a workload where workloads of the same GPU shape already run (one shape per node)."""

    name = "clustering"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        same = c.shape_count(w.num_gpu, w.gpu_milli)[cand.node]
        total = c.node_workloads[cand.node]
        return same - 0.5 * (total - same)
