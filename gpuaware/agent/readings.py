"""Typed per-GPU data every collector returns. ``None`` means unsupported or not read, never zero."""

from __future__ import annotations

from dataclasses import dataclass, field

# NVML clocks-event (throttle) reason bits, as in nvml.h.
THROTTLE_GPU_IDLE = 0x1
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SYNC_BOOST = 0x10
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
POWER_THROTTLE_MASK = THROTTLE_SW_POWER_CAP | THROTTLE_HW_POWER_BRAKE
THERMAL_THROTTLE_MASK = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL | THROTTLE_HW_SLOWDOWN

# XIDs that mean the GPU itself is failing (NVIDIA's XID catalogue), as opposed to an application
# fault (13, 31, 43, ...): fallen off the bus, double-bit ECC, row-remap failure, uncontained ECC,
# NVLink, GSP and resets.
CRITICAL_XIDS = frozenset({48, 61, 62, 64, 74, 79, 92, 94, 95, 109, 119, 120, 140})
MEMORY_XIDS = frozenset({48, 63, 64, 94, 95})


@dataclass(slots=True)
class GpuDevice:
    """What does not change while the agent runs: read once and cached."""

    uuid: str
    index: int
    model: str
    pci_bus_id: str
    fb_total_mib: int
    power_limit_w: float | None = None
    power_max_w: float | None = None
    idle_power_w: float | None = None
    slowdown_temp_c: float | None = None
    shutdown_temp_c: float | None = None
    nvlink_peers: list[str] = field(default_factory=list)
    mig_enabled: bool | None = None
    gpm_supported: bool = False
    driver_version: str = ""

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"


@dataclass(slots=True)
class GpuProcess:
    pid: int
    used_mib: int | None
    sm_util: float | None = None  # % of the GPU's SMs over NVML's last process-utilisation window


@dataclass(slots=True)
class MigReading:
    """One MIG GPU instance (DCGM's ``GPU_I_ID``/``GPU_I_PROFILE`` labels)."""

    gi_id: int
    profile: str  # e.g. "3g.40gb"
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    gr_engine_active: float | None = None  # ratio 0-1 (GPM, Hopper+)


@dataclass(slots=True)
class Reading:
    """One read of one GPU. ``full=False`` reads carry only the cheap watch fields."""

    ts: float
    full: bool = True
    util_gpu: float | None = None
    util_mem: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temp_c: float | None = None
    mem_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = None
    throttle_reasons: int | None = None
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_failure: bool | None = None
    pcie_tx_kib_s: int | None = None
    pcie_rx_kib_s: int | None = None
    pcie_replays: int | None = None
    nvlink_crc_errors: int | None = None
    util_enc: float | None = None
    util_dec: float | None = None
    fb_reserved_mib: float | None = None
    nvlink_bandwidth_kib: int | None = None  # counter, all links, TX + RX
    processes: list[GpuProcess] | None = None
    mig_instances: int | None = None
    mig: list[MigReading] | None = None
    # Profiling metrics (GPM on Hopper+), in DCGM's units: ratios 0-1 and bytes/s. PCIe bytes/s come
    # from nvmlDeviceGetPcieThroughput where there is no GPM.
    prof_gr_engine_active: float | None = None
    prof_sm_active: float | None = None
    prof_sm_occupancy: float | None = None
    prof_tensor_active: float | None = None
    prof_dram_active: float | None = None
    prof_pcie_tx_bytes: float | None = None
    prof_pcie_rx_bytes: float | None = None
    read_s: float | None = None  # how long the read took (telemetry collapse: docs/health.md)


@dataclass(slots=True)
class XidEvent:
    gpu_index: int
    ts: float
    xid: int


class GpuLost(RuntimeError):
    """The GPU stopped answering (fallen off the bus, driver reset)."""
