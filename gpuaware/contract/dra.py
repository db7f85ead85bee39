"""GPUs as Dynamic Resource Allocation devices (``resource.k8s.io/v1``), shaped as NVIDIA's DRA driver shapes them.

Pure data, no I/O: the names NVIDIA's GPU kubelet plugin (github.com/NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin``: deviceinfo.go, mig.go, partitions.go, device_health.go) publishes, builders
for ResourceSlice dicts of that shape, and :func:`parse_slice`, which reads a slice published by
NVIDIA's driver (or by :mod:`gpuaware.plumbing.kube.resource_slices`) as it is and refuses a malformed one with
the field and the reason (:class:`SliceInvalid`).

Shape (docs/dra.md):

* driver ``gpu.nvidia.com``; a whole GPU is device ``gpu-<minor>``, a MIG partition
  ``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>``;
* attributes without a domain belong to the driver's (``type``: ``gpu`` | ``mig``, ``uuid``,
  ``productName``, ``brand``, ``architecture``, ``cudaComputeCapability`` / ``driverVersion`` /
  ``cudaDriverVersion`` as semver versions, ``parentUUID`` and ``profile`` on MIG devices), the PCI ones
  are Kubernetes' standard ``resource.kubernetes.io/pciBusID`` / ``pcieRoot``;
* capacity ``memory`` in bytes; MIG partitions add ``multiprocessors``, ``copyEngines``, ``decoders``,
  ``encoders``, ``jpegEngines``, ``ofaEngines`` (static MIG devices also one ``memorySlice<i>`` per memory
  slice they hold; the builders here make partitionable devices, which hold their slices as counters);
* partitionable devices (KEP 4815): one counter set ``gpu-<minor>-counter-set`` per GPU that has MIG
  partitions; the whole GPU consumes all of it, each partition its share and its memory slices, so the
  allocator never hands out a GPU and one of its partitions, nor two overlapping partitions.
  kube-apiserver 1.36 refuses ``sharedCounters`` and ``devices`` in one slice ("only one of
  `sharedCounters` or `devices` is allowed"): counters go in a slice of their own in the same pool.

What NVIDIA does not publish, gpuaware publishes under its own domain ``gpu.gpuaware.io``:
``gpu.gpuaware.io/nvlinkIsland`` (the NVLink island a GPU belongs to, the index of the node's fully
connected group) and ``gpu.gpuaware.io/index`` (the GPU's index as the agent and the annotations count
it, which is not always the minor number).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")  # NVIDIA's canonicalMigNameRegex
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki|)$")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


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


# -- parser ---------------------------------------------------------------------------------------------

def quantity(value: Any, where: str) -> int:
    """A Kubernetes quantity (``80Gi``, ``85899345920``, ``1e3``) as an integer, or SliceInvalid."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SliceInvalid(where, f"quantity must be a string or an integer, not {type(value).__name__}")
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise SliceInvalid(where, f"{text!r} is not a Kubernetes quantity")
    number, suffix = m.groups()
    try:
        if suffix[:1] in ("e", "E"):
            amount = float(number) * 10 ** int(suffix[1:])
        elif suffix in ("n", "u", "m"):
            amount = float(number) * {"n": 1e-9, "u": 1e-6, "m": 1e-3}[suffix]
        else:
            amount = float(number) * _SUFFIX[suffix]
    except (ValueError, KeyError, OverflowError):
        raise SliceInvalid(where, f"{text!r} is not a Kubernetes quantity") from None
    if amount < 0:
        raise SliceInvalid(where, f"{text!r} is negative")
    if amount != amount or amount > 2**63:
        raise SliceInvalid(where, f"{text!r} is out of range")
    return int(amount)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


TOLERATION_OPERATORS = ("Exists", "Equal")
MAX_TOLERATIONS_PER_REQUEST = 16  # resource.k8s.io/v1 DeviceTolerationsMaxLength


@dataclass(frozen=True)
class Toleration:
    """A request's ``tolerations[]`` entry (``DeviceToleration``); ``tolerates`` is Kubernetes' own rule:
    an empty effect matches every effect, an empty key (with ``Exists``) every key."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    seconds: int | None = None  # tolerationSeconds: the taint eviction controller's, written back as given

    def to_api(self) -> dict[str, Any]:
        """As the allocation result carries it (``results[].tolerations``: a copy of the request's)."""
        out: dict[str, Any] = {"operator": self.operator}
        for name, v in (("key", self.key), ("value", self.value), ("effect", self.effect)):
            if v:
                out[name] = v
        if self.seconds is not None:
            out["tolerationSeconds"] = self.seconds
        return out

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


def tolerated(tolerations: Sequence[Toleration], taints: Sequence[Taint]) -> bool:
    """Every taint is tolerated by one of ``tolerations``."""
    return all(any(t.tolerates(taint) for t in tolerations) for taint in taints)


def _bounded_list(raw: Any, where: str, most: int, what: str) -> list:
    """``raw`` as a list of at most ``most`` items (None: empty), or :class:`SliceInvalid`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SliceInvalid(where, "must be a list")
    if len(raw) > most:
        raise SliceInvalid(where, f"more than {most} {what}")
    return raw


def parse_tolerations(raw: Any, where: str) -> tuple[Toleration, ...]:
    """A request's ``tolerations`` as typed data, or :class:`SliceInvalid` naming the field and the reason."""
    out = []
    for i, t in enumerate(_bounded_list(raw, where, MAX_TOLERATIONS_PER_REQUEST, "tolerations")):
        at = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise SliceInvalid(at, "must be an object")
        key, value, effect = t.get("key") or "", t.get("value") or "", t.get("effect") or ""
        operator = t.get("operator") or "Equal"
        for name, v in (("key", key), ("value", value), ("effect", effect), ("operator", operator)):
            if not isinstance(v, str):
                raise SliceInvalid(f"{at}.{name}", "must be a string")
        if key:
            _qualified_name(key, f"{at}.key")
        if operator not in TOLERATION_OPERATORS:
            raise SliceInvalid(f"{at}.operator", f"{operator!r} is not one of {', '.join(TOLERATION_OPERATORS)}")
        if operator == "Exists" and value:
            raise SliceInvalid(f"{at}.value", "must be empty with operator Exists")
        if operator == "Equal" and not key:
            raise SliceInvalid(f"{at}.key", "required with operator Equal (an empty key tolerates with Exists only)")
        if effect and effect not in TAINT_EFFECTS:
            raise SliceInvalid(f"{at}.effect", f"{effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        seconds = t.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise SliceInvalid(f"{at}.tolerationSeconds", "must be an integer")
        out.append(Toleration(key, operator, value, effect, seconds))
    return tuple(out)


@dataclass(frozen=True)
class DeviceView:
    """One device of a slice, typed. ``attributes`` keeps every attribute as published (qualified name ->
    value); the fields gpuaware schedules on are lifted out. ``minor`` is the GPU's (or the MIG parent's)."""

    name: str
    type: str  # "gpu", "mig", or what else a driver publishes (then most fields are empty)
    minor: int | None
    uuid: str | None
    product_name: str | None
    memory_bytes: int | None
    parent_uuid: str | None = None
    profile: str | None = None
    nvlink_island: int | None = None
    index: int | None = None
    capacity: Mapping[str, int] = field(default_factory=dict)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    consumes_counters: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    shareable: bool = False  # allowMultipleAllocations: claims consume shares of its capacity

    @property
    def schedulable(self) -> bool:
        """No NoSchedule / NoExecute taint (a ``None`` taint is informational)."""
        return not any(t.effect in ("NoSchedule", "NoExecute") for t in self.taints)


@dataclass(frozen=True)
class SliceView:
    name: str
    driver: str
    node: str | None
    pool: str
    generation: int
    slice_count: int
    devices: tuple[DeviceView, ...]
    shared_counters: Mapping[str, Mapping[str, int]]
    resource_version: str | None = None


def _need(obj: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict):
        raise SliceInvalid(where.rsplit(".", 1)[0] if "." in where else where, "must be an object")
    if key not in obj or obj[key] is None:
        raise SliceInvalid(where, "required")
    value = obj[key]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise SliceInvalid(where, f"must be {names}, not {type(value).__name__}")
    return value


def _attribute_value(raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise SliceInvalid(where, "must be an object with exactly one of int, bool, string, version")
    kinds = [k for k in ("int", "bool", "string", "version") if raw.get(k) is not None]
    if len(kinds) != 1 or len(raw) != 1:
        raise SliceInvalid(where, f"must hold exactly one of int, bool, string, version (has {sorted(raw)})")
    kind = kinds[0]
    value = raw[kind]
    expect = {"int": int, "bool": bool, "string": str, "version": str}[kind]
    if not isinstance(value, expect) or (kind == "int" and isinstance(value, bool)):
        raise SliceInvalid(f"{where}.{kind}", f"must be {expect.__name__}, not {type(value).__name__}")
    if kind in ("string", "version") and len(value) > 64:
        raise SliceInvalid(f"{where}.{kind}", "longer than 64 characters")
    if kind == "version" and not re.match(r"^\d+\.\d+\.\d+([-+].*)?$", value):
        raise SliceInvalid(f"{where}.version", f"{value!r} is not a semantic version")
    return value


def _qualified_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise SliceInvalid(where, "name must be a non-empty string")
    domain, _, ident = name.rpartition("/")
    if domain and not _DNS_SUBDOMAIN.match(domain):
        raise SliceInvalid(where, f"domain {domain!r} of {name!r} is not a DNS subdomain")
    if not _C_IDENTIFIER.match(ident):
        raise SliceInvalid(where, f"{ident!r} of {name!r} is not a C identifier of at most 64 characters")
    return name


def _counters(raw: Any, where: str) -> dict[str, int]:
    if not isinstance(raw, dict) or not raw:
        raise SliceInvalid(where, "must be a non-empty object of counter name -> {value}")
    out: dict[str, int] = {}
    for name, counter in raw.items():
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            raise SliceInvalid(f"{where}.{name}", "counter name must be a DNS label")
        out[name] = quantity(_need(counter, "value", f"{where}.{name}.value", (str, int)), f"{where}.{name}.value")
    return out


def _local(attrs: Mapping[str, Any], name: str, driver: str) -> Any:
    """An attribute by its short name: unqualified names are in the driver's domain."""
    if name in attrs:
        return attrs[name]
    return attrs.get(f"{driver}/{name}")


def parse_device(raw: Any, where: str, driver: str = DRIVER) -> DeviceView:
    name = _need(raw, "name", f"{where}.name", str)
    if not _DNS_LABEL.match(name):
        raise SliceInvalid(f"{where}.name", f"{name!r} is not a DNS label")
    attrs: dict[str, Any] = {}
    raw_attrs = raw.get("attributes") or {}
    if not isinstance(raw_attrs, dict):
        raise SliceInvalid(f"{where}.attributes", "must be an object")
    for key, value in raw_attrs.items():
        attrs[_qualified_name(key, f"{where}.attributes")] = _attribute_value(value, f"{where}.attributes.{key}")
    capacity: dict[str, int] = {}
    raw_cap = raw.get("capacity") or {}
    if not isinstance(raw_cap, dict):
        raise SliceInvalid(f"{where}.capacity", "must be an object")
    for key, value in raw_cap.items():
        _qualified_name(key, f"{where}.capacity")
        capacity[key] = quantity(_need(value, "value", f"{where}.capacity.{key}.value", (str, int)),
                                 f"{where}.capacity.{key}.value")
    if len(attrs) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceInvalid(where, f"more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities together")
    consumes: dict[str, dict[str, int]] = {}
    raw_consumes = raw.get("consumesCounters") or []
    if not isinstance(raw_consumes, list):
        raise SliceInvalid(f"{where}.consumesCounters", "must be a list")
    for i, c in enumerate(raw_consumes):
        cw = f"{where}.consumesCounters[{i}]"
        cs = _need(c, "counterSet", f"{cw}.counterSet", str)
        if cs in consumes:
            raise SliceInvalid(f"{cw}.counterSet", f"{cs!r} listed twice")
        consumes[cs] = _counters(c.get("counters"), f"{cw}.counters")
    taints = _taints(raw.get("taints"), f"{where}.taints")

    dtype = _local(attrs, ATTR_TYPE, driver)
    if driver == DRIVER and dtype is None:
        raise SliceInvalid(f"{where}.attributes.type", f"required on a {DRIVER} device")
    minor: int | None = None
    gpu_match, mig_match = _GPU_NAME.match(name), _MIG_NAME.match(name)
    if dtype == TYPE_GPU and driver == DRIVER:
        if not gpu_match:
            raise SliceInvalid(f"{where}.name", f"{name!r}: a GPU is named gpu-<minor>")
        minor = int(gpu_match.group(1))
        if _local(attrs, ATTR_UUID, driver) is None:
            raise SliceInvalid(f"{where}.attributes.uuid", "required on a GPU")
    elif dtype == TYPE_MIG and driver == DRIVER:
        if not mig_match:
            raise SliceInvalid(f"{where}.name",
                               f"{name!r}: a MIG device is named gpu-<minor>-mig-<profile>-<id>-<start>")
        minor = int(mig_match.group(1))
        for short in (ATTR_PARENT_UUID, ATTR_PROFILE):
            if _local(attrs, short, driver) is None:
                raise SliceInvalid(f"{where}.attributes.{short}", "required on a MIG device")
    elif gpu_match:
        minor = int(gpu_match.group(1))
    memory = capacity.get(CAP_MEMORY, capacity.get(f"{driver}/{CAP_MEMORY}"))
    if driver == DRIVER and dtype in (TYPE_GPU, TYPE_MIG) and memory is None:
        raise SliceInvalid(f"{where}.capacity.memory", f"required on a {dtype} device")
    shareable = raw.get("allowMultipleAllocations", False)
    if not isinstance(shareable, bool):
        raise SliceInvalid(f"{where}.allowMultipleAllocations", f"{shareable!r} is not a bool")
    island, index = attrs.get(ATTR_NVLINK_ISLAND), attrs.get(ATTR_INDEX)
    for key, value in ((ATTR_NVLINK_ISLAND, island), (ATTR_INDEX, index)):
        if value is not None and not isinstance(value, int):
            raise SliceInvalid(f"{where}.attributes.{key}", "must be an int attribute")
    return DeviceView(
        name=name, type=str(dtype) if dtype is not None else "", minor=minor,
        uuid=_local(attrs, ATTR_UUID, driver), product_name=_local(attrs, ATTR_PRODUCT_NAME, driver),
        memory_bytes=memory, parent_uuid=_local(attrs, ATTR_PARENT_UUID, driver),
        profile=_local(attrs, ATTR_PROFILE, driver), nvlink_island=island, index=index, capacity=capacity,
        attributes=attrs, consumes_counters=consumes, taints=taints, shareable=shareable)


def _taints(raw: Any, where: str) -> tuple[Taint, ...]:
    out = []
    for i, t in enumerate(_bounded_list(raw, where, MAX_TAINTS_PER_DEVICE, "taints")):
        key = _need(t, "key", f"{where}[{i}].key", str)
        _qualified_name(key, f"{where}[{i}].key")
        effect = _need(t, "effect", f"{where}[{i}].effect", str)
        if effect not in TAINT_EFFECTS:
            raise SliceInvalid(f"{where}[{i}].effect", f"{effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        value = t.get("value") or ""
        if not isinstance(value, str):
            raise SliceInvalid(f"{where}[{i}].value", "must be a string")
        out.append(Taint(key, value, effect))
    return tuple(out)


def parse_slice(obj: Any) -> SliceView:
    """A ResourceSlice (``resource.k8s.io/v1`` JSON) as typed devices, or :class:`SliceInvalid` naming the
    field and the reason. Devices of other drivers are read generically (their ``type`` may be empty);
    ``gpu.nvidia.com`` devices must look as NVIDIA's driver publishes them."""
    if not isinstance(obj, dict):
        raise SliceInvalid("", f"a ResourceSlice must be an object, not {type(obj).__name__}")
    api = obj.get("apiVersion")
    if api is not None and api != API_VERSION:
        raise SliceInvalid("apiVersion", f"{api!r}: only {API_VERSION} is read")
    kind = obj.get("kind")
    if kind is not None and kind != "ResourceSlice":
        raise SliceInvalid("kind", f"{kind!r} is not ResourceSlice")
    meta = _need(obj, "metadata", "metadata", dict)
    name = _need(meta, "name", "metadata.name", str)
    spec = _need(obj, "spec", "spec", dict)
    driver = _need(spec, "driver", "spec.driver", str)
    if not _DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        raise SliceInvalid("spec.driver", f"{driver!r} is not a DNS subdomain of at most 63 characters")
    pool = _need(spec, "pool", "spec.pool", dict)
    pool_name = _need(pool, "name", "spec.pool.name", str)
    if not pool_name:
        raise SliceInvalid("spec.pool.name", "required")
    generation = _need(pool, "generation", "spec.pool.generation", int)
    count = _need(pool, "resourceSliceCount", "spec.pool.resourceSliceCount", int)
    if generation < 0:
        raise SliceInvalid("spec.pool.generation", "must not be negative")
    if count < 1:
        raise SliceInvalid("spec.pool.resourceSliceCount", "must be at least 1")
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        raise SliceInvalid("spec.nodeName", "must be a string")
    scopes = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(scopes) != 1:
        raise SliceInvalid("spec", f"exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
                                   f"must be set (found {scopes or 'none'})")
    raw_devices = spec.get("devices") or []
    raw_counters = spec.get("sharedCounters") or []
    if not isinstance(raw_devices, list):
        raise SliceInvalid("spec.devices", "must be a list")
    if not isinstance(raw_counters, list):
        raise SliceInvalid("spec.sharedCounters", "must be a list")
    if raw_devices and raw_counters:
        raise SliceInvalid("spec", "only one of sharedCounters or devices is allowed")
    if len(raw_devices) > MAX_DEVICES_PER_SLICE:
        raise SliceInvalid("spec.devices", f"more than {MAX_DEVICES_PER_SLICE} devices")
    if len(raw_devices) > MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS and any(
            isinstance(d, dict) and (d.get("taints") or d.get("consumesCounters")) for d in raw_devices):
        raise SliceInvalid("spec.devices", f"more than {MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS} devices "
                                           "with taints or consumesCounters in one slice")
    devices = []
    seen: set[str] = set()
    for i, d in enumerate(raw_devices):
        view = parse_device(d, f"spec.devices[{i}]", driver)
        if view.name in seen:
            raise SliceInvalid(f"spec.devices[{i}].name", f"{view.name!r} listed twice")
        seen.add(view.name)
        devices.append(view)
    if len(raw_counters) > MAX_COUNTER_SETS_PER_SLICE:
        raise SliceInvalid("spec.sharedCounters", f"more than {MAX_COUNTER_SETS_PER_SLICE} counter sets")
    shared: dict[str, dict[str, int]] = {}
    for i, cs in enumerate(raw_counters):
        cname = _need(cs, "name", f"spec.sharedCounters[{i}].name", str)
        if not _DNS_LABEL.match(cname):
            raise SliceInvalid(f"spec.sharedCounters[{i}].name", f"{cname!r} is not a DNS label")
        if cname in shared:
            raise SliceInvalid(f"spec.sharedCounters[{i}].name", f"{cname!r} listed twice")
        shared[cname] = _counters(cs.get("counters"), f"spec.sharedCounters[{i}].counters")
    return SliceView(name=name, driver=driver, node=node, pool=pool_name, generation=generation, slice_count=count,
                     devices=tuple(devices), shared_counters=shared, resource_version=meta.get("resourceVersion"))


def pool_devices(slices: Iterable[SliceView]) -> dict[tuple[str, str], list[DeviceView]]:
    """The devices of each (driver, pool) at its newest generation: a pool being republished may briefly have
    slices of two generations, and only the newest counts (the apiserver's allocator does the same)."""
    newest: dict[tuple[str, str], int] = {}
    kept: list[SliceView] = []
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
        kept.append(s)
    out: dict[tuple[str, str], list[DeviceView]] = {}
    for s in kept:
        key = (s.driver, s.pool)
        if s.generation == newest[key]:
            out.setdefault(key, []).extend(s.devices)
    return out



def incomplete_pools(slices: Iterable[SliceView]) -> set[tuple[str, str]]:
    """(driver, pool) whose newest generation has fewer slices than its ``resourceSliceCount`` says: being
    republished right now. kube-scheduler's allocator does not allocate from such a pool; neither should we."""
    newest: dict[tuple[str, str], tuple[int, int, int]] = {}  # generation, slices seen, slices announced
    for s in slices:
        key = (s.driver, s.pool)
        gen, seen, count = newest.get(key, (-1, 0, 0))
        if s.generation > gen:
            newest[key] = (s.generation, 1, s.slice_count)
        elif s.generation == gen:
            newest[key] = (gen, seen + 1, max(count, s.slice_count))
    return {key for key, (_, seen, count) in newest.items() if seen < count}

@dataclass(frozen=True)
class TaintRuleView:
    """A ``DeviceTaintRule`` (``resource.k8s.io/v1beta2``): ``taint`` on every device its selector matches
    (an empty selector field matches any)."""

    name: str
    driver: str | None
    pool: str | None
    device: str | None
    taint: Taint

    def applies(self, driver: str, pool: str, device: str) -> bool:
        return ((self.driver is None or self.driver == driver) and (self.pool is None or self.pool == pool)
                and (self.device is None or self.device == device))


def parse_taint_rule(obj: Any) -> TaintRuleView:
    """A DeviceTaintRule as typed data, or :class:`SliceInvalid` naming the field and the reason."""
    if not isinstance(obj, dict):
        raise SliceInvalid("", f"a DeviceTaintRule must be an object, not {type(obj).__name__}")
    name = _need(_need(obj, "metadata", "metadata", dict), "name", "metadata.name", str)
    spec = _need(obj, "spec", "spec", dict)
    selector = spec.get("deviceSelector") or {}
    if not isinstance(selector, dict):
        raise SliceInvalid("spec.deviceSelector", "must be an object")
    picked = {}
    for key in ("driver", "pool", "device"):
        value = selector.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise SliceInvalid(f"spec.deviceSelector.{key}", "must be a non-empty string")
        picked[key] = value
    try:
        (taint,) = _taints([_need(spec, "taint", "spec.taint", dict)], "spec.taint")
    except SliceInvalid as exc:  # one taint, not a list: no [0] in the field
        raise SliceInvalid(exc.field.replace("spec.taint[0]", "spec.taint"), exc.reason) from None
    return TaintRuleView(name, picked["driver"], picked["pool"], picked["device"], taint)
