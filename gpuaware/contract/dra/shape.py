"""The shape NVIDIA's DRA driver gives GPUs as ResourceSlice devices: names, attributes, capacities, taint
keys, the apiserver's limits, and builders for slices of that shape (pure data, no I/O; the package's
docstring describes the shape)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"  # NVIDIA's GPU kubelet plugin (cmd/gpu-kubelet-plugin/main.go DriverName)
DEVICE_CLASS_GPU = "gpu.nvidia.com"  # NVIDIA's chart: deviceclass-gpu.yaml
DEVICE_CLASS_MIG = "mig.nvidia.com"  # NVIDIA's chart: deviceclass-mig.yaml
EXTENDED_RESOURCE = "nvidia.com/gpu"  # the GPU DeviceClass's extendedResourceName (device-plugin requests)

TYPE_GPU = "gpu"
TYPE_MIG = "mig"

# Attributes (unqualified: the driver's domain).
ATTR_TYPE = "type"
ATTR_UUID = "uuid"
ATTR_PRODUCT_NAME = "productName"
ATTR_BRAND = "brand"
ATTR_ARCHITECTURE = "architecture"
ATTR_CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
ATTR_DRIVER_VERSION = "driverVersion"
ATTR_CUDA_DRIVER_VERSION = "cudaDriverVersion"
ATTR_ADDRESSING_MODE = "addressingMode"
ATTR_PARENT_UUID = "parentUUID"  # MIG
ATTR_PROFILE = "profile"  # MIG, e.g. "1g.10gb"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

GPUAWARE_DOMAIN = "gpu.gpuaware.io"
ATTR_NVLINK_ISLAND = f"{GPUAWARE_DOMAIN}/nvlinkIsland"
ATTR_INDEX = f"{GPUAWARE_DOMAIN}/index"

# Capacities (bytes for memory, counts for the rest).
CAP_MEMORY = "memory"
MIG_CAPACITIES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")

# Device taints: NVIDIA's health monitor's keys (device_health.go), and the one gpuaware's health sets.
TAINT_XID = f"{DRIVER}/xid"
TAINT_GPU_LOST = f"{DRIVER}/gpu-lost"
TAINT_UNMONITORED = f"{DRIVER}/unmonitored"
TAINT_UNHEALTHY = f"{GPUAWARE_DOMAIN}/unhealthy"
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")

# Limits the apiserver enforces (k8s.io/api/resource/v1 types.go), checked here so a bad slice is
# refused with our reason rather than half-read.
MAX_DEVICES_PER_SLICE = 128
# kube-apiserver 1.36: "spec.devices: Too many: 88: must have at most 64 items" for devices with taints or
# consumesCounters.
MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS = 64
# kube-apiserver 1.36: "spec.sharedCounters: Too many: 9: must have at most 8 items".
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS_PER_DEVICE = 16


class SliceInvalid(ValueError):
    """A ResourceSlice (or a device in one) that is not what the apiserver or NVIDIA's driver would publish.

    ``field`` is the JSON path of what is wrong (``spec.devices[3].capacity.memory``), ``reason`` why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# -- names ----------------------------------------------------------------------------------------------

def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, profile_id: int, placement_start: int) -> str:
    """NVIDIA's canonical MIG name: the profile lower-cased, dots dropped, other odd characters as '-'."""
    pname = re.sub(r"[^a-z0-9-]", "-", profile.replace(".", "").lower()).strip("-")
    return f"gpu-{parent_minor}-mig-{pname}-{profile_id}-{placement_start}"


def counter_set_name(minor: int) -> str:
    return f"{gpu_device_name(minor)}-counter-set"


def memory_slice_counter(i: int) -> str:
    """A memory slice as a counter (counters may hold '-'); as a capacity it is ``memorySlice<i>``."""
    return f"memory-slice-{i}"


def slice_name(node: str, part: str = "gpus") -> str:
    """The name gpuaware gives a node's slice; ``part`` is ``gpus`` or ``counters``."""
    return f"{node}-{DRIVER}-{part}"


# -- builders -------------------------------------------------------------------------------------------

def semver(version: str) -> str:
    """``8.0`` -> ``8.0.0``: NVIDIA publishes versions through semver.MustParse(...).String()."""
    parts = version.split(".")
    if not version or len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"version {version!r} is not MAJOR[.MINOR[.PATCH]] digits")
    return ".".join([str(int(p)) for p in parts] + ["0"] * (3 - len(parts)))


def _attr(value: str | int | bool, kind: str = "") -> dict[str, Any]:
    if kind == "version":
        return {"version": semver(str(value))}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": str(value)}


@dataclass(frozen=True)
class MigPartition:
    """One MIG placement of a GPU (a partitionable device, whether or not it exists right now)."""

    profile: str  # "1g.10gb"
    profile_id: int  # the GPU instance profile id (nvidia-smi mig -lgip)
    placement_start: int
    placement_size: int  # memory slices held
    memory_bytes: int
    multiprocessors: int
    copy_engines: int = 1
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0
    uuid: str | None = None  # only a created MIG device has one


def _common_attributes(*, product_name: str, brand: str, architecture: str, cuda_compute_capability: str,
                       driver_version: str, cuda_driver_version: str, pci_bus_id: str | None,
                       nvlink_island: int | None, index: int | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        ATTR_PRODUCT_NAME: _attr(product_name),
        ATTR_BRAND: _attr(brand),
        ATTR_ARCHITECTURE: _attr(architecture),
        ATTR_CUDA_COMPUTE_CAPABILITY: _attr(cuda_compute_capability, "version"),
        ATTR_DRIVER_VERSION: _attr(driver_version, "version"),
        ATTR_CUDA_DRIVER_VERSION: _attr(cuda_driver_version, "version"),
    }
    if pci_bus_id:
        attrs[ATTR_PCI_BUS_ID] = _attr(pci_bus_id)
    if nvlink_island is not None:
        attrs[ATTR_NVLINK_ISLAND] = _attr(int(nvlink_island))
    if index is not None:
        attrs[ATTR_INDEX] = _attr(int(index))
    return attrs


def gpu_device(minor: int, *, uuid: str, product_name: str, memory_bytes: int, brand: str = "Nvidia",
               architecture: str = "", cuda_compute_capability: str = "0.0", driver_version: str = "0.0",
               cuda_driver_version: str = "0.0", pci_bus_id: str | None = None, nvlink_island: int | None = None,
               index: int | None = None, partitions: Sequence[MigPartition] = (),
               taints: Sequence[Mapping[str, Any]] = (), shareable: bool = False) -> dict[str, Any]:
    """A whole GPU as NVIDIA publishes it; with ``partitions`` it consumes its whole counter set
    (:func:`gpu_counter_set`), so that it and its MIG partitions exclude each other. ``shareable``: the
    device allows multiple allocations (DRA consumable capacity), each claim consuming a share of its
    ``memory`` (NVIDIA's driver does not publish this; gpuaware's publisher does when asked)."""
    if shareable and partitions:
        raise ValueError("shareable: a GPU with MIG partitions is shared by its partitions, not by memory shares")
    attrs = {ATTR_TYPE: _attr(TYPE_GPU), ATTR_UUID: _attr(uuid)}
    attrs.update(_common_attributes(product_name=product_name, brand=brand, architecture=architecture,
                                    cuda_compute_capability=cuda_compute_capability, driver_version=driver_version,
                                    cuda_driver_version=cuda_driver_version, pci_bus_id=pci_bus_id,
                                    nvlink_island=nvlink_island, index=index))
    device: dict[str, Any] = {"name": gpu_device_name(minor), "attributes": attrs,
                              "capacity": {CAP_MEMORY: {"value": str(int(memory_bytes))}}}
    if partitions:
        device["consumesCounters"] = [{"counterSet": counter_set_name(minor),
                                       "counters": _gpu_counters(memory_bytes, partitions)}]
    if taints:
        device["taints"] = [dict(t) for t in taints]
    if shareable:
        device["allowMultipleAllocations"] = True
    return device


def _gpu_counters(memory_bytes: int, partitions: Sequence[MigPartition]) -> dict[str, Any]:
    # The whole GPU holds every memory slice and the most of each engine any partition can use.
    counters: dict[str, Any] = {"memory": {"value": str(int(memory_bytes))}}
    for cap in MIG_CAPACITIES:
        most = max(_mig_capacity(p, cap) for p in partitions)
        counters[_counter_name(cap)] = {"value": str(most)}
    slices = max(p.placement_start + p.placement_size for p in partitions)
    for i in range(slices):
        counters[memory_slice_counter(i)] = {"value": "1"}
    return counters


def _counter_name(capacity: str) -> str:
    """NVIDIA's camelToDNSName: ``copyEngines`` -> ``copy-engines``."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity).lower()


def _mig_capacity(p: MigPartition, cap: str) -> int:
    return {"multiprocessors": p.multiprocessors, "copyEngines": p.copy_engines, "decoders": p.decoders,
            "encoders": p.encoders, "jpegEngines": p.jpeg_engines, "ofaEngines": p.ofa_engines}[cap]


def gpu_counter_set(minor: int, memory_bytes: int, partitions: Sequence[MigPartition]) -> dict[str, Any]:
    """The shared counter set of one GPU with MIG partitions (goes in the pool's counters slice)."""
    return {"name": counter_set_name(minor), "counters": _gpu_counters(memory_bytes, partitions)}


def mig_device(parent_minor: int, partition: MigPartition, *, parent_uuid: str, product_name: str,
               brand: str = "Nvidia", architecture: str = "", cuda_compute_capability: str = "0.0",
               driver_version: str = "0.0", cuda_driver_version: str = "0.0", pci_bus_id: str | None = None,
               nvlink_island: int | None = None, index: int | None = None,
               taints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A MIG partition of GPU ``parent_minor`` as NVIDIA publishes it (partitions.go PartGetDevice)."""
    p = partition
    attrs = {ATTR_TYPE: _attr(TYPE_MIG), ATTR_PARENT_UUID: _attr(parent_uuid), ATTR_PROFILE: _attr(p.profile)}
    if p.uuid:
        attrs[ATTR_UUID] = _attr(p.uuid)
    attrs.update(_common_attributes(product_name=product_name, brand=brand, architecture=architecture,
                                    cuda_compute_capability=cuda_compute_capability, driver_version=driver_version,
                                    cuda_driver_version=cuda_driver_version, pci_bus_id=pci_bus_id,
                                    nvlink_island=nvlink_island, index=index))
    capacity = {cap: {"value": str(_mig_capacity(p, cap))} for cap in MIG_CAPACITIES}
    capacity[CAP_MEMORY] = {"value": str(int(p.memory_bytes))}
    counters = {_counter_name(cap): {"value": str(_mig_capacity(p, cap))} for cap in MIG_CAPACITIES}
    counters["memory"] = {"value": str(int(p.memory_bytes))}
    for i in range(p.placement_start, p.placement_start + p.placement_size):
        counters[memory_slice_counter(i)] = {"value": "1"}
    device: dict[str, Any] = {
        "name": mig_device_name(parent_minor, p.profile, p.profile_id, p.placement_start),
        "attributes": attrs, "capacity": capacity,
        "consumesCounters": [{"counterSet": counter_set_name(parent_minor), "counters": counters}],
    }
    if taints:
        device["taints"] = [dict(t) for t in taints]
    return device


def resource_slice(node: str, devices: Sequence[Mapping[str, Any]] = (), *, driver: str = DRIVER,
                   pool: str | None = None, generation: int = 1, slice_count: int = 1,
                   shared_counters: Sequence[Mapping[str, Any]] = (), name: str | None = None,
                   labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` ResourceSlice of ``node`` (pool: the node's name by default).

    A slice holds either ``devices`` or ``shared_counters``, never both (the apiserver refuses that);
    ``slice_count`` is how many slices the pool has at this ``generation``."""
    if devices and shared_counters:
        raise ValueError("a ResourceSlice holds devices or sharedCounters, not both: put counters in a slice of "
                         "their own in the same pool")
    spec: dict[str, Any] = {"driver": driver, "nodeName": node,
                            "pool": {"name": pool or node, "generation": int(generation),
                                     "resourceSliceCount": int(slice_count)}}
    if shared_counters:
        spec["sharedCounters"] = [dict(c) for c in shared_counters]
    else:
        spec["devices"] = [dict(d) for d in devices]
    meta: dict[str, Any] = {"name": name or slice_name(node, "counters" if shared_counters else "gpus")}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


def device_taint(key: str = TAINT_UNHEALTHY, value: str = "", effect: str = "NoSchedule") -> dict[str, Any]:
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    taint: dict[str, Any] = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint
