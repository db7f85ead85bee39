"""The dcgm-exporter-compatible metric contract: family names, Prometheus types, units, label names.

Shared by the agent (which exports the families) and the dashboards and rules (which query them),
so one table says what every family is. Types are dcgm-exporter's ``etc/default-counters.csv``
(counters for energy, PCIe replays, ECC totals, retired pages, remapped rows, NVLink CRC errors
and bandwidth; gauges otherwise).

Three schemas (``agent.metrics_schema``):

- ``dcgm-legacy``: dcgm-exporter up to 4.8, the units in each family's help (%, MiB, MHz, mJ) and
  the labels ``Hostname`` and ``DCGM_FI_DRIVER_VERSION``;
- ``dcgm-4.9``: dcgm-exporter 4.9.0, the families it renames to DCGM 4.7's names (:data:`RENAMED`, with the
  sources each name was read from), four of them in base units (SM and memory clocks in hertz, energy in joules,
  GPU utilisation as a 0-1 ratio), the driver version as the label ``DCGM_FI_SYSTEM_DRIVER_VERSION`` and the
  node as ``hostname``. A family whose 4.9.0 name no source read here confirms keeps its legacy name and unit
  (:data:`UNCONFIRMED_49`);
- ``dcgm-4.10``: ``dcgm-4.9`` with the PCIe throughput families under dcgm-exporter 4.10.0's names,
  ``DCGM_FI_PROF_PCIE_{TX,RX}_BYTES_PER_SECOND``: same unit (bytes/s), same type (gauge).

In coexistence with the GPU Operator's dcgm-exporter (``agent.dcgm_exporter: beside``) the agent's
copies are renamed ``gpuaware_dcgm_*`` (``DCGM_FI_DEV_GPU_UTIL`` -> ``gpuaware_dcgm_fi_dev_gpu_util``)
so nothing is counted twice. :func:`translate` rewrites a query written for the legacy schema
without prefix into the same query for any other (schema, prefix), returning legacy units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Schema = Literal["dcgm-legacy", "dcgm-4.9", "dcgm-4.10"]
SCHEMAS: tuple[Schema, ...] = ("dcgm-legacy", "dcgm-4.9", "dcgm-4.10")
LEGACY: Schema = "dcgm-legacy"
PREFIX = "gpuaware_dcgm_"


@dataclass(frozen=True)
class Family:
    name: str
    type: Literal["gauge", "counter"]
    doc: str
    unit: str = ""  # legacy unit, as dcgm-exporter's help text gives it
    base_unit: str = ""  # the 4.9 unit, where dcgm-exporter 4.9.0 changes it (with the name, RENAMED)
    base_scale: float = 1.0  # legacy value * base_scale = 4.9 value

    def help(self, schema: Schema) -> str:
        unit = self.base_unit if schema != LEGACY and self.base_unit else self.unit
        return f"{self.doc} (in {unit})." if unit else f"{self.doc}."

    def scale(self, schema: Schema) -> float:
        return 1.0 if schema == LEGACY else self.base_scale


_RATIO, _MHZ = ("%", "ratio 0-1", 0.01), ("MHz", "Hz", 1e6)
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization", *_RATIO),
    Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization", "%"),
    Family("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization", "%"),
    Family("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization", "%"),
    Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used", "MiB"),
    Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free", "MiB"),
    Family("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved", "MiB"),
    Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency", *_MHZ),
    Family("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency", *_MHZ),
    Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature", "C"),
    Family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature", "C"),
    Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw", "W"),
    Family("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit", "W"),
    Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot", "mJ", "J",
           1e-3),
    Family("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask)"),
    Family("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors"),
    Family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors"),
    Family("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors"),
    Family("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors"),
    Family("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors"),
    Family("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors"),
    Family("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries"),
    Family("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
           "Total number of NVLink flow-control CRC errors"),
    Family("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total NVLink data transferred over all lanes",
           "KiB"),
    Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered"),
    Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active"),
    Family("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned"),
    Family("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM"),
    Family("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active"),
    Family("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active"),
    Family("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus", "bytes/s"),
    Family("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus", "bytes/s"),
)}

# Families a schema writes under another name (legacy name -> that schema's).
#
# dcgm-exporter 4.9.0 (DCGM 4.7.0). Its release notes (github.com/NVIDIA/dcgm-exporter/releases/tag/4.9.0, read
# through newreleases.io/project/github/NVIDIA/dcgm-exporter/release/4.9.0) say it renames "the 23 default and
# profiling-preset fields that DCGM 4.7 deprecates to their new DCGM 4.7 names", eleven of them with a new unit
# (clocks MHz -> hertz, energy mJ -> joules, utilization % -> 0-1 ratio, GPU memory MiB -> bytes, NVLink
# throughput MB/s -> bytes per second), and renames the driver-version label DCGM_FI_DRIVER_VERSION ->
# DCGM_FI_SYSTEM_DRIVER_VERSION. The notes list no per-field names, and the 4.9.0 etc/default-counters.csv was
# not readable here (the dcgm-exporter snapshot ends at main d5e5f51, 4.8.2; the index holds older CSVs only).
# A family is renamed below only when all three hold:
#   1. it is an active row of etc/default-counters.csv at NVIDIA/dcgm-exporter d5e5f51 (the shipped default set);
#   2. NVIDIA's dcgm_fields.h names its replacement: the "deprecated field names" block
#      (#define <old> <new>) of NVIDIA/go-dcgm pkg/dcgm/dcgm_fields.h at b7fa31542404 (DCGM 4.6.1; the same block
#      is in NVIDIA/DCGM dcgmlib/dcgm_fields.h at 72fa3feaa67d, DCGM 4.6.0), or, for a unit change, the base-unit
#      field go-dcgm pairs with the legacy one (pkg/dcgm/base_unit_fields_test.go at b7fa31542404:
#      SM_CLOCK_HERTZ 1603 <- SM_CLOCK 100, MEMORY_CLOCK_HERTZ 1604 <- MEM_CLOCK 101,
#      GPU_ENERGY_JOULES_TOTAL 1611 <- TOTAL_ENERGY_CONSUMPTION 156);
#   3. the new unit, where there is one, is the one the 4.9.0 notes give for that kind of field.
# No DCGM 4.7 header was readable (both snapshots stop at 4.6.x), so a 4.7 change to a 4.6 replacement name
# would not show here. GPU_UTIL -> GPU_UTIL_RATIO: 4.6.1 defines GPU_UTIL_RATIO (id 203) as GPU_UTIL's
# replacement; its 0-1 ratio unit is the 4.9.0 notes'. Types stay dcgm-exporter's 4.8 CSV types (d5e5f51).
RENAMED_49: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "DCGM_FI_DEV_SM_CLOCK_HERTZ",
    "DCGM_FI_DEV_MEM_CLOCK": "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
}

# Families dcgm-4.9 keeps under their legacy name and unit, and why (the old DCGM fields keep their ids and
# units: go-dcgm base_unit_fields_test.go, "different units must retain different field IDs").
UNCONFIRMED_49: dict[str, str] = {
    **dict.fromkeys(("DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"),
                    "default row the 4.9.0 notes move to a 0-1 ratio; no source read names the ratio field"),
    **dict.fromkeys(("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"),
                    "default row the 4.9.0 notes move to bytes; no source read names the bytes field"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "default row; DCGM 4.6 aliases it to NVLINK_THROUGHPUT_TOTAL (same id and "
                                          "unit), but the 4.9.0 notes move NVLink throughput to bytes per second",
    **dict.fromkeys(("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_DEV_RETIRED_SBE",
                     "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                     "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
                    "DCGM deprecates the name, but it is no active default row (commented out or opt-in): whether "
                    "4.9.0 renames it is not in the notes"),
    **dict.fromkeys(("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                     "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
                    "DCGM 4.6 keeps the name (not deprecated); the 4.9.0 CSV was not readable"),
    **dict.fromkeys(("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"),
                    "DCGM 4.6 keeps the name; 4.10.0's notes rename it from this name (below)"),
}

# dcgm-exporter 4.10.0 (DCGM 4.8.0; release notes, github.com/NVIDIA/dcgm-exporter/releases/tag/4.10.0) renames four
# profiling fields in its shipped collectors, "all four still use bytes per second": DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}
# _BYTES -> *_BYTES_PER_SECOND; PCIe TX/RX are collected by default, NVLink TX/RX are optional. The PCIe rows stay
# gauges: etc/default-counters.csv (main at d5e5f51) has "DCGM_FI_PROF_PCIE_TX_BYTES, gauge, The rate of data
# transmitted over the PCIe bus ... in bytes per second"; the 4.10.0 CSV itself was not readable here. The agent
# exports no DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES (its NVLink family is DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL), so only the
# PCIe pair is renamed; the rest is 4.9.0's.
RENAMED: dict[Schema, dict[str, str]] = {
    "dcgm-4.9": RENAMED_49,
    "dcgm-4.10": {**RENAMED_49,
                  "DCGM_FI_PROF_PCIE_TX_BYTES": "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",
                  "DCGM_FI_PROF_PCIE_RX_BYTES": "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND"},
}

# What NVML gives only through GPM (Hopper and newer): dcgm-exporter fills these from DCGM's
# profiling module on Volta and newer, which an NVML-only agent cannot use. PCIe bytes are not in
# the list: without GPM the agent reads them from nvmlDeviceGetPcieThroughput.
GPM_ONLY = frozenset({"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                      "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"})


def node_label(schema: Schema) -> str:
    return "Hostname" if schema == LEGACY else "hostname"


def driver_label(schema: Schema) -> str:
    return "DCGM_FI_DRIVER_VERSION" if schema == LEGACY else "DCGM_FI_SYSTEM_DRIVER_VERSION"


DRIVER_LABELS = frozenset({"DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"})  # labels, never families


def agent_labels(schema: Schema) -> tuple[str, ...]:
    """Every label name the agent itself may put on one DCGM series (the device's, MIG's, the pod's, the XID's).

    No series carries them all; their count is the least label budget (``agent.metrics_label_budget``) that
    never has to drop one of them. Allowlisted pod labels (:func:`pod_label_name`) fill what the budget leaves.
    """
    return ("gpu", "UUID", "pci_bus_id", "device", "modelName", node_label(schema), driver_label(schema),
            "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container", "pod_uid", "err_code", "err_msg")


MIN_LABEL_BUDGET = len(agent_labels(LEGACY))
_LABEL_KEY = re.compile(r"^(?:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def pod_label_name(key: str) -> str:
    """The metric label a Kubernetes pod label ``key`` becomes, as kube-state-metrics names them:
    ``app.kubernetes.io/name`` -> ``label_app_kubernetes_io_name`` (never one of the agent's own)."""
    if not _LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key")
    return "label_" + re.sub(r"[^A-Za-z0-9_]", "_", key)


def family_name(name: str, prefixed: bool, schema: Schema = LEGACY) -> str:
    """The name ``schema`` writes the family ``name`` (its legacy name) under, with the prefix when ``prefixed``."""
    name = RENAMED.get(schema, {}).get(name, name)
    return PREFIX + name.removeprefix("DCGM_").lower() if prefixed else name


def exported_names(schema: Schema, prefixed: bool) -> frozenset[str]:
    """Every DCGM family name the agent can write under ``schema``."""
    return frozenset(family_name(n, prefixed, schema) for n in FAMILIES)


def _number(v: float) -> str:
    return format(v, ".15g")


_NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")
_RANGE_FN = re.compile(r"\b(rate|irate|increase|delta|deriv)\((DCGM_FI_[A-Z0-9_]+)(\{[^}]*\})?(\[[^\]]*\])\)")
_SELECTOR = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+)(\{[^}]*\})?(?![\[A-Z0-9_{])")


def translate(expr: str, schema: Schema, prefixed: bool, *, units: bool = True) -> str:
    """A query written for the legacy unprefixed schema, for ``schema``/``prefixed``, in legacy units.

    Family names follow the schema (:data:`RENAMED`) and the prefix.
    Selectors of families whose unit differs are divided back by the schema's scale (inside a
    range function, the function's result is, as rate and increase are linear). ``units=False``
    only renames (for ``label_values``). A family used with a range outside those functions
    cannot be rescaled and raises ``ValueError``.
    """
    if units and schema != LEGACY:
        def back(inner: str, name: str) -> str:
            scale = FAMILIES[name].scale(schema) if name in FAMILIES else 1.0
            return inner if scale == 1.0 else f"({inner} / {_number(scale)})"

        expr = _RANGE_FN.sub(lambda m: back(m.group(0), m.group(2)), expr)
        stripped = _RANGE_FN.sub("", expr)
        for m in re.finditer(r"\b(DCGM_FI_[A-Z0-9_]+)(\{[^}]*\})?\[", stripped):
            if FAMILIES.get(m.group(1), FAMILIES["DCGM_FI_DEV_XID_ERRORS"]).scale(schema) != 1.0:
                raise ValueError(f"{m.group(1)} is used with a range outside rate/increase: cannot rescale {expr!r}")
        parts = re.split(r"(\b(?:rate|irate|increase|delta|deriv)\(DCGM_FI_[A-Z0-9_]+(?:\{[^}]*\})?\[[^\]]*\]\))", expr)
        expr = "".join(p if i % 2 else _SELECTOR.sub(lambda m: back(m.group(0), m.group(1)), p)
                       for i, p in enumerate(parts))
    if schema != LEGACY:
        expr = re.sub(r"\bHostname\b", node_label(schema), expr)
        expr = re.sub(r"\bDCGM_FI_DRIVER_VERSION\b", driver_label(schema), expr)
    if prefixed or RENAMED.get(schema):
        expr = _NAME.sub(lambda m: m.group(0) if m.group(0) in DRIVER_LABELS
                         else family_name(m.group(0), prefixed, schema), expr)
    return expr
