"""The NVML collector against a fake NVML at the pynvml boundary: two GPUs, one that supports less
and misbehaves. No GPU needed."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from gpuaware.agent.collectors import nvml as nvml_module
from gpuaware.agent.readings import GpuLost

pynvml = nvml_module.pynvml
if pynvml is None:  # pragma: no cover - nvidia-ml-py is a dependency
    pytest.skip("nvidia-ml-py is not installed", allow_module_level=True)

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
MIB = 2**20


class FakeGpu:
    def __init__(self, index: int, full: bool):
        self.index = index
        self.full = full  # GPU 0 supports everything; GPU 1 (an older board) much less
        self.uuid = f"GPU-fake-{index}"
        self.fail_next: dict[str, int] = {}  # function name -> NVML error code raised once
        self.lost = False
        self.power_limit_mw = 700_000 if full else 250_000


class FakeNvml:
    """The pynvml functions the collector calls, over a small device table."""

    def __init__(self):
        self.gpus = [FakeGpu(0, True), FakeGpu(1, False)]
        self.xids: list[tuple[int, int]] = []  # (gpu index, xid) the event set reports
        self.gpm_alloc = 0
        self.gpm_free = 0
        self.gpm_fail_get = False
        self.lock = threading.Lock()

    def _check(self, name: str, h: FakeGpu) -> None:
        if h.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = h.fail_next.pop(name, None)
        if code is not None:
            raise pynvml.NVMLError(code)

    def install(self, monkeypatch) -> None:
        def fn(name, full, partial=None):
            def call(h, *args):
                self._check(name, h)
                if not h.full and partial is None:
                    raise pynvml.NVMLError(NOT_SUPPORTED)
                return (full if h.full else partial)(h, *args)
            monkeypatch.setattr(pynvml, name, call)

        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(self.gpus))
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: self.gpus[i])
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: b"550.163.01")
        fn("nvmlDeviceGetEncoderUtilization", lambda h: (3, 167_000))
        fn("nvmlDeviceGetDecoderUtilization", lambda h: (9, 167_000))
        fn("nvmlDeviceGetProcessUtilization", lambda h, since: [
            SimpleNamespace(pid=42, smUtil=80, memUtil=30, timeStamp=since + 1)])
        fn("nvmlDeviceGetUUID", lambda h: h.uuid.encode(), lambda h: h.uuid)
        fn("nvmlDeviceGetName", lambda h: b"NVIDIA H100 80GB HBM3", lambda h: "Tesla T4")
        fn("nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(total=80 * 1024 * MIB, used=1024 * MIB,
                                                                free=79 * 1024 * MIB),
           lambda h: SimpleNamespace(total=16 * 1024 * MIB, used=512 * MIB, free=15.5 * 1024 * MIB))
        fn("nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=b"00000000:17:00.0", busIdLegacy=b"0000:17:00.0"),
           lambda h: SimpleNamespace(busId=b"00000000:65:00.0"))
        fn("nvmlDeviceGetPowerManagementLimit", lambda h: h.power_limit_mw, lambda h: h.power_limit_mw)
        fn("nvmlDeviceGetPowerManagementLimitConstraints", lambda h: (200_000, 700_000))
        fn("nvmlDeviceGetPowerManagementDefaultLimit", lambda h: 700_000)
        fn("nvmlDeviceGetTemperatureThreshold", lambda h, kind: 87 if kind == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
           else 92)
        fn("nvmlDeviceGetMigMode", lambda h: (0, 0))
        fn("nvmlGpmQueryDeviceSupport", lambda h: SimpleNamespace(isSupportedDevice=1))
        fn("nvmlDeviceGetNvLinkState", lambda h, link: pynvml.NVML_FEATURE_DISABLED)
        fn("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=97, memory=41),
           lambda h: SimpleNamespace(gpu=12, memory=3))
        fn("nvmlDeviceGetTemperature", lambda h, sensor: 61, lambda h, sensor: 44)
        fn("nvmlDeviceGetPowerUsage", lambda h: 650_500)
        fn("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4, lambda h: 0)
        fn("nvmlDeviceGetClockInfo", lambda h, clock: 1980 if clock == pynvml.NVML_CLOCK_SM else 2619,
           lambda h, clock: 585)
        fn("nvmlDeviceGetEnforcedPowerLimit", lambda h: h.power_limit_mw, lambda h: h.power_limit_mw)
        fn("nvmlDeviceGetTotalEnergyConsumption", lambda h: 123_456_789)
        fn("nvmlDeviceGetRemappedRows", lambda h: (1, 0, 0, 0))
        fn("nvmlDeviceGetPcieThroughput", lambda h, counter: 1000, lambda h, counter: 7)
        fn("nvmlDeviceGetComputeRunningProcesses", lambda h: [SimpleNamespace(pid=42, usedGpuMemory=2048 * MIB)],
           lambda h: [])
        fn("nvmlDeviceGetMaxMigDeviceCount", lambda h: 7)
        fn("nvmlDeviceGetFieldValues", self._fields, self._fields)

        def set_limit(h, mw):
            self._check("nvmlDeviceSetPowerManagementLimit", h)
            h.power_limit_mw = mw

        monkeypatch.setattr(pynvml, "nvmlDeviceSetPowerManagementLimit", set_limit)
        # GPM (GPU 0 only): samples are counted so a leak shows.
        def alloc():
            with self.lock:
                self.gpm_alloc += 1
            return SimpleNamespace()

        def sample_get(h, sample):
            if self.gpm_fail_get:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

        def sample_free(sample):
            with self.lock:
                self.gpm_free += 1

        def metrics_get(get):
            for i in range(get.numMetrics):
                get.metrics[i].nvmlReturn = pynvml.NVML_SUCCESS
                get.metrics[i].value = 50.0

        monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", alloc)
        monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", sample_get)
        monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", sample_free)
        monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", metrics_get)
        monkeypatch.setattr(pynvml, "c_nvmlGpmMetricsGet_t", lambda: SimpleNamespace(
            metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(10)]))
        # XID events: one wait returns each queued XID, otherwise it times out.
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: object())
        monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda h, kind, es: None)
        monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda es: None)

        def wait(es, timeout_ms):
            with self.lock:
                item = self.xids.pop(0) if self.xids else None
            if item is None:
                time.sleep(0.005)
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return SimpleNamespace(device=self.gpus[item[0]], eventData=item[1])

        monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)

    def _fields(self, h, ids):
        values = {pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 3, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0,
                  pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 5, pynvml.NVML_FI_DEV_MEMORY_TEMP: 52}
        out = []
        for fid in ids:
            ok = h.full and fid in values
            out.append(SimpleNamespace(
                nvmlReturn=pynvml.NVML_SUCCESS if ok else NOT_SUPPORTED,
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                value=SimpleNamespace(ullVal=values.get(fid, 0), uiVal=0, ulVal=0, dVal=0.0, sllVal=0)))
        return out


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    fake.install(monkeypatch)
    clock = [1000.0]
    collector = nvml_module.NvmlCollector("node-a", clock=lambda: clock[0])
    yield fake, collector, clock
    collector.close()


def test_static_facts_of_both_gpus(nvml):
    _, c, _ = nvml
    full, partial = c.devices()
    assert (full.uuid, full.model, full.pci_bus_id, full.fb_total_mib) == (
        "GPU-fake-0", "NVIDIA H100 80GB HBM3", "00000000:17:00.0", 80 * 1024)  # DCGM's 8-digit domain
    assert full.driver_version == partial.driver_version == "550.163.01"
    assert (full.power_limit_w, full.power_max_w, full.slowdown_temp_c, full.shutdown_temp_c) == (700, 700, 87, 92)
    assert full.mig_enabled is False and full.gpm_supported and full.nvlink_peers == []
    assert (partial.uuid, partial.model, partial.pci_bus_id, partial.fb_total_mib) == (
        "GPU-fake-1", "Tesla T4", "00000000:65:00.0", 16 * 1024)
    assert partial.power_max_w is None and partial.slowdown_temp_c is None and partial.mig_enabled is None
    assert not partial.gpm_supported


def test_readings_in_the_agents_units(nvml):
    _, c, _ = nvml
    watch = c.read(0, full=False)
    assert (watch.ts, watch.full, watch.util_gpu, watch.util_mem, watch.temp_c) == (1000.0, False, 97, 41, 61)
    assert (watch.fb_used_mib, watch.fb_free_mib, watch.power_w) == (1024, 79 * 1024, 650.5)
    assert (watch.throttle_reasons, watch.ecc_sbe_volatile, watch.ecc_dbe_volatile) == (0x4, 3, 0)
    assert watch.sm_clock_mhz == 1980  # watched: the clock peer check judges every watch read
    assert watch.mem_clock_mhz is None and watch.pcie_replays is None  # full-sample fields only
    full = c.read(0, full=True)
    assert (full.sm_clock_mhz, full.mem_clock_mhz, full.power_limit_w, full.energy_mj) == (1980, 2619, 700, 123456789)
    assert (full.pcie_replays, full.mem_temp_c, full.remapped_rows_correctable, full.remap_failure) == (5, 52, 1, False)
    assert [(p.pid, p.used_mib, p.sm_util) for p in full.processes] == [(42, 2048, 80)]
    assert (full.util_enc, full.util_dec) == (3, 9)
    assert full.pcie_tx_kib_s is None  # GPM gives PCIe bytes on this GPU: the slow call is skipped
    second = c.read(0, full=True)  # two GPM samples make a rate
    assert second.prof_sm_active == 0.5 and second.prof_pcie_tx_bytes == 50.0 * MIB


def test_what_a_gpu_does_not_support_is_none_never_zero(nvml):
    _, c, _ = nvml
    r = c.read(1, full=True)
    assert (r.util_gpu, r.temp_c, r.fb_used_mib, r.sm_clock_mhz) == (12, 44, 512, 585)
    for attr in ("power_w", "energy_mj", "ecc_sbe_volatile", "ecc_dbe_volatile", "pcie_replays", "mem_temp_c",
                 "remapped_rows_correctable", "remap_failure", "prof_sm_active"):
        assert getattr(r, attr) is None, attr
    assert r.pcie_tx_kib_s == 7 and r.processes == [] and r.util_enc is None
    # Without GPM the PCIe throughput NVML measured is exported, in DCGM's bytes/s.
    assert r.prof_pcie_tx_bytes == r.prof_pcie_rx_bytes == 7 * 1024


def test_a_transient_nvml_error_leaves_that_field_unread_and_the_next_read_recovers(nvml):
    fake, c, _ = nvml
    fake.gpus[1].fail_next["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_UNKNOWN
    fake.gpus[1].fail_next["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_TIMEOUT
    r = c.read(1, full=False)
    assert r.util_gpu is None and r.util_mem is None and r.temp_c == 44  # the rest of the read went on
    assert c.read(1, full=False).util_gpu == 12


def test_a_transient_gpm_error_frees_the_sample_it_allocated(nvml):
    fake, c, _ = nvml
    c.read(0, full=True)
    fake.gpm_fail_get = True
    for _ in range(5):
        r = c.read(0, full=True)
        assert r.prof_sm_active is None and r.util_gpu == 97
    fake.gpm_fail_get = False
    assert c.read(0, full=True).util_gpu == 97
    assert fake.gpm_alloc - fake.gpm_free == 1  # only the sample kept for the next rate


def test_a_lost_gpu_raises_gpu_lost_and_the_other_keeps_reading(nvml):
    fake, c, _ = nvml
    fake.gpus[1].lost = True
    with pytest.raises(GpuLost):
        c.read(1, full=False)
    assert c.read(0, full=False).util_gpu == 97


def test_xids_come_from_the_event_set(nvml):
    fake, c, _ = nvml
    with fake.lock:
        fake.xids.append((1, 79))
    deadline = time.monotonic() + 5
    seen = []
    while not seen and time.monotonic() < deadline:
        seen = c.xid_events()
        time.sleep(0.005)
    assert [(x.gpu_index, x.xid, x.ts) for x in seen] == [(1, 79, 1000.0)]
    assert c.xid_events() == []


def test_power_limits_are_checked_set_and_reset(nvml):
    fake, c, _ = nvml
    c.set_power_limit(0, 450)
    assert fake.gpus[0].power_limit_mw == 450_000
    with pytest.raises(ValueError, match="above the maximum"):
        c.set_power_limit(0, 900)
    c.reset_power_limit(0)
    assert fake.gpus[0].power_limit_mw == 700_000
    fake.gpus[1].fail_next["nvmlDeviceSetPowerManagementLimit"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(RuntimeError, match="refused"):
        c.set_power_limit(1, 100)


def test_nvml_comes_from_nvidia_ml_py_without_the_deprecated_pynvml_shim():
    """The ``pynvml`` distribution is a deprecated wrapper whose import hook tells every agent start on a GPU node
    to "report this to the maintainers"; the binding is nvidia-ml-py's ``pynvml`` module alone."""
    import subprocess
    import sys

    code = "import gpuaware.agent.collectors.nvml, gpuaware.agent.power_capper"
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
