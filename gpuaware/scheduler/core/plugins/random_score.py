from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext


class RandomScore:
    """Score: uniform random among feasible candidates (seeded)."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        return self.rng.random(len(cand))
