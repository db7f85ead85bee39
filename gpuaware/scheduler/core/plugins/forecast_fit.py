"""Filter and score shared GPUs by forecast headroom: the upper end of the stream's utilisation and memory
forecasts over the planning horizon, not the residents' requested shares.

A fractional workload needs ``gpu_milli`` of compute and (its ``gpu_memory_mib``, else the same share of
the GPU's memory) of memory. On a GPU with live stream state:

- filter: the residents' forecast memory upper bound grown by ``mem_margin`` (the overcommit safety
  margin: a forecast miss must not OOM a co-tenant), but never more than the memory they were charged
  (a request is a limit), plus the newcomer's need, must fit the GPU's memory. The margin is never applied
  to the newcomer, whose request is a known limit: pairs that fit by request are not turned away;
- score: best fit on forecast memory: the GPU whose forecast memory upper bound the newcomer fills the
  most. Memory, not compute, is what bounds sharing (GenTD26 serving pods average a 6.5% duty cycle but
  hold 64% of their peak memory), so packing by the compute forecast alone spread memory-heavy tenants
  and, weighed against FGD, fragmented the cluster (docs/scheduling.md "The ablation").

A GPU without live state (``cluster.live`` False: no stream, or stale) counts its requested shares as
its forecast; with no live GPU among the candidates the score is flat and the filter passes all, so
a cluster without the stream places exactly as before.
Whole-GPU and CPU-only workloads score flat: this is about shared GPUs.
"""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.status import Code

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
        residents = c.forecast_mem * (1 + self.mem_margin)
        charged = (c.gpu_mem_cap - c.gpu_mem_free).astype(np.float64)
        # Residents that were charged memory cannot use more than that: the margin covers the forecast's
        # miss, not a bound that is already known (a newcomer's own request is one too).
        residents = np.where(charged > 0, np.minimum(residents, charged), residents)
        fits = residents + self._mem_need(ctx) <= c.gpu_mem_cap
        return ~c.live | (c.gpu_mem_cap == 0) | fits

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        n, g = cand.node, cand.gpu
        live = c.live[n, g] if w.shares_gpu else None
        if live is None or not live.any():
            return np.zeros(len(cand))
        cap = np.maximum(c.gpu_mem_cap[n, g].astype(np.float64), 1.0)
        requested = (c.gpu_mem_cap[n, g] - c.gpu_mem_free[n, g]) / cap
        used = np.where(live, c.forecast_mem[n, g] / cap, requested)
        ctx.signals.add(SIGNAL)
        return np.minimum(used, 1.0)  # best fit: the fullest memory forecast that passed the filter
