from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.framework import CycleContext
from gpuaware.scheduler.core.gpu_specs import spec_of
from gpuaware.scheduler.core.status import Code


class Capabilities:
    """Filter: GPU models that meet the workload's required capabilities.

    ``min_gpu_memory_gib``, ``min_memory_bandwidth_gbs``, ``needs_tensor_cores``, ``needs_nvlink``.
    A model whose capabilities are not published (openb's G1-G3) passes only requests that ask none.
    """

    name = "capabilities"
    code = Code.GPU_CAPABILITIES
    reason = "gpu capabilities"

    def filter_nodes(self, ctx: CycleContext) -> np.ndarray:
        w, c = ctx.workload, ctx.cluster
        if not w.num_gpu or not w.requires_capabilities:
            return np.ones(len(c), dtype=bool)
        ok_model = {}
        for m in c.model_names:
            s = spec_of(m)
            ok_model[m] = s is not None and (
                s.memory_gib >= w.min_gpu_memory_gib and s.memory_bandwidth_gbs >= w.min_memory_bandwidth_gbs
                and (s.tensor_cores or not w.needs_tensor_cores)
                and (s.nvlink or not w.needs_nvlink))
        return np.array([ok_model[m] for m in c.models], dtype=bool)
