from __future__ import annotations

from typing import Protocol

from gpuaware.agent.readings import GpuDevice, Reading, XidEvent


class Collector(Protocol):
    """What the agent needs from a source of GPU readings.

    ``read(index, full)`` raises :class:`gpuaware.agent.readings.GpuLost` when the GPU stops answering;
    any field a GPU does not support is ``None`` in the reading.
    """

    node: str

    def devices(self) -> list[GpuDevice]: ...

    def read(self, index: int, full: bool) -> Reading: ...

    def xid_events(self) -> list[XidEvent]:
        """XID errors seen since the last call (event-driven, not polled)."""
        ...

    def gpu_resets(self) -> list[int]:
        """GPUs reset since the last call (the simulator models the reset a GPUResetRequired condition asks
        the cluster's tooling for; NVML has no reset notification, so the NVML collector reports none)."""
        ...

    def set_power_limit(self, index: int, watts: float) -> None: ...

    def reset_power_limit(self, index: int) -> None:
        """Back to the board's default power limit (a lifted cap)."""
        ...

    def close(self) -> None: ...
