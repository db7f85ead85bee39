"""ResourceSlices and DeviceTaintRules read as they are published (NVIDIA's driver, or
:mod:`gpuaware.plumbing.kube.resource_slices`): a malformed one is refused with the field and the reason
(:class:`SliceInvalid`), never half-read."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuaware.contract.dra.shape import (
    API_VERSION,
    ATTR_INDEX,
    ATTR_NVLINK_ISLAND,
    ATTR_PARENT_UUID,
    ATTR_PRODUCT_NAME,
    ATTR_PROFILE,
    ATTR_TYPE,
    ATTR_UUID,
    CAP_MEMORY,
    DRIVER,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS,
    MAX_TAINTS_PER_DEVICE,
    TAINT_EFFECTS,
    TYPE_GPU,
    TYPE_MIG,
    SliceInvalid,
)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")  # NVIDIA's canonicalMigNameRegex
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki|)$")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


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
