from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.throughput import ThroughputTable


class HeterogeneityAffinity:
    """Score: the workload's relative throughput on each candidate's GPU model (Gavel, learned online).

    The workload's class comes from its ``gavel_class`` label (e.g. "ResNet-50 (batch size 64)");
    a workload without one scores the same everywhere.
    """

    name = "heterogeneity"

    def __init__(self, table: ThroughputTable):
        self.table = table

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        job = ctx.workload.labels.get("gavel_class")
        if not job:
            return np.zeros(len(cand))
        models = ctx.cluster.model_names
        rel = np.array(self.table.relative(job, models))
        return rel[ctx.cluster.model_id[cand.node]]
