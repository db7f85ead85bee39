from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class ThermalSpread:
    """Score: cooler GPUs first, spreading heat and power across the fleet."""

    name = "thermal"

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        t = ctx.cluster.temp
        if ctx.workload.num_gpu == 1:
            return -t[cand.node, cand.gpu]
        return -t[cand.node].max(axis=1)
