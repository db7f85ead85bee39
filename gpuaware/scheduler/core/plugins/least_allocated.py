from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class LeastAllocated:
    """Score: kube-scheduler's NodeResourcesFit LeastAllocated: the emptiest node after placement wins."""

    name = "least-allocated"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        n = cand.node
        cpu = (c.cpu_free[n] - w.cpu_milli) / np.maximum(c.cpu_cap[n], 1)
        mem = (c.mem_free[n] - w.memory_mib) / np.maximum(c.mem_cap[n], 1)
        gcap = np.maximum(c.gpu_cap[n].sum(axis=1), 1)
        gpu = (c.gpu_free[n].sum(axis=1) - w.gpu_milli_total) / gcap
        return (cpu + mem + gpu) / 3
