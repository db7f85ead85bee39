from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.status import Code


class ForecastHeadroom:
    """Filter and score on forecast utilisation (from ``gpu.state.v1``) for workloads that share a GPU.

    A shared GPU whose forecast utilisation plus the newcomer's expected utilisation (its
    ``expected_util`` label, else its share of the GPU) would exceed ``limit`` is filtered out;
    otherwise more headroom scores higher.
    """

    name = "forecast-headroom"
    code = Code.FORECAST_HEADROOM
    reason = "forecast headroom"

    def __init__(self, limit: float = 95.0):
        self.limit = limit

    def _need(self, ctx: CycleContext) -> float:
        w = ctx.workload
        return float(w.labels.get("expected_util", w.gpu_milli / 10))

    def filter_gpus(self, ctx: CycleContext) -> np.ndarray:
        if not ctx.workload.shares_gpu:
            return np.ones_like(ctx.cluster.gpu_exists)
        return ctx.cluster.forecast_util + self._need(ctx) <= self.limit

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        if ctx.workload.num_gpu == 0:
            return np.zeros(len(cand))
        f = ctx.cluster.forecast_util
        if ctx.workload.num_gpu == 1:
            return 100.0 - f[cand.node, cand.gpu]
        return 100.0 - f[cand.node].max(axis=1)
