"""The dcgm-exporter-compatible families, built from the agent's last readings at scrape time.

Names, types, units and label names come from :mod:`gpuaware.contract.dcgm` (each schema, optional
``gpuaware_dcgm_`` prefix). Labels are dcgm-exporter's: ``gpu``, ``UUID``, ``pci_bus_id`` (DCGM's
8-digit PCI domain), ``device``, ``modelName``, the node, the driver version, ``GPU_I_PROFILE`` /
``GPU_I_ID`` on MIG instances, and ``pod``/``namespace``/``container`` when the kubelet maps the
GPU to a pod. An unsupported field is left out, never exported as zero.

Pods: a GPU held by one pod carries that pod's labels. On a GPU several pods share, device values
stay one series without pod labels (so sums never count a GPU once per pod), and, as
dcgm-exporter's per-process accounting does, ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED``
get one more series per pod (labels ``pod``, ``namespace``, ``container``, ``pod_uid``): the sum
over the pod's processes of NVML's per-process SM utilisation and used memory, 0 for a pod with
no process on the GPU.

Label budget: no series carries more than ``label_budget`` labels (``agent.metrics_label_budget``). The
agent's own labels always fit (the budget is at least :data:`~gpuaware.contract.dcgm.MIN_LABEL_BUDGET`);
the Kubernetes labels of the pod a series belongs to are added only where ``pod_labels``
(``agent.metrics_pod_labels``) names them, as ``label_<key>``, in that list's order, while the budget lasts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpuaware.agent.core import AgentCore, GpuTrack
from gpuaware.agent.podresources import PodAttribution, PodRef
from gpuaware.agent.readings import Reading
from gpuaware.contract.dcgm import (
    FAMILIES,
    LEGACY,
    MIN_LABEL_BUDGET,
    Schema,
    driver_label,
    family_name,
    node_label,
    pod_label_name,
)

# DCGM family -> Reading attribute (the XID family is built apart).
ATTRS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util_gpu", "DCGM_FI_DEV_MEM_COPY_UTIL": "util_mem",
    "DCGM_FI_DEV_ENC_UTIL": "util_enc", "DCGM_FI_DEV_DEC_UTIL": "util_dec",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib", "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved_mib",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c", "DCGM_FI_DEV_MEMORY_TEMP": "mem_temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w", "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe", "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remap_failure", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replays",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvlink_crc_errors",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "nvlink_bandwidth_kib",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "prof_gr_engine_active", "DCGM_FI_PROF_SM_ACTIVE": "prof_sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "prof_sm_occupancy", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "prof_tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "prof_dram_active", "DCGM_FI_PROF_PCIE_TX_BYTES": "prof_pcie_tx_bytes",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "prof_pcie_rx_bytes",
}
# Watch fields come from the newest (cheap) watch read, the rest from the last full sample.
WATCH_FIELDS = {"util_gpu", "fb_used_mib", "temp_c", "power_w", "throttle_reasons", "ecc_sbe_volatile",
                "ecc_dbe_volatile"}
# Per-MIG-instance values NVML gives (memory per MIG device; GPM per GPU instance on Hopper).
MIG_ATTRS = {"DCGM_FI_DEV_FB_USED": "fb_used_mib", "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
             "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active"}
PER_PROCESS = {"DCGM_FI_DEV_GPU_UTIL": "sm_util", "DCGM_FI_DEV_FB_USED": "used_mib"}

# err_msg for the XIDs the agent acts on (NVIDIA's XID catalogue, shortened); others read "Unknown Error".
XID_TEXT = {
    0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors", 48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning", 62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 68: "NVDEC0 Exception",
    69: "Graphics Engine class error", 74: "NVLINK Error", 79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate", 94: "Contained ECC error", 95: "Uncontained ECC error",
    109: "Context Switch Timeout Error", 119: "GSP RPC Timeout", 120: "GSP Error", 140: "Unrecovered ECC Error",
}


def pod_usage(track: GpuTrack, pods: list[PodRef], attribution: PodAttribution,
              attr: str) -> list[tuple[PodRef, float]]:
    """Each pod's share of a GPU several pods hold: the sum of ``attr`` (``sm_util``, ``used_mib``) over its
    processes in the last full sample, 0 for a pod with none. Pods without a UID are left out (their processes
    cannot be told apart); nothing without per-process readings."""
    sample = track.last_sample
    if sample is None or sample.processes is None:
        return []
    by_uid: dict[str, float] = {}
    for p in sample.processes:
        v = getattr(p, attr)
        uid = attribution.uid_of_pid(p.pid) if v is not None else None
        if uid:
            by_uid[uid] = by_uid.get(uid, 0.0) + float(v)
    return [(pod, by_uid.get(pod.uid, 0.0)) for pod in pods if pod.uid]


class DcgmCounter(Metric):
    """A counter whose samples keep the family's name (no ``_total``), as dcgm-exporter writes them."""

    def __init__(self, name: str, documentation: str):
        super().__init__(name, documentation, "counter")


@dataclass(frozen=True)
class Row:
    core: AgentCore
    track: GpuTrack
    labels: dict[str, str]
    pods: list[PodRef]
    owner: PodRef  # the one pod holding the GPU; PodRef("", "", "") when none or several


class DcgmFamilies:
    def __init__(self, schema: Schema = LEGACY, prefixed: bool = False, pods: PodAttribution | None = None,
                 label_budget: int = 30, pod_labels: Sequence[str] = ()):
        if label_budget < MIN_LABEL_BUDGET:
            raise ValueError(f"label budget {label_budget}: the agent itself may put {MIN_LABEL_BUDGET} labels on a "
                             "series")
        self.schema = schema
        self.prefixed = prefixed
        self.pods = pods
        self.budget = label_budget
        self.pod_labels = {key: pod_label_name(key) for key in pod_labels}  # in the allowlist's order
        self.node_label = node_label(schema)
        self.labels = ["gpu", "UUID", "pci_bus_id", "device", "modelName", self.node_label, driver_label(schema),
                       "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container"]

    def _row(self, core: AgentCore, track: GpuTrack) -> Row:
        d = track.device
        pods = self.pods.pods(d.uuid) if self.pods else []
        owner = pods[0] if len(pods) == 1 else PodRef("", "", "")
        values = [str(d.index), d.uuid, d.pci_bus_id, d.device, d.model, core.node, d.driver_version, "", "",
                  owner.name, owner.namespace, owner.container]
        # Empty labels are left out, as dcgm-exporter leaves GPU_I_* out on a whole GPU.
        return Row(core, track, {k: v for k, v in zip(self.labels, values, strict=True) if v}, pods, owner)

    def _fit(self, labels: dict[str, str], pod: PodRef) -> dict[str, str]:
        """``labels`` and the pod's allowlisted labels, in the allowlist's order, as many as the budget leaves."""
        if not self.pod_labels or not pod.labels:
            return labels
        out = dict(labels)
        have = dict(pod.labels)
        for key, name in self.pod_labels.items():
            if len(out) >= self.budget:
                break
            if have.get(key):
                out[name] = have[key]
        return out

    @staticmethod
    def value(track: GpuTrack, attr: str) -> float | None:
        source: Reading | None = track.last_watch if attr in WATCH_FIELDS else track.last_sample
        if source is None or (attr in WATCH_FIELDS and track.lost):
            return None
        value = getattr(source, attr)
        return None if value is None else float(value)

    def _family(self, name: str) -> Metric:
        fam = FAMILIES[name]
        if fam.type == "counter":
            return DcgmCounter(family_name(name, self.prefixed, self.schema), fam.help(self.schema))
        return Metric(family_name(name, self.prefixed, self.schema), fam.help(self.schema), "gauge")

    def collect(self, cores: list[AgentCore]) -> Iterator[Metric]:
        rows = [self._row(core, t) for core in cores for t in core.tracks]
        for name, attr in ATTRS.items():
            fam = self._family(name)
            scale = FAMILIES[name].scale(self.schema)
            for row in rows:
                v = self.value(row.track, attr)
                if v is not None:
                    fam.add_sample(fam.name, self._fit(row.labels, row.owner), v * scale)
                if name in MIG_ATTRS:
                    self._mig(fam, row, MIG_ATTRS[name], scale)
                if name in PER_PROCESS and len(row.pods) > 1 and v is not None:
                    self._per_pod(fam, row, PER_PROCESS[name], scale)
            yield fam
        yield self._xid(rows)

    def _mig(self, fam: Metric, row: Row, attr: str, scale: float) -> None:
        sample = row.track.last_sample
        for mig in (sample.mig or []) if sample is not None else []:
            v = getattr(mig, attr)
            if v is not None:
                labels = {**row.labels, "GPU_I_PROFILE": mig.profile, "GPU_I_ID": str(mig.gi_id)}
                fam.add_sample(fam.name, self._fit(labels, row.owner), float(v) * scale)

    def _per_pod(self, fam: Metric, row: Row, attr: str, scale: float) -> None:
        if self.pods is None:
            return
        for pod, v in pod_usage(row.track, row.pods, self.pods, attr):
            fam.add_sample(fam.name, self._fit({**row.labels, "pod": pod.name, "namespace": pod.namespace,
                                                "container": pod.container, "pod_uid": pod.uid}, pod), v * scale)

    def _xid(self, rows: list[Row]) -> Metric:
        """The last XID per GPU, 0 ("No Error") until the first, labelled with its code and text."""
        fam = self._family("DCGM_FI_DEV_XID_ERRORS")
        for row in rows:
            code = row.track.last_xid or 0
            labels = {**row.labels, "err_code": str(code), "err_msg": XID_TEXT.get(code, "Unknown Error")}
            fam.add_sample(fam.name, self._fit(labels, row.owner), float(code))
        return fam
