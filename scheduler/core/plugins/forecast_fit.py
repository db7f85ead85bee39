"""Filter and score shared GPUs by forecast headroom: the upper end of the stream's utilisation and memory
forecasts over the planning horizon, not the residents' requested shares.

A fractional workload needs ``gpu_milli`` of compute and (its ``gpu_memory_mib``, else the same share of
the GPU's memory) of memory. On a GPU with live stream state:

- filter: the forecast memory upper bound plus the newcomer's need, grown by ``mem_margin`` (the
  overcommit safety margin: a forecast miss must not OOM a co-tenant), must fit the GPU's memory;
- score: best fit on forecast utilisation: the busiest GPU whose forecast upper bound still leaves the
  newcomer's share free, so spiky and idle residents share with new work instead of whole GPUs.

A GPU without live state (``cluster.live`` False: no stream, or stale) counts its requested shares as
its forecast; with no live GPU among the candidates the score is flat and the filter passes all, so
a cluster without the stream places exactly as before.
Whole-GPU and CPU-only workloads score flat: this is about shared GPUs.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.framework import Candidates, CycleContext
from scheduler.core.status import Code

SIGNAL = "forecast"


class ForecastFit:
    name = "forecast-fit"
    signal = SIGNAL
    code = Code.FORECAST_HEADROOM
    reason = "forecast memory headroom"

    def __init__(self, mem_margin: float = 0.15):
        self.mem_margin = mem_margin

    def _mem_need(self, ctx: CycleContext) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        if w.gpu_memory_mib:
            return np.full(c.gpu_mem_cap.shape, float(w.gpu_memory_mib))
        return c.gpu_mem_cap * (w.gpu_milli / 1000.0)

    def filter_gpus(self, ctx: CycleContext) -> np.ndarray:
        c = ctx.cluster
        if not ctx.workload.shares_gpu or not c.live.any():
            return np.ones_like(c.gpu_exists)
        fits = c.forecast_mem + self._mem_need(ctx) * (1 + self.mem_margin) <= c.gpu_mem_cap
        return ~c.live | (c.gpu_mem_cap == 0) | fits

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        n, g = cand.node, cand.gpu
        live = c.live[n, g] if w.shares_gpu else None
        if live is None or not live.any():
            return np.zeros(len(cand))
        requested = (c.gpu_cap[n, g] - c.gpu_free[n, g]) / 10.0
        used = np.where(live, c.forecast_util[n, g], requested)
        ctx.signals.add(SIGNAL)
        return used  # best fit: the fullest forecast that passed the filters
