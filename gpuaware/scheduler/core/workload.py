from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpuaware.scheduler.core.runtime import RuntimeEstimate


class PriorityLevel(enum.IntEnum):
    """gpuaware's priority levels. The ints are what workloads, reports and JSON carry."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2

    @property
    def label(self) -> str:
        """The metric and report label: "low", "medium", "high"."""
        return self.name.lower()


@dataclass
class Workload:
    """A request to place. ``num_gpu`` GPUs of ``gpu_milli`` each (fractions only for one GPU).

    A plain ``nvidia.com/gpu: N`` request is ``num_gpu=N, gpu_milli=1000``.
    """

    id: str
    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 1000
    gpu_memory_mib: int = 0
    # A share of one GPU's memory (a DRA consumable-capacity claim): placed on the GPU holding shares already
    # that it leaves the least memory free (``framework.tightest_share``), as memory is a hard capacity.
    memory_share: bool = False
    models: tuple[str, ...] = ()  # allowed GPU models; empty = any
    min_gpu_memory_gib: float = 0.0  # required capabilities, met by the GPU model's published specs
    min_memory_bandwidth_gbs: float = 0.0
    needs_tensor_cores: bool = False
    needs_nvlink: bool = False
    tenant: str = "default"
    priority: int = PriorityLevel.LOW  # a PriorityLevel
    qos: str = "BE"
    preemptible: bool = True
    checkpointable: bool = False
    deferrable: bool = False
    gang: str | None = None
    duration_s: float | None = None  # declared by the user (gpuaware.io/duration-s); never the simulator's truth
    runtime: RuntimeEstimate | None = None  # the runtime forecast (or the oracle ceiling's truth): core/runtime.py
    submit_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_gpu < 0 or not 0 < self.gpu_milli <= 1000:
            raise ValueError(f"{self.id}: num_gpu must be >= 0 and gpu_milli in (0, 1000]")
        if self.num_gpu > 1 and self.gpu_milli != 1000:
            raise ValueError(f"{self.id}: fractions are for one GPU only ({self.num_gpu} x {self.gpu_milli})")

    @property
    def requires_capabilities(self) -> bool:
        return bool(self.min_gpu_memory_gib or self.min_memory_bandwidth_gbs or self.needs_tensor_cores
                    or self.needs_nvlink)

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < 1000

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli if self.num_gpu else 0
