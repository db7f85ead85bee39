"""Score: spread heat-limited work by live temperature and power headroom.

Headroom of a GPU = the smaller of (slowdown temperature - temperature) / slowdown temperature and
(power limit - power draw) / power limit, from the stream's live state; a multi-GPU workload reads its
node's tightest GPU. A GPU at its slowdown temperature or power limit clocks down whatever runs on it,
so new work goes where there is margin. Only a shortage counts: headroom above ``near`` (default 15%:
about 13 C below slowdown, or 15% under the power limit) scores the same everywhere, so a cool cluster
leaves placement to the packing scores (normalised per cycle, a temperature spread of a few degrees
would otherwise outweigh FGD and spread work for nothing). A GPU without live state scores the mean
of the live ones; with none live the score is flat (the other scores decide).
"""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext

SIGNAL = "thermal"
SLOWDOWN_C = 85.0  # HW slowdown of current data-centre GPUs is 84-87 C (gpuaware/agent/collectors/sim.py MODELS)


def headroom(c) -> np.ndarray:
    temp = (SLOWDOWN_C - c.temp) / SLOWDOWN_C
    power = np.where(c.power_limit > 0, (c.power_limit - c.power) / np.maximum(c.power_limit, 1e-9), 1.0)
    return np.clip(np.minimum(temp, power), 0.0, 1.0)


class PowerHeadroom:
    name = "power-headroom"
    signal = SIGNAL

    def __init__(self, near: float = 0.15):
        self.near = near

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        c, w = ctx.cluster, ctx.workload
        if w.num_gpu == 0 or not c.live[cand.node].any():
            return np.zeros(len(cand))
        room = np.where(c.live, np.minimum(headroom(c), self.near), np.nan)
        if w.num_gpu == 1:
            out = room[cand.node, cand.gpu]
        else:
            rows = np.where(c.gpu_exists[cand.node], room[cand.node], np.inf)
            out = np.where(np.isinf(rows.min(axis=1)), np.nan, rows.min(axis=1))
        if np.isnan(out).all():
            return np.zeros(len(cand))
        ctx.signals.add(SIGNAL)
        return np.where(np.isnan(out), np.nanmean(out), out)
