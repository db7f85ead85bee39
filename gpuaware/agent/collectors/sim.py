"""Simulated GPUs that replay real utilisation and memory series, with injected faults.

Each GPU replays one pod of the Alibaba GenTD26 trace (1-minute steps, linearly interpolated to
the second, plus a small deterministic jitter). Power follows utilisation between the model's
idle and board power; temperature is a first-order thermal model of power (time constant ~40 s);
the energy counter integrates power. Faults come from a scenario file (``gpuaware/agent/scenarios``).
Given a seed and the clock, everything is deterministic: state advances in whole seconds
whatever the read pattern. Each model carries its architecture's capabilities (GPM on Hopper
only, NVLink, MIG), and ``SimPods`` plays the kubelet and ``/proc`` for time-shared GPUs. (Over
400 lines: the per-GPU model and the node view share one state and are read together. What a scenario
may say is ``scenario``.)
"""

from __future__ import annotations

import math
import time
import zlib
from array import array
from collections.abc import Callable

from gpuaware.agent import traces
from gpuaware.agent.collectors.scenario import (
    LIMIT_FAULTS,
    MODELS,
    SCENARIO_DIR,
    Fault,
    ModelSpec,
    Room,
    Scenario,
    load_scenario,
    scenario_library,
)
from gpuaware.agent.headroom import FB_EXHAUSTED, ROW_REMAP_LIMIT, wear_limit
from gpuaware.agent.podresources import PodRef
from gpuaware.agent.readings import (
    THROTTLE_GPU_IDLE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    GpuDevice,
    GpuLost,
    GpuProcess,
    MigReading,
    Reading,
    XidEvent,
)
from gpuaware.agent.rng import Pcg64

# The scenario schema lives in ``scenario``; importers of the simulator find it here too.
__all__ = ["LIMIT_FAULTS", "MODELS", "SCENARIO_DIR", "Fault", "ModelSpec", "Room", "Scenario", "SimCluster",
           "SimCollector", "SimGpu", "SimPods", "load_scenario", "physical_step", "power_for", "scenario_library"]

DRIVER_VERSION = "550.163.01"
NVLINK_KIB_PER_S_BUSY = 100e6  # ~100 GB/s of NVLink traffic at 100% utilisation

AMBIENT_C = 30.0
THERMAL_TAU_S = 40.0

# What each synthetic workload kind looks like: memory-bandwidth share of busy time, framebuffer share.
WORKLOAD_SHAPE: dict[str, tuple[float, float]] = {
    "trace": (0.6, 0.0),
    "training-compute": (0.3, 0.7),
    "training-memory": (0.9, 0.9),
    "inference-bursty": (0.5, 0.3),
    "idle-holding": (0.0, 0.4),
    "diurnal-serving": (0.5, 0.5),
    "mixed-training": (0.6, 0.8),
}


def power_for(spec: ModelSpec, work: float) -> float:
    """Board power (W) at ``work`` (0-1 of the SMs busy): between idle and board power."""
    return spec.idle_power_w + (spec.board_power_w - spec.idle_power_w) * work**0.9


def physical_step(spec: ModelSpec, util: float, temp_c: float, dt_s: float) -> tuple[float, float]:
    """(power W, temperature C) after ``dt_s`` seconds at ``util`` (0-1) from ``temp_c``: the model ``SimGpu``
    steps once a second, in one step (the simulator's scheduler ticks are minutes long)."""
    power = power_for(spec, util)
    target = AMBIENT_C + power * spec.c_per_w
    return power, target + (temp_c - target) * (1 - 1 / THERMAL_TAU_S) ** dt_s


def _jitter(seed: int, gpu: int, second: int) -> float:
    """Deterministic noise in [-1, 1) for any (seed, gpu, second), independent of read order."""
    h = (seed * 0x9E3779B1 + gpu * 0x85EBCA77 + second * 0xC2B2AE3D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return h / 2**31 - 1.0


class SimGpu:
    def __init__(self, scenario: Scenario, node: int, index: int, util: array, mem: array, offset_min: int):
        self.scenario = scenario
        self.node = node
        self.index = index
        self.gid = node * scenario.gpus_per_node + index
        self.spec = MODELS[scenario.models[self.gid % len(scenario.models)]]
        self.workload = scenario.workloads[self.gid % len(scenario.workloads)]
        self.mem_bw_share, fb_share = WORKLOAD_SHAPE[self.workload]
        self.fb_target = fb_share * self.spec.fb_total_mib
        self.util_series = util
        mem_peak = max(mem, default=0.0) or 1.0
        # Scale the pod's memory curve onto this GPU: its peak uses up to 90% of the framebuffer. Each step
        # is rounded to float32 as the numpy code this replaced did, so the simulated fleet is unchanged.
        share = array("f", [0.2 + 0.7 * ((self.gid * 7919) % 100) / 100])[0]
        scaled = array("f", [m / mem_peak for m in mem])
        scaled = array("f", [m * share for m in scaled])
        self.mem_series = array("f", [m * self.spec.fb_total_mib for m in scaled])
        self.offset_min = offset_min
        self.faults = [f for f in scenario.faults if f.node == node and f.gpu == index]
        self.rooms = [room for room in scenario.rooms if room.node == node]
        tag = zlib.crc32(scenario.name.encode())
        self.uuid = f"GPU-{scenario.seed:08x}-{node:04x}-{index:04x}-{self.gid:04x}-{tag:012x}"
        self.second = -1
        self.temp = AMBIENT_C + self.spec.idle_power_w * self.spec.c_per_w
        # Where it would be with no thermal fault (same power, same room): temp - temp_base is a thermal
        # fault's own heat, the truth the evaluation grades a fault that settles below slowdown by.
        self.temp_base = self.temp
        self.power = self.spec.idle_power_w
        self.util = 0.0
        self.mem = 0.0
        self.energy_mj = 0.0
        self.ecc_sbe = 0
        self.ecc_dbe = 0
        self.retired_dbe = 0
        self.worn = 0.0  # rows remapped (pages retired before Ampere) by memory_wear
        self.throttle = 0
        self.power_limit = self.spec.board_power_w
        self.dead = False
        self.pending_xids: list[XidEvent] = []
        self.reset_pending = False  # reset since the collector last said so
        self.sm_clock = self.spec.sm_clock_max_mhz
        self.nvlink_kib = 0.0
        self.mig_profiles = scenario.mig.get(index, [])
        self.pods = scenario.shared.get(index, 0)
        self.crossed_s: float | None = None  # the first second it was at a limit (slowdown, memory exhausted)

    def _series_at(self, series: array, t: float) -> float:
        pos = (self.offset_min + t / 60.0) % len(series)
        i = int(pos)
        frac = pos - i
        return float(series[i]) * (1 - frac) + float(series[(i + 1) % len(series)]) * frac

    def advance_to(self, t: float, epoch: float) -> None:
        target = math.floor(t)
        while self.second < target:
            self.second += 1
            self._step(self.second, epoch)

    # What a GPU reset clears: the device's state. A power cap is an operator's setting, a dead GPU is off
    # the bus (a reset cannot reach it), the node's telemetry path is not the GPU's.
    RESET_CLEARS = frozenset({"ecc_sbe_storm", "ecc_dbe", "xid", "thermal_runaway", "stuck_util"})

    def reset(self, announce: bool = True) -> None:
        """A GPU reset (``nvidia-smi -r``, what the cluster's tooling does for a GPUResetRequired condition):
        the faults it clears end now and the volatile ECC counters start again; retired pages stay.
        ``announce``: the collector tells the agent (``gpu_resets``); False as NVML, which does not."""
        now = self.second + 1
        self.faults = [f.model_copy(update={"duration_s": now - f.at_s})
                       if f.kind in self.RESET_CLEARS and f.at_s < now and f.active(now) else f for f in self.faults]
        self.ecc_sbe = self.ecc_dbe = 0
        self.pending_xids.clear()
        self.reset_pending = announce

    def _active(self, kind: str, s: int) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind and f.active(s)]

    def _onset(self, kind: str, s: int) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind and int(f.at_s) == s]

    def _step(self, s: int, epoch: float) -> None:
        spec = self.spec
        if self._active("dead", s):
            self.dead = True
            return
        jitter = self.scenario.jitter_pct * _jitter(self.scenario.seed, self.gid, s)
        util, mem = self._workload_at(s, jitter)
        stuck = self._active("stuck_util", s)
        self.util = 100.0 if stuck else util
        mem += sum(f.leak_mib_per_s * (s - f.at_s) for f in self._active("memory_leak", s))
        self.mem = min(spec.fb_total_mib * 0.98, max(0.0, mem))
        # A hung kernel reads 100% busy while the SMs draw little: power follows real work.
        work = 0.03 if stuck else util / 100.0
        # A board that no longer reaches its clocks does the same work slower: busy as long, its dynamic
        # power down with the clock (the voltage stays); a failing VRM draws off the healthy curve.
        slow = min((f.clock_factor for f in self._active("clock_degraded", s)), default=1.0)
        skew = math.prod(f.power_factor for f in self._active("power_skew", s))
        uncapped = (spec.idle_power_w + (power_for(spec, work) - spec.idle_power_w) * slow) * skew
        caps = self._active("power_cap", s)
        self.power_limit = min([f.cap_w or 0.45 * spec.board_power_w for f in caps], default=spec.board_power_w)
        throttle = 0
        if uncapped > self.power_limit:
            throttle |= THROTTLE_SW_POWER_CAP
        power = min(uncapped, self.power_limit)
        resistance = spec.c_per_w * math.prod(
            1 + (f.fan_factor - 1) * min(1.0, (s - f.at_s) / f.ramp_s) for f in self._active("fan_failure", s))
        ambient = AMBIENT_C + sum(room.rise(s) for room in self.rooms)
        target_temp = ambient + power * resistance + sum(
            f.drift_c_per_s * (s - f.at_s) for f in self._active("thermal_drift", s))
        self.temp += (target_temp - self.temp) / THERMAL_TAU_S
        self.temp_base += (ambient + power * spec.c_per_w - self.temp_base) / THERMAL_TAU_S
        for f in self._active("thermal_runaway", s):
            self.temp += f.rise_c_per_s
        if self.temp >= spec.slowdown_temp_c:
            throttle |= THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL
            power *= 0.7
        if util < 1.0 and not stuck:
            throttle |= THROTTLE_GPU_IDLE
        self.temp = min(self.temp, spec.shutdown_temp_c + 5)
        worn = int(self.worn)
        self.worn += sum(f.remaps_per_min / 60.0 for f in self._active("memory_wear", s))
        self.ecc_sbe += 2 * (int(self.worn) - worn)
        if self.crossed_s is None and (self.temp >= spec.slowdown_temp_c or self.worn >= wear_limit(spec.arch)
                                       or self.mem >= FB_EXHAUSTED * spec.fb_total_mib):
            self.crossed_s = float(s)
        self.power = power
        self.throttle = throttle
        self.sm_clock = int(spec.sm_clock_max_mhz * slow * (0.6 if throttle & ~THROTTLE_GPU_IDLE else 1.0))
        self.energy_mj += power * 1000.0
        if spec.nvlink:
            self.nvlink_kib += util / 100.0 * NVLINK_KIB_PER_S_BUSY
        for f in self._active("ecc_sbe_storm", s):
            self.ecc_sbe += int(f.rate_per_s)
        for _ in self._onset("ecc_dbe", s):
            self.ecc_dbe += 1
            self.retired_dbe += 1
            self.pending_xids.append(XidEvent(self.index, epoch + s, 48))
        for f in self.faults:
            if f.kind == "xid" and f.active(s) and (int(f.at_s) == s or (
                    f.every_s is not None and (s - int(f.at_s)) % int(f.every_s) == 0)):
                self.pending_xids.append(XidEvent(self.index, epoch + s, f.xid))

    def _workload_at(self, s: int, jitter: float) -> tuple[float, float]:
        """Utilisation (%) and framebuffer used (MiB) of this GPU's workload at second ``s``."""
        kind = self.workload
        if kind == "trace":
            util = self._series_at(self.util_series, s) + jitter
            return min(100.0, max(0.0, util)), self._series_at(self.mem_series, s)
        noise = _jitter(self.scenario.seed + 17, self.gid, s)
        if kind == "training-compute":
            util = 95.0 + 3.0 * noise
        elif kind == "training-memory":
            util = 85.0 + 5.0 * noise
        elif kind == "inference-bursty":
            # Requests arrive in bursts: a few seconds near 100%, then mostly idle.
            util = 90.0 + 10.0 * noise if (s // 3) % 4 == 0 or noise > 0.8 else 4.0 + 3.0 * abs(noise)
        elif kind == "diurnal-serving":
            # Serving traffic: a day-long swell (peak mid-afternoon) with request-level noise.
            day = 0.5 - 0.5 * math.cos(2 * math.pi * ((s / 86400.0 + 0.6) % 1.0))
            util = 10.0 + 75.0 * day + 8.0 * noise
        elif kind == "mixed-training":
            # Compute-bound steps and memory-bound phases (evaluation, checkpoint) alternating every few minutes.
            util = 96.0 + 2.0 * noise if (s // 240) % 3 else 55.0 + 10.0 * noise
        else:  # idle-holding: memory allocated, nothing running
            util = 0.0
        # Training grows its footprint over the first minutes; the others hold it flat.
        ramp = min(1.0, 0.5 + s / 600.0) if kind.startswith("training") else 1.0
        return min(100.0, max(0.0, util)), self.fb_target * ramp * (1.0 + 0.01 * noise)

    def reading(self, ts: float, full: bool) -> Reading:
        if self.dead:
            raise GpuLost(f"{self.uuid}: GPU is lost (simulated fall off the bus)")
        spec = self.spec
        r = Reading(
            ts=ts, full=full, util_gpu=round(self.util, 1), fb_used_mib=round(self.mem),
            temp_c=round(self.temp, 1), power_w=round(self.power, 1), throttle_reasons=self.throttle,
            ecc_sbe_volatile=self.ecc_sbe, ecc_dbe_volatile=self.ecc_dbe, read_s=0.002, sm_clock_mhz=self.sm_clock,
        )
        if full:
            r.util_mem = round(self.util * self.mem_bw_share, 1)
            r.fb_free_mib = spec.fb_total_mib - r.fb_used_mib
            r.mem_clock_mhz = spec.mem_clock_mhz
            r.power_limit_w = self.power_limit
            r.energy_mj = int(self.energy_mj)
            r.ecc_sbe_aggregate = self.ecc_sbe
            r.ecc_dbe_aggregate = self.ecc_dbe
            r.retired_pages_dbe = self.retired_dbe
            if wear_limit(spec.arch) == ROW_REMAP_LIMIT:
                r.remapped_rows_correctable = int(self.worn)
            else:
                r.retired_pages_sbe = int(self.worn)
            r.pcie_replays = 0
            r.util_enc, r.util_dec = 0.0, 0.0
            r.fb_reserved_mib = spec.fb_reserved_mib
            r.nvlink_bandwidth_kib = int(self.nvlink_kib) if spec.nvlink else None
            r.processes = self._processes()
            busy = self.util / 100.0
            # Host traffic follows the workload: a few percent of the link while busy.
            pcie_kib_s = int(spec.pcie_gbs * 1e6 * (0.002 + 0.05 * busy))
            if spec.gpm:
                r.prof_gr_engine_active = round(busy, 3)
                r.prof_sm_active = round(busy * 0.8, 3)
                r.prof_tensor_active = round(busy * 0.4, 3)
                r.prof_dram_active = round(busy * self.mem_bw_share, 3)
                r.prof_pcie_tx_bytes = r.prof_pcie_rx_bytes = float(pcie_kib_s * 1024)
            else:  # nvmlDeviceGetPcieThroughput, as the NVML collector reads it without GPM
                r.pcie_tx_kib_s = r.pcie_rx_kib_s = pcie_kib_s
                r.prof_pcie_tx_bytes = r.prof_pcie_rx_bytes = float(pcie_kib_s * 1024)
            if self.mig_profiles:
                r.mig_instances = len(self.mig_profiles)
                r.mig = self._mig(busy)
        for f in self._active("telemetry_collapse", self.second):
            self._collapse(r, min(1.0, (self.second - f.at_s + 1) / 20.0))
        return r

    def pid(self, j: int) -> int:
        return 10_000 + self.gid * 16 + j if self.pods > 1 else 10_000 + self.gid

    def _processes(self) -> list[GpuProcess]:
        if self.mem <= 0:
            return []
        if self.pods <= 1:
            return [GpuProcess(self.pid(0), int(self.mem), round(self.util, 1))]
        # Time-shared: unequal, deterministic shares of the GPU's work and memory, one process per pod.
        weights = [j + 1 for j in range(self.pods)]
        total = sum(weights)
        return [GpuProcess(self.pid(j), int(self.mem * w / total), round(self.util * w / total, 1))
                for j, w in enumerate(weights)]

    def _mig(self, busy: float) -> list[MigReading]:
        n = len(self.mig_profiles)
        share = (self.spec.fb_total_mib - self.spec.fb_reserved_mib) / n
        return [MigReading(gi_id=g + 1, profile=p, fb_used_mib=round(min(share, self.mem / n)),
                           fb_free_mib=round(share - min(share, self.mem / n)),
                           gr_engine_active=round(busy, 3) if self.spec.gpm else None)
                for g, p in enumerate(self.mig_profiles)]


    def _collapse(self, r: Reading, severity: float) -> None:
        """Before it falls off the bus: reads slow down, fields go absent, some reads come back empty."""
        u = _jitter(self.scenario.seed + 31, self.gid, self.second)
        r.read_s = 0.002 + 0.5 * severity * (0.75 + 0.25 * u)
        if u > 1 - 0.2 * severity:
            r.util_gpu = r.fb_used_mib = r.temp_c = r.power_w = r.throttle_reasons = r.sm_clock_mhz = None
            r.ecc_sbe_volatile = r.ecc_dbe_volatile = None
        elif u < -1 + severity:
            r.power_w = r.ecc_sbe_volatile = r.ecc_dbe_volatile = None


class SimCluster:
    """All simulated nodes of one scenario, sharing one clock."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None, epoch: float | None = None,
                 start_on_first_read: bool = False):
        """``start_on_first_read``: the simulated clock (second 0, fault times) starts when an agent first reads,
        not now, so agents that start late still see each fault's onset at its ``at_s`` on their own clock."""
        self.scenario = scenario
        self.clock = clock or time.time
        self.epoch = self.clock() if epoch is None else epoch
        self.waiting = start_on_first_read
        duty, mem = traces.gentd26()
        pods = sorted(set(duty) & set(mem))
        rng = Pcg64(scenario.seed)  # numpy default_rng draws, without numpy
        self.gpus: list[list[SimGpu]] = []
        for n in range(scenario.nodes):
            row = []
            for g in range(scenario.gpus_per_node):
                pod = pods[rng.integers(len(pods))]
                row.append(SimGpu(scenario, n, g, duty[pod], mem[pod], rng.integers(0, len(duty[pod]))))
            self.gpus.append(row)

    def elapsed(self) -> float:
        if self.waiting:
            self.epoch, self.waiting = self.clock(), False
        return self.clock() - self.epoch

    def node(self, n: int) -> SimCollector:
        return SimCollector(self, n)

    def collectors(self) -> list[SimCollector]:
        return [self.node(n) for n in range(self.scenario.nodes)]

    def attribution(self) -> SimPods:
        return SimPods(self)

    def true_util(self, n: int, g: int, t: float) -> float:
        gpu = self.gpus[n][g]
        gpu.advance_to(t, self.epoch)
        return gpu.util


class SimPods:
    """The kubelet and /proc of the simulated nodes: which pods share a GPU and which pod owns a PID.

    Only GPUs the scenario marks ``shared`` have pods (one process each), so the per-pod split is
    exercised the way dcgm-exporter's per-process accounting does it on a time-shared GPU.
    """

    def __init__(self, cluster: SimCluster):
        self._pods: dict[str, list[PodRef]] = {}
        self._uids: dict[int, str] = {}
        for row in cluster.gpus:
            for g in row:
                for j in range(g.pods):
                    uid = f"{zlib.crc32(g.uuid.encode()):08x}-0000-4000-8000-{g.gid:08x}{j:04x}"
                    self._pods.setdefault(g.uuid, []).append(PodRef(f"{g.workload}-{g.gid}-{j}", "sim", "main", uid))
                    self._uids[g.pid(j)] = uid

    def pods(self, uuid: str) -> list[PodRef]:
        return self._pods.get(uuid, [])

    def uid_of_pid(self, pid: int) -> str | None:
        return self._uids.get(pid)


class SimCollector:
    def __init__(self, cluster: SimCluster, node: int):
        self.cluster = cluster
        self.node_index = node
        self.node = cluster.scenario.node_name(node)
        self._gpus = cluster.gpus[node]

    def devices(self) -> list[GpuDevice]:
        out = []
        for g in self._gpus:
            spec = g.spec
            peers = [o.uuid for o in self._gpus if o is not g and o.spec.nvlink and spec.nvlink]
            out.append(GpuDevice(
                uuid=g.uuid, index=g.index, model=spec.name, pci_bus_id=f"00000000:{0x18 + g.index * 0x10:02X}:00.0",
                fb_total_mib=spec.fb_total_mib, power_limit_w=spec.board_power_w, power_max_w=spec.board_power_w,
                idle_power_w=spec.idle_power_w, slowdown_temp_c=spec.slowdown_temp_c,
                shutdown_temp_c=spec.shutdown_temp_c, nvlink_peers=peers, mig_enabled=bool(g.mig_profiles),
                gpm_supported=spec.gpm, driver_version=DRIVER_VERSION,
            ))
        return out

    def read(self, index: int, full: bool) -> Reading:
        t = self.cluster.elapsed()
        gpu = self._gpus[index]
        gpu.advance_to(t, self.cluster.epoch)
        return gpu.reading(self.cluster.epoch + t, full)

    def xid_events(self) -> list[XidEvent]:
        t = self.cluster.elapsed()
        out: list[XidEvent] = []
        for gpu in self._gpus:
            gpu.advance_to(t, self.cluster.epoch)
            out.extend(gpu.pending_xids)
            gpu.pending_xids.clear()
        return out

    def reset_gpu(self, index: int, announce: bool = True) -> None:
        """Reset GPU ``index`` now; the agent learns it from ``gpu_resets``, or with ``announce=False`` (as on
        NVML, which announces no reset) from the node's ``gpuaware.io/gpu-resets`` annotation
        (gpuaware/agent/cordons.py)."""
        self._gpus[index].reset(announce)

    def gpu_resets(self) -> list[int]:
        out = [g.index for g in self._gpus if g.reset_pending]
        for g in self._gpus:
            g.reset_pending = False
        return out

    def set_power_limit(self, index: int, watts: float) -> None:
        gpu = self._gpus[index]
        lo, hi = gpu.spec.idle_power_w * 1.5, gpu.spec.board_power_w
        if not lo <= watts <= hi:
            raise ValueError(f"power limit {watts} W outside [{lo:.0f}, {hi:.0f}] W for {gpu.spec.name}")
        gpu.faults = [f for f in gpu.faults if f.kind != "power_cap"]
        gpu.faults.append(Fault(kind="power_cap", node=gpu.node, gpu=gpu.index, at_s=gpu.second + 1, cap_w=watts))

    def reset_power_limit(self, index: int) -> None:
        gpu = self._gpus[index]
        gpu.faults = [f for f in gpu.faults if f.kind != "power_cap"]

    def close(self) -> None:
        pass
