"""What a simulator scenario may say: the GPU models it names, its workloads, faults and rooms, and where the
scenario files are (``gpuaware/agent/scenarios``). The simulator (``sim``) plays them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpuaware.contract.events import HealthAction, HealthVerdict


@dataclass(frozen=True)
class ModelSpec:
    name: str
    fb_total_mib: int
    board_power_w: float
    idle_power_w: float
    slowdown_temp_c: float
    shutdown_temp_c: float
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    c_per_w: float  # steady-state temperature rise per watt
    nvlink: bool
    arch: str
    # NVML GPM (the DCGM_FI_PROF_* source without DCGM) exists on Hopper and newer only.
    gpm: bool
    fb_reserved_mib: int  # what the driver keeps back (nvmlDeviceGetMemoryInfo_v2 "reserved")
    pcie_gbs: float  # PCIe host link, GB/s per direction


MODELS: dict[str, ModelSpec] = {
    "H100": ModelSpec("NVIDIA H100 80GB HBM3", 81559, 700, 70, 87, 92, 1980, 2619, 0.045, True, "Hopper", True, 553,
                      64),
    "A100": ModelSpec("NVIDIA A100-SXM4-80GB", 81920, 400, 55, 85, 92, 1410, 1593, 0.075, True, "Ampere", False, 536,
                      32),
    "V100": ModelSpec("Tesla V100-SXM2-32GB", 32768, 300, 40, 84, 90, 1530, 877, 0.10, True, "Volta", False, 309, 16),
    "T4": ModelSpec("Tesla T4", 15360, 70, 10, 85, 94, 1590, 5001, 0.45, False, "Turing", False, 255, 16),
    "L4": ModelSpec("NVIDIA L4", 23034, 72, 12, 87, 95, 2040, 6251, 0.42, False, "Ada Lovelace", False, 310, 32),
    # Framebuffer sizes as nvidia-smi reports them (NVIDIA L40S 46068 MiB, A10 23028, H200 143771, B200 183359).
    # A10: slowdown 95 °C, shutdown 98 °C, as a public `nvidia-smi -q` log of an A10G (AWS's A10) prints them.
    # L40S and H200: their drivers print the limits as margins to the maximum operating temperature ("T.Limit"):
    # public `nvidia-smi -q` logs (driver 550) give slowdown 2 °C past it on both, shutdown 5 °C (L40S) and 8 °C
    # (H200) past it, and 57 and 59 °C of margin at 30 and 28 °C: a maximum operating temperature of 87 °C, so
    # slowdown 89 °C, shutdown 92 and 95 °C (docs/health.md, "Boards"). B200: no log found; simulator values.
    "L40S": ModelSpec("NVIDIA L40S", 46068, 350, 35, 89, 92, 2520, 9001, 0.12, False, "Ada Lovelace", False, 620, 32),
    "A10": ModelSpec("NVIDIA A10", 23028, 150, 20, 95, 98, 1695, 6251, 0.25, False, "Ampere", False, 340, 32),
    "H200": ModelSpec("NVIDIA H200", 143771, 700, 75, 89, 95, 1980, 3201, 0.045, True, "Hopper", True, 620, 64),
    "B200": ModelSpec("NVIDIA B200", 183359, 1000, 110, 87, 92, 1965, 3996, 0.035, True, "Blackwell", True, 700, 64),
}


WorkloadKind = Literal["trace", "training-compute", "training-memory", "inference-bursty", "idle-holding",
                       "diurnal-serving", "mixed-training"]

# Faults that take a GPU to a limit some time after they start (slowdown temperature, memory exhausted):
# judged by whether they get there and by the lead time of the warning (evaluation, `gpuaware up`).
LIMIT_FAULTS = frozenset({"thermal_runaway", "thermal_drift", "fan_failure", "memory_leak", "memory_wear"})
FaultKind = Literal["ecc_sbe_storm", "ecc_dbe", "xid", "thermal_runaway", "power_cap", "stuck_util", "dead",
                    "telemetry_collapse", "clock_degraded", "power_skew", "thermal_drift", "fan_failure",
                    "memory_leak", "memory_wear"]


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    node: int = Field(ge=0)
    gpu: int = Field(ge=0)
    at_s: float = Field(ge=0, description="seconds after the scenario starts")
    duration_s: float | None = Field(None, gt=0, description="None: until the end")
    rate_per_s: float = Field(50.0, gt=0, description="ecc_sbe_storm: errors per second")
    xid: int = Field(79, ge=1, description="xid: the XID code")
    rise_c_per_s: float = Field(1.0, gt=0, description="thermal_runaway: extra heating per second")
    cap_w: float | None = Field(None, gt=0, description="power_cap: watts (default 45% of board power)")
    every_s: float | None = Field(None, gt=0, description="xid: repeated this often while active")
    period_s: float | None = Field(None, gt=0, description="power_cap: on for half of each period (flapping)")
    clock_factor: float = Field(0.8, gt=0, lt=1, description=(
        "clock_degraded: SM clock as a share of its peers' under the same load, with no throttle reason "
        "(a degraded board: a PLL or voltage regulator that no longer reaches its clocks)"))
    power_factor: float = Field(1.45, gt=0, description=(
        "power_skew: board power drawn as a multiple of a healthy board's at the same utilisation "
        "(a failing VRM: conversion losses above 1, a missing phase or lost load below 1); heat follows it"))
    drift_c_per_s: float = Field(0.1, gt=0, description=(
        "thermal_drift: the temperature the GPU settles at rises this fast (fins clogging, thermal paste "
        "pumping out): unbounded, it ends at slowdown"))
    fan_factor: float = Field(1.5, gt=1, description=(
        "fan_failure: thermal resistance (°C per W) multiplied by this once the fan has spun down"))
    ramp_s: float = Field(30.0, gt=0, description="fan_failure: seconds for the fan to spin down (its rotor's inertia)")
    leak_mib_per_s: float = Field(20.0, gt=0, description="memory_leak: framebuffer leaked per second")
    remaps_per_min: float = Field(6.0, gt=0, description=(
        "memory_wear: rows remapped (pages retired before Ampere) per minute, each after two correctable errors"))
    verdict: HealthVerdict | None = Field(None, description="the verdict expected (default: by kind, evaluation)")
    action: HealthAction | None = Field(None, description="the action expected (default: by kind, evaluation)")

    def active(self, t: float) -> bool:
        if self.period_s is not None and (t - self.at_s) % self.period_s >= self.period_s / 2:
            return False
        return t >= self.at_s and (self.duration_s is None or t < self.at_s + self.duration_s)


class Room(BaseModel):
    """The room a node stands in warming (a cooling unit failing, a hot aisle): every GPU of the node takes in
    warmer air. Not a GPU fault: its GPUs share it, so none is judged faulty (docs/health.md, "Peers")."""

    model_config = ConfigDict(extra="forbid")

    node: int = Field(ge=0)
    at_s: float = Field(ge=0, description="seconds after the scenario starts")
    rise_c: float = Field(gt=0, description="how much warmer the inlet air gets")
    ramp_s: float = Field(600.0, gt=0, description="seconds it takes to get there (linearly)")
    duration_s: float | None = Field(None, gt=0, description="None: until the end; then back at once")

    def rise(self, t: float) -> float:
        if t < self.at_s or (self.duration_s is not None and t >= self.at_s + self.duration_s):
            return 0.0
        return self.rise_c * min(1.0, (t - self.at_s) / self.ramp_s)


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    seed: int = 0
    duration_s: float = Field(1800, gt=0)
    nodes: int = Field(2, ge=1, le=4096)
    gpus_per_node: int = Field(8, ge=1, le=16)
    models: list[str] = Field(default_factory=lambda: ["H100", "A100"], min_length=1)
    node_prefix: str = "sim-node"
    jitter_pct: float = Field(0.5, ge=0, le=20, description="utilisation jitter, percentage points")
    workloads: list[WorkloadKind] = Field(
        default_factory=lambda: ["trace"], min_length=1,
        description="per GPU, cycled: 'trace' replays GenTD26; the others are synthetic workload kinds")
    faults: list[Fault] = Field(default_factory=list)
    rooms: list[Room] = Field(default_factory=list, description="rooms warming: environment, not a GPU fault")
    mig: dict[int, list[str]] = Field(
        default_factory=dict, description="GPU index (on every node) -> MIG profiles of its GPU instances")
    shared: dict[int, int] = Field(
        default_factory=dict, description="GPU index (on every node) -> pods time-sharing it (per-pod attribution)")
    library: bool = Field(True, description="part of the evaluation library (eval sampling, fault tests)")

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise ValueError(f"models: unknown {unknown}; known: {sorted(MODELS)}")
        for i, f in enumerate(self.faults):
            if f.node >= self.nodes or f.gpu >= self.gpus_per_node:
                raise ValueError(f"faults.{i}: node {f.node} gpu {f.gpu} is outside {self.nodes}x{self.gpus_per_node}")
        for i, room in enumerate(self.rooms):
            if room.node >= self.nodes:
                raise ValueError(f"rooms.{i}: node {room.node} is outside {self.nodes} nodes")
        return self

    def node_name(self, i: int) -> str:
        return f"{self.node_prefix}-{i:03d}"


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    if not p.exists() and not p.suffix:
        p = SCENARIO_DIR / f"{p.name}.yaml"
    try:
        return Scenario.model_validate(yaml.safe_load(p.read_text()))
    except OSError as exc:
        raise ValueError(f"scenario {p}: cannot read: {exc.strerror}") from exc
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"scenario {p}: {exc}") from exc


SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def scenario_library() -> list[Path]:
    """The scenarios `gpuaware eval sampling` and the fault tests run (not the long `gpuaware up` demo)."""
    return sorted(p for p in SCENARIO_DIR.glob("*.yaml") if load_scenario(p).library)
