"""Real GPUs through NVML (``pynvml`` from nvidia-ml-py).

Static facts (name, PCI, memory size, limits, NVLink peers, MIG mode, GPM support) are read once.
Counters that NVML exposes as field values (ECC totals, PCIe replays, NVLink CRC errors) are read
in one ``nvmlDeviceGetFieldValues`` batch per device. XID errors come from an NVML event set
waited on in a thread of their own, never from polling. Hopper and newer GPUs give DCGM's
profiling metrics through GPM, converted to DCGM's units (ratios 0-1, bytes/s). Whatever a GPU
does not support is left ``None``: an unsupported call never stops the agent.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuaware.agent.collectors.capper_client import CapperClient
from gpuaware.agent.readings import GpuDevice, GpuLost, GpuProcess, MigReading, Reading, XidEvent

log = logging.getLogger(__name__)
T = TypeVar("T")

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None  # type: ignore[assignment]


def _lost_codes() -> set[int]:
    return {getattr(pynvml, n) for n in ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNINITIALIZED") if hasattr(pynvml, n)}


class NvmlCollector:
    # (NVML field id name, Reading attribute)
    FIELDS = [
        ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile"),
        ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile"),
        ("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_aggregate"),
        ("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_dbe_aggregate"),
        ("NVML_FI_DEV_RETIRED_SBE", "retired_pages_sbe"),
        ("NVML_FI_DEV_RETIRED_DBE", "retired_pages_dbe"),
        ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replays"),
        ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_errors"),
        ("NVML_FI_DEV_MEMORY_TEMP", "mem_temp_c"),
        ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "nvlink_tx_kib"),
        ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "nvlink_rx_kib"),
    ]
    WATCH_FIELDS = {"ecc_sbe_volatile", "ecc_dbe_volatile"}

    def __init__(self, node: str | None = None, clock: Callable[[], float] = time.time,
                 capper: CapperClient | None = None):
        if pynvml is None:
            raise RuntimeError("nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML is not available on this machine: {exc}") from exc
        self.node = node or socket.gethostname()
        self.clock = clock
        # Setting a power limit needs CAP_SYS_ADMIN, which the shipped agent lacks: there the privileged
        # power capper in its pod sets them (gpuaware/agent/power_capper.py); without one, NVML is called directly.
        self.capper = capper
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._field_ids = [(getattr(pynvml, n), attr) for n, attr in self.FIELDS if hasattr(pynvml, n)]
        self._watch_ids = [(fid, attr) for fid, attr in self._field_ids if attr in self.WATCH_FIELDS]
        try:
            self._driver = _s(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            self._driver = ""
        self._devices = [self._static(i, h) for i, h in enumerate(self.handles)]
        self._gpm_prev: dict[int, Any] = {}
        self._proc_util_ts: dict[int, int] = {}
        self._xids: list[XidEvent] = []
        self._xid_lock = threading.Lock()
        self._stop = threading.Event()
        self._xid_thread = threading.Thread(target=self._wait_xids, name="nvml-xid", daemon=True)
        self._xid_thread.start()

    # ------------------------------------------------------------------ helpers

    def _try(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in _lost_codes():
                raise GpuLost(str(exc)) from exc
            return None

    def _static(self, index: int, h: Any) -> GpuDevice:
        mem = self._try(pynvml.nvmlDeviceGetMemoryInfo, h)
        pci = self._try(pynvml.nvmlDeviceGetPciInfo, h)
        limit = self._try(pynvml.nvmlDeviceGetPowerManagementLimit, h)
        constraints = self._try(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h)
        slowdown = self._try(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                             pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        shutdown = self._try(pynvml.nvmlDeviceGetTemperatureThreshold, h,
                             pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
        mig = self._try(pynvml.nvmlDeviceGetMigMode, h)
        gpm = self._try(pynvml.nvmlGpmQueryDeviceSupport, h) if hasattr(pynvml, "nvmlGpmQueryDeviceSupport") else None
        bus = getattr(pci, "busId", "")  # DCGM's form: 8-digit domain (busIdLegacy has 4)
        return GpuDevice(
            uuid=_s(pynvml.nvmlDeviceGetUUID(h)), index=index, model=_s(pynvml.nvmlDeviceGetName(h)),
            pci_bus_id=_s(bus), fb_total_mib=int(mem.total // 2**20) if mem else 0,
            power_limit_w=limit / 1000 if limit else None,
            power_max_w=constraints[1] / 1000 if constraints else None,
            slowdown_temp_c=float(slowdown) if slowdown else None,
            shutdown_temp_c=float(shutdown) if shutdown else None,
            nvlink_peers=self._nvlink_peers(h), mig_enabled=bool(mig[0]) if mig else None,
            gpm_supported=bool(getattr(gpm, "isSupportedDevice", 0)) if gpm is not None else False,
            driver_version=self._driver,
        )

    def _nvlink_peers(self, h: Any) -> list[str]:
        peers = []
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
                peers.append(_s(remote.busId))
            except pynvml.NVMLError:
                break
        return sorted(set(peers))

    # ------------------------------------------------------------------ Collector

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def read(self, index: int, full: bool) -> Reading:
        h = self.handles[index]
        r = Reading(ts=self.clock(), full=full)
        util = self._try(pynvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            r.util_gpu, r.util_mem = float(util.gpu), float(util.memory)
        mem = self._try(pynvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            r.fb_used_mib, r.fb_free_mib = mem.used / 2**20, mem.free / 2**20
            if full and hasattr(mem, "reserved"):
                r.fb_reserved_mib = mem.reserved / 2**20
        temp = self._try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
        r.temp_c = float(temp) if temp is not None else None
        power = self._try(pynvml.nvmlDeviceGetPowerUsage, h)
        r.power_w = power / 1000 if power is not None else None
        reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        r.throttle_reasons = self._try(reasons_fn, h)
        self._read_fields(h, r, self._field_ids if full else self._watch_ids)
        # Watched too: a board losing clocks under load with no throttle reason is judged against its peers
        # on every watch read (gpuaware/agent/peers.py), not a full-sample interval later.
        r.sm_clock_mhz = self._try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        if not full:
            return r
        r.mem_clock_mhz = self._try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        limit = self._try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        r.power_limit_w = limit / 1000 if limit is not None else None
        r.energy_mj = self._try(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        remap = self._try(pynvml.nvmlDeviceGetRemappedRows, h)
        if remap is not None:
            r.remapped_rows_correctable, r.remapped_rows_uncorrectable = int(remap[0]), int(remap[1])
            r.remap_failure = bool(remap[3])
        enc = self._try(pynvml.nvmlDeviceGetEncoderUtilization, h)
        dec = self._try(pynvml.nvmlDeviceGetDecoderUtilization, h)
        r.util_enc = float(enc[0]) if enc is not None else None
        r.util_dec = float(dec[0]) if dec is not None else None
        if not self._devices[index].gpm_supported:
            # Each call blocks ~20 ms while NVML samples the bus (measured on an H100); GPM gives the
            # same figure for free where it exists. Exported as DCGM_FI_PROF_PCIE_{TX,RX}_BYTES.
            r.pcie_tx_kib_s = self._try(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            r.pcie_rx_kib_s = self._try(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            r.prof_pcie_tx_bytes = r.pcie_tx_kib_s * 1024.0 if r.pcie_tx_kib_s is not None else None
            r.prof_pcie_rx_bytes = r.pcie_rx_kib_s * 1024.0 if r.pcie_rx_kib_s is not None else None
        procs = self._try(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
        if procs is not None:
            util = self._process_util(index, h)
            r.processes = [GpuProcess(p.pid, p.usedGpuMemory // 2**20 if p.usedGpuMemory else None,
                                      util.get(p.pid)) for p in procs]
        if self._devices[index].mig_enabled:
            count = self._try(pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
            r.mig_instances = count
            r.mig = self._mig(h, count or 0)
        if self._devices[index].gpm_supported:
            self._read_gpm(index, h, r)
        return r

    def _process_util(self, index: int, h: Any) -> dict[int, float]:
        """Per-PID SM utilisation (%) since the previous full read (nvmlDeviceGetProcessUtilization)."""
        since = self._proc_util_ts.get(index, 0)
        samples = self._try(pynvml.nvmlDeviceGetProcessUtilization, h, since) or []
        out: dict[int, float] = {}
        for s in samples:
            out[s.pid] = max(out.get(s.pid, 0.0), float(s.smUtil))
            self._proc_util_ts[index] = max(self._proc_util_ts.get(index, 0), int(s.timeStamp))
        return out

    def _mig(self, h: Any, count: int) -> list[MigReading]:
        """Each MIG device's GPU instance, profile (from its name, "... MIG 3g.40gb") and memory."""
        out = []
        for i in range(count):
            mh = self._try(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            if mh is None:
                continue
            gi = self._try(pynvml.nvmlDeviceGetGpuInstanceId, mh)
            name = _s(self._try(pynvml.nvmlDeviceGetName, mh) or "")
            mem = self._try(pynvml.nvmlDeviceGetMemoryInfo, mh)
            out.append(MigReading(gi_id=int(gi or 0), profile=name.rsplit("MIG ", 1)[-1],
                                  fb_used_mib=mem.used / 2**20 if mem else None,
                                  fb_free_mib=mem.free / 2**20 if mem else None))
        return out

    def _read_fields(self, h: Any, r: Reading, fields: list[tuple[int, str]]) -> None:
        if not fields:
            return
        values = self._try(pynvml.nvmlDeviceGetFieldValues, h, [fid for fid, _ in fields])
        if values is None:
            return
        for (_, attr), v in zip(fields, values, strict=False):
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                continue
            value = _field_value(v)
            if attr == "mem_temp_c":
                setattr(r, attr, float(value) if value else None)  # 0 means no HBM sensor
            elif attr.startswith("nvlink_") and attr.endswith("x_kib"):  # TX + RX: DCGM's bandwidth total
                r.nvlink_bandwidth_kib = (r.nvlink_bandwidth_kib or 0) + int(value)
            else:
                setattr(r, attr, int(value))

    def _read_gpm(self, index: int, h: Any, r: Reading) -> None:
        """Two GPM samples one read apart give rates over the full-sample interval."""
        try:
            sample = pynvml.nvmlGpmSampleAlloc()
        except pynvml.NVMLError:
            return
        try:
            pynvml.nvmlGpmSampleGet(h, sample)
        except pynvml.NVMLError:
            pynvml.nvmlGpmSampleFree(sample)  # a transient failure must not leak a sample per read
            return
        prev = self._gpm_prev.get(index)
        self._gpm_prev[index] = sample
        if prev is None:
            return
        ids = {
            "prof_gr_engine_active": (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, 0.01),
            "prof_sm_active": (pynvml.NVML_GPM_METRIC_SM_UTIL, 0.01),
            "prof_sm_occupancy": (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 0.01),
            "prof_tensor_active": (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 0.01),
            "prof_dram_active": (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 0.01),
            "prof_pcie_tx_bytes": (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, float(2**20)),
            "prof_pcie_rx_bytes": (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, float(2**20)),
        }
        try:
            get = pynvml.c_nvmlGpmMetricsGet_t()
            get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(ids)
            get.sample1 = prev
            get.sample2 = sample
            for i, (metric_id, _) in enumerate(ids.values()):
                get.metrics[i].metricId = metric_id
            pynvml.nvmlGpmMetricsGet(get)
        except (pynvml.NVMLError, AttributeError) as exc:
            log.debug("GPM metrics unavailable: %s", exc)
            return
        finally:
            pynvml.nvmlGpmSampleFree(prev)
        for i, (attr, (_, scale)) in enumerate(ids.items()):
            m = get.metrics[i]
            if m.nvmlReturn == pynvml.NVML_SUCCESS:
                setattr(r, attr, round(float(m.value) * scale, 6))

    def _wait_xids(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
                except pynvml.NVMLError as exc:
                    log.info("XID events not supported on a device: %s", exc)
        except pynvml.NVMLError as exc:
            log.warning("no NVML event set, XIDs will not be seen: %s", exc)
            return
        uuids = [d.uuid for d in self._devices]
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("NVML event wait failed: %s", exc)
                time.sleep(1)
                continue
            try:
                index = uuids.index(_s(pynvml.nvmlDeviceGetUUID(data.device)))
            except (pynvml.NVMLError, ValueError):
                continue
            with self._xid_lock:
                self._xids.append(XidEvent(index, self.clock(), int(data.eventData)))
        pynvml.nvmlEventSetFree(event_set)

    def xid_events(self) -> list[XidEvent]:
        with self._xid_lock:
            out, self._xids = self._xids, []
        return out

    def gpu_resets(self) -> list[int]:
        return []  # NVML does not announce a reset done by another process (docs/health.md)

    def set_power_limit(self, index: int, watts: float) -> None:
        d = self._devices[index]
        if d.power_max_w is not None and watts > d.power_max_w:
            raise ValueError(f"power limit {watts} W is above the maximum {d.power_max_w} W of {d.uuid}")
        if self.capper is not None:
            self.capper.set_limit(d.uuid, watts)
            return
        try:
            pynvml.nvmlDeviceSetPowerManagementLimit(self.handles[index], int(watts * 1000))
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML refused power limit {watts} W on {d.uuid}: {exc}") from exc

    def reset_power_limit(self, index: int) -> None:
        d = self._devices[index]
        if self.capper is not None:
            self.capper.set_limit(d.uuid, 0)
            return
        try:
            default_mw = pynvml.nvmlDeviceGetPowerManagementDefaultLimit(self.handles[index])
            pynvml.nvmlDeviceSetPowerManagementLimit(self.handles[index], default_mw)
        except pynvml.NVMLError as exc:
            raise RuntimeError(f"NVML refused to restore the default power limit of {d.uuid}: {exc}") from exc

    def close(self) -> None:
        self._stop.set()
        self._xid_thread.join(timeout=3)
        for prev in self._gpm_prev.values():
            pynvml.nvmlGpmSampleFree(prev)
        self._gpm_prev.clear()
        pynvml.nvmlShutdown()


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _field_value(v: Any) -> float:
    kind = v.valueType
    u = v.value
    return {
        pynvml.NVML_VALUE_TYPE_DOUBLE: u.dVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: u.uiVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: u.ulVal,
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: u.ullVal,
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: u.sllVal,
    }.get(kind, u.ullVal)
