from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import CycleContext
from gpuaware.scheduler.core.status import Code


class ModelAffinity:
    """Filter: only nodes whose GPU model the workload allows (``gpu_spec`` in openb)."""

    name = "model-affinity"
    code = Code.GPU_MODEL_MISMATCH
    reason = "gpu model not allowed"

    def filter_nodes(self, ctx: CycleContext) -> np.ndarray:
        models = ctx.workload.models
        if not models or ctx.workload.num_gpu == 0:
            return np.ones(len(ctx.cluster), dtype=bool)
        return np.isin(ctx.cluster.models, list(models))
