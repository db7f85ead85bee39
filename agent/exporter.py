"""Prometheus ``/metrics`` for the agent: dcgm-exporter-compatible GPU metrics plus gpuaware's own.

A custom Collector builds metric families from the agent's last readings at scrape time; the
sampling loop never formats text. GPU metrics keep dcgm-exporter's names and labels (``gpu``,
``UUID``, ``device``, ``modelName``, ``Hostname``, ``pci_bus_id``, and ``pod``/``namespace``/
``container`` when the kubelet PodResources API maps the GPU to a pod), so existing DCGM
dashboards work unchanged. Like dcgm-exporter's, every DCGM family is exposed as a gauge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.core import AgentCore, GpuTrack
from agent.readings import Reading
from agent.verdict_metrics import verdict_families

DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "pod", "namespace", "container"]

# (DCGM name, help, reading attribute, scale); watch fields come from the newest watch read.
DCGM_FIELDS: list[tuple[str, str, str, float]] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_gpu", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_mem", 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "fb_used_mib", 1),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "fb_free_mib", 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp_c", 1),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "mem_temp_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit_w", 1),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_mj", 1),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).", "throttle_reasons", 1),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", "ecc_sbe_volatile", 1),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "ecc_dbe_volatile", 1),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.", "ecc_sbe_aggregate", 1),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", "ecc_dbe_aggregate", 1),
    ("DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors.", "retired_pages_sbe", 1),
    ("DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors.", "retired_pages_dbe", 1),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.",
     "remapped_rows_correctable", 1),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.",
     "remapped_rows_uncorrectable", 1),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.", "remap_failure", 1),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replays", 1),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.",
     "nvlink_crc_errors", 1),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "prof_gr_engine_active", 1),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "prof_sm_active", 1),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "prof_sm_occupancy", 1),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", "prof_tensor_active", 1),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.", "prof_dram_active", 1),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "The rate of data transmitted over the PCIe bus (bytes/s).",
     "prof_pcie_tx_bytes", 1),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus (bytes/s).", "prof_pcie_rx_bytes", 1),
]
WATCH_FIELDS = {"util_gpu", "fb_used_mib", "temp_c", "power_w", "throttle_reasons", "ecc_sbe_volatile",
                "ecc_dbe_volatile"}


@dataclass
class AgentStats:
    """The agent's own cost and delivery counters (filled by the publisher)."""

    bytes_sent: int = 0
    records_sent: int = 0
    publish_errors: int = 0
    publish_auth_errors: int = 0  # of publish_errors: credentials or ACLs refused
    spool_depth: Callable[[], int] = lambda: 0
    spool_bytes: Callable[[], int] = lambda: 0
    dropped: Callable[[], int] = lambda: 0
    spool_corrupt: Callable[[], int] = lambda: 0
    policy_errors: int = 0
    policy_reloads: int = 0
    control_commands: dict[str, int] = field(default_factory=dict)
    control_rejected: dict[str, int] = field(default_factory=dict)  # reason -> control records skipped
    cordon_read_errors: int = 0
    task_restarts: dict[str, int] = field(default_factory=dict)  # task -> restarts after an unexpected error


PodLookup = Callable[[str], tuple[str, str, str] | None]


class AgentCollector(Collector):
    def __init__(self, cores: Iterable[AgentCore], stats: AgentStats, pods: PodLookup | None = None):
        self.cores = list(cores)
        self.stats = stats
        self.pods = pods or (lambda uuid: None)

    def _labels(self, core: AgentCore, track: GpuTrack) -> list[str]:
        d = track.device
        pod = self.pods(d.uuid) or ("", "", "")
        return [str(d.index), d.uuid, d.device, d.model, core.node, d.pci_bus_id, pod[0], pod[1], pod[2]]

    @staticmethod
    def _value(track: GpuTrack, attr: str) -> float | None:
        source: Reading | None = track.last_watch if attr in WATCH_FIELDS else track.last_sample
        if source is None or (attr in WATCH_FIELDS and track.lost):
            return None
        value = getattr(source, attr)
        return None if value is None else float(value)

    def collect(self) -> Iterator[Metric]:
        rows = [(core, t, self._labels(core, t)) for core in self.cores for t in core.tracks]
        for name, doc, attr, scale in DCGM_FIELDS:
            fam = GaugeMetricFamily(name, doc, labels=DCGM_LABELS)
            for _, track, labels in rows:
                v = self._value(track, attr)
                if v is not None:
                    fam.add_metric(labels, v * scale)
            yield fam
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
                                labels=DCGM_LABELS)
        for _, track, labels in rows:
            if track.last_xid is not None:
                xid.add_metric(labels, float(track.last_xid))
        yield xid

        glabels = ["gpu", "UUID", "Hostname", "modelName"]
        health = GaugeMetricFamily("gpuaware_gpu_health_score", "GPU health score, 0 (failed) to 100.",
                                   labels=glabels)
        band = GaugeMetricFamily("gpuaware_gpu_health_band",
                                 "1 for the GPU's current health band (healthy, degraded, critical).",
                                 labels=[*glabels, "band"])
        comp = GaugeMetricFamily("gpuaware_gpu_health_component",
                                 "Health of one component, 100 = no penalty.", labels=[*glabels, "component"])
        anomaly = GaugeMetricFamily("gpuaware_gpu_anomaly_score", "Latest score of each edge detector.",
                                    labels=[*glabels, "detector"])
        interval = GaugeMetricFamily("gpuaware_agent_sampling_interval_seconds",
                                     "Current full-sample interval of the GPU.", labels=glabels)
        events = CounterMetricFamily("gpuaware_agent_events", "Edge events raised, by kind.",
                                     labels=[*glabels, "kind"])
        lost = GaugeMetricFamily("gpuaware_gpu_lost", "1 when the GPU stopped answering.", labels=glabels)
        cordoned = GaugeMetricFamily("gpuaware_gpu_cordoned",
                                     "1 while the node's gpuaware.io/cordoned-gpus annotation names the GPU.",
                                     labels=glabels)
        for core, track, labels in rows:
            gl = [labels[0], labels[1], core.node, labels[3]]
            health.add_metric(gl, track.health.score)
            band.add_metric([*gl, track.health.band.value.lower()], 1.0)
            for c, v in track.health.components().items():
                comp.add_metric([*gl, c], v)
            for det, v in track.detectors.scores().items():
                anomaly.add_metric([*gl, det], v)
            interval.add_metric(gl, track.sampler.interval)
            for kind, n in track.events.items():
                events.add_metric([*gl, str(kind).lower()], n)
            lost.add_metric(gl, 1.0 if track.lost else 0.0)
            cordoned.add_metric(gl, 1.0 if track.cordoned else 0.0)
        yield from (health, band, comp, anomaly, interval, events, lost, cordoned)
        yield from verdict_families(self.cores)

        nl = ["Hostname"]
        samples = CounterMetricFamily("gpuaware_agent_samples", "Full GPU samples taken.", labels=nl)
        watch = CounterMetricFamily("gpuaware_agent_watch_reads", "Cheap watch reads taken.", labels=nl)
        for core in self.cores:
            samples.add_metric([core.node], core.samples_taken)
            watch.add_metric([core.node], core.watch_reads)
        yield samples
        yield watch
        s = self.stats
        yield CounterMetricFamily("gpuaware_agent_bytes_sent", "Bytes of record values and keys delivered to Kafka.",
                                  value=s.bytes_sent)
        yield CounterMetricFamily("gpuaware_agent_records_sent", "Records delivered to Kafka.", value=s.records_sent)
        yield CounterMetricFamily("gpuaware_agent_cordon_read_errors",
                                  "Failed reads of the node's cordoned-GPU annotation (the last known cordons stand).",
                                  value=s.cordon_read_errors)
        yield CounterMetricFamily("gpuaware_agent_publish_errors", "Failed delivery attempts (retried from the spool).",
                                  value=s.publish_errors)
        yield CounterMetricFamily("gpuaware_agent_publish_auth_errors",
                                  "Delivery attempts refused for credentials or ACLs (retried with a long back-off).",
                                  value=s.publish_auth_errors)
        restarts = CounterMetricFamily("gpuaware_agent_task_restarts",
                                       "Agent tasks restarted after an unexpected error, by task.", labels=["task"])
        for task, n in sorted(s.task_restarts.items()):
            restarts.add_metric([task], n)
        yield restarts
        yield GaugeMetricFamily("gpuaware_agent_spool_depth", "Records waiting in the disk spool.",
                                value=s.spool_depth())
        yield GaugeMetricFamily("gpuaware_agent_spool_bytes", "Bytes in the disk spool.", value=s.spool_bytes())
        yield CounterMetricFamily("gpuaware_agent_spool_dropped",
                                  "Records dropped from the spool (oldest first, only past its bound).",
                                  value=s.dropped())
        yield CounterMetricFamily("gpuaware_agent_spool_corrupt",
                                  "Torn or corrupt spool records skipped and quarantined.", value=s.spool_corrupt())
        yield CounterMetricFamily("gpuaware_agent_policy_errors", "Sampling policies rejected.",
                                  value=s.policy_errors)
        yield CounterMetricFamily("gpuaware_agent_policy_reloads", "Sampling policies applied.",
                                  value=s.policy_reloads)
        rejected = CounterMetricFamily("gpuaware_agent_control_rejected",
                                       "Control records skipped (undecodable, or an error applying them), by reason.",
                                       labels=["reason"])
        for reason, n in sorted(s.control_rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected
