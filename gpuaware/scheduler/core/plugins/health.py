from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import CycleContext
from gpuaware.scheduler.core.status import Code


class HealthFilter:
    """Filter: critical GPUs take nothing; degraded GPUs take only preemptible work."""

    name = "gpu-health"
    code = Code.UNHEALTHY
    reason = "gpu health"

    def filter_gpus(self, ctx: CycleContext) -> np.ndarray:
        band = ctx.cluster.band
        if ctx.workload.preemptible:
            return band < 2
        return band == 0
