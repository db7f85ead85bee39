from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.throughput import ThroughputTable


class InterferenceAware:
    """Score: for a fractional workload, the combined speed of it and the GPU's residents after sharing.

    Uses Gavel's co-location measurements: the worst pairwise slowdown each side would see.
    GPUs nobody shares yet score 1; classes come from the ``gavel_class`` label.
    """

    name = "interference"

    def __init__(self, table: ThroughputTable, classes: dict[str, str]):
        self.table = table
        self.classes = classes  # workload id -> gavel class, for the workloads already placed

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        job = w.labels.get("gavel_class")
        out = np.ones(len(cand))
        if not job or not w.shares_gpu:
            return out
        residents: dict[tuple[int, int], list[str]] = {}
        for a in c.allocations.values():
            other = self.classes.get(a.workload_id)
            if other and a.sharing == "shared":
                for g in a.gpus:
                    residents.setdefault((a.node, g), []).append(other)
        for i, (n, g) in enumerate(zip(cand.node, cand.gpu, strict=True)):
            others = residents.get((int(n), int(g)))
            if others:
                model = str(c.models[n])
                mine = min(self.table.colocated_speed(job, o, model) for o in others)
                theirs = min(self.table.colocated_speed(o, job, model) for o in others)
                out[i] = (mine + theirs) / 2
        return out
