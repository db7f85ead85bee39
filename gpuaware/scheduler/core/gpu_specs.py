"""Published capabilities of GPU models (vendor data sheets), for capability-based requests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    memory_gib: float
    memory_bandwidth_gbs: float
    tensor_cores: bool
    nvlink: bool


SPECS: dict[str, GpuSpec] = {
    "K80": GpuSpec(12, 240, False, False),
    "P100": GpuSpec(16, 732, False, True),
    "T4": GpuSpec(16, 320, True, False),
    "V100M16": GpuSpec(16, 900, True, True),
    "V100M32": GpuSpec(32, 900, True, True),
    "V100": GpuSpec(32, 900, True, True),
    "A10": GpuSpec(24, 600, True, False),
    "A100": GpuSpec(80, 2039, True, True),
    "L4": GpuSpec(24, 300, True, False),
    "H100": GpuSpec(80, 3350, True, True),
}


def spec_of(model: str) -> GpuSpec | None:
    """The spec of a model by its short name or a full NVML name ("NVIDIA H100 80GB HBM3")."""
    if model in SPECS:
        return SPECS[model]
    tokens = model.replace("-", " ").split()
    return next((SPECS[t] for t in tokens if t in SPECS), None)
