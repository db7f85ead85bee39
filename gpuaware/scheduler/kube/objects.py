"""Kubernetes objects (the API's JSON, as dicts) to the scheduling core's model, and back.

The pod contract (documented in docs/scheduler.md):

- GPUs: ``resources.limits["nvidia.com/gpu"]`` as today (whole GPUs); a fraction of one GPU with
  the annotation ``gpuaware.io/gpu-milli`` (1-999), optionally ``gpuaware.io/gpu-memory-mib`` and
  ``gpuaware.io/sharing`` (``time-slicing``, ``mps`` or ``mig``);
- requirements: ``gpuaware.io/gpu-models`` (comma list), ``gpuaware.io/min-gpu-memory-gib``,
  ``gpuaware.io/min-memory-bandwidth-gbs``, ``gpuaware.io/tensor-cores``, ``gpuaware.io/interconnect``;
- behaviour: ``gpuaware.io/qos`` (``latency-sensitive``/``batch``), ``gpuaware.io/preemptible``,
  ``gpuaware.io/checkpoint`` (the workload answers checkpoint requests), ``gpuaware.io/deferrable``,
  ``gpuaware.io/gang`` + ``gpuaware.io/gang-size`` (all or nothing; or a PodGroup's gang:
  ``podgroups``), ``gpuaware.io/duration-s``;
- the tenant is the GPUQueue that lists the pod's namespace (never a pod annotation: a pod cannot
  claim another tenant's quota; Kueue's queue-name label picks among those that list it: ``queues``); the
  priority level comes from ``spec.priority`` (the PriorityClass).

What the scheduler writes on a pod: ``gpuaware.io/gpus`` (JSON list of ``{"index", "uuid",
"milli"}``) and ``gpuaware.io/sharing``, before binding, for the device plugin / MPS / MIG setup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuaware.contract.annotations import (
    ANN_GPUS,
    ANN_SHARING,
    GPU_RESOURCE,
    LABEL_GPU_MEMORY,
    LABEL_PRODUCT,
    PREFIX,
)
from gpuaware.scheduler.core.cluster import Allocation, NodeSpec
from gpuaware.scheduler.core.gpu_specs import SPECS, spec_of
from gpuaware.scheduler.core.runtime import RuntimeEstimate
from gpuaware.scheduler.core.workload import PriorityLevel, Workload

# PriorityClass values at or above these are gpuaware's high and medium levels.
HIGH_PRIORITY_VALUE = 100_000
MEDIUM_PRIORITY_VALUE = 1_000
SHARING_MODES = {"time-slicing": "shared", "mps": "mps", "mig": "mig"}


class PodSpecError(ValueError):
    """A pod's gpuaware annotations or GPU resources cannot be scheduled as written."""


def key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


QUANTITY = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_SUFFIX = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: str | int | float, what: str = "quantity") -> float:
    """A non-negative Kubernetes quantity ("500m", "2Gi", "1.5", "1e3") as a number of base units."""
    raw = str(value).strip()
    m = QUANTITY.match(raw)
    if not m:
        raise PodSpecError(f"{what}: {value!r} is not a Kubernetes quantity")
    number, suffix = m.group(1), m.group(3) or ""
    result = float(number + suffix) if suffix[:1] in ("e", "E") else float(number) * _SUFFIX[suffix]
    if not result < 1e21:  # beyond any machine (and catches inf)
        raise PodSpecError(f"{what}: {value!r} is out of range")
    return result


def quantity_milli(value: str | int | float, what: str = "cpu") -> int:
    """A quantity in thousandths (cpu: millicores)."""
    return round(quantity(value, what) * 1000)


def quantity_mib(value: str | int | float, what: str = "memory") -> int:
    """A memory quantity in MiB (rounded down)."""
    return int(quantity(value, what) // 2**20)


def whole(value: str | int | float, what: str) -> int:
    """An extended resource count: a whole, non-negative number."""
    q = quantity(value, what)
    if q != int(q):
        raise PodSpecError(f"{what}: {value!r} is not a whole number")
    return int(q)


def short_model(product: str) -> str:
    """The GPU model name the core knows ("NVIDIA-H100-80GB-HBM3" -> "H100"); else the product itself."""
    tokens = product.replace("-", " ").replace("_", " ").split()
    for t in tokens:
        if t in SPECS:
            return "V100M32" if t == "V100" and "32GB" in tokens else t
    return product


def node_spec(node: Mapping[str, Any]) -> NodeSpec:
    meta, status = node["metadata"], node.get("status", {})
    alloc = status.get("allocatable") or status.get("capacity") or {}
    labels = meta.get("labels") or {}
    gpus = whole(alloc.get(GPU_RESOURCE, 0) or 0, f"node {meta['name']} allocatable {GPU_RESOURCE}")
    model = short_model(labels.get(LABEL_PRODUCT, "unknown")) if gpus else "none"
    mem = labels.get(LABEL_GPU_MEMORY)
    spec = spec_of(model)
    gpu_mem = int(mem) if mem and mem.isdigit() else int(spec.memory_gib * 1024) if spec else 0
    return NodeSpec(meta["name"], quantity_milli(alloc.get("cpu", "0"), f"node {meta['name']} allocatable cpu"),
                    quantity_mib(alloc.get("memory", "0"), f"node {meta['name']} allocatable memory"),
                    gpus, model, gpu_mem)


# The taint the GPU health chain puts on a node to be rebooted (gpuaware.scheduler.kube.node_conditions): gpuaware
# honours its own NoSchedule taint like a cordon; other taints are kube-scheduler's business.
HEALTH_TAINT_KEY = "gpuaware.io/gpu-unhealthy"


def schedulable(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec", {})
    if spec.get("unschedulable"):
        return False
    if any(t.get("key") == HEALTH_TAINT_KEY and t.get("effect") == "NoSchedule" for t in spec.get("taints") or []):
        return False
    conditions = node.get("status", {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def level_of(priority_value: int) -> PriorityLevel:
    """gpuaware's priority level of a PriorityClass value."""
    return (PriorityLevel.HIGH if priority_value >= HIGH_PRIORITY_VALUE
            else PriorityLevel.MEDIUM if priority_value >= MEDIUM_PRIORITY_VALUE else PriorityLevel.LOW)


def priority_level(pod: Mapping[str, Any]) -> PriorityLevel:
    return level_of(int(pod.get("spec", {}).get("priority") or 0))


def _flag(ann: Mapping[str, str], name: str, default: bool) -> bool:
    raw = ann.get(PREFIX + name)
    if raw is None:
        return default
    if raw.lower() in ("true", "yes", "1"):
        return True
    if raw.lower() in ("false", "no", "0"):
        return False
    raise PodSpecError(f"{PREFIX}{name}: {raw!r} is not true or false")


def _number(ann: Mapping[str, str], name: str, lo: float, hi: float) -> float | None:
    raw = ann.get(PREFIX + name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise PodSpecError(f"{PREFIX}{name}: {raw!r} is not a number") from None
    if not lo <= value <= hi:
        raise PodSpecError(f"{PREFIX}{name}: {raw} is outside {lo:g}..{hi:g}")
    return value


def is_gpuaware(pod: Mapping[str, Any]) -> bool:
    """Whether gpuaware has anything to say about this pod (GPU requests or gpuaware annotations)."""
    ann = pod["metadata"].get("annotations") or {}
    return gpu_request(pod) > 0 or any(k.startswith(PREFIX) for k in ann)


def gpu_request(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:  # null in JSON: none
        res = c.get("resources") or {}
        raw = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        total += whole(raw or 0, f"container {c.get('name')} {GPU_RESOURCE}")
    return total


def _requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """Effective CPU (milli) and memory (MiB) requests: sum over containers, at least any init container's."""
    spec = pod.get("spec") or {}

    def req(c: Mapping[str, Any], name: str) -> str:
        res = c.get("resources") or {}
        return (res.get("requests") or {}).get(name) or (res.get("limits") or {}).get(name) or "0"

    cpu = sum(quantity_milli(req(c, "cpu"), f"container {c.get('name')} cpu") for c in spec.get("containers") or [])
    mem = sum(quantity_mib(req(c, "memory"), f"container {c.get('name')} memory") for c in spec.get("containers") or [])
    for c in spec.get("initContainers") or []:
        cpu = max(cpu, quantity_milli(req(c, "cpu"), f"init container {c.get('name')} cpu"))
        mem = max(mem, quantity_mib(req(c, "memory"), f"init container {c.get('name')} memory"))
    return cpu, mem


@dataclass(frozen=True)
class PodWorkload:
    workload: Workload
    gang_size: int  # 1: no gang


def workload_of(pod: Mapping[str, Any], tenant: str, submit_s: float) -> PodWorkload:
    """The core's workload for a pod; raises ``PodSpecError`` naming the annotation that is wrong."""
    meta = pod["metadata"]
    ann = meta.get("annotations") or {}
    whole = gpu_request(pod)
    milli = _number(ann, "gpu-milli", 1, 999)
    if milli is not None and whole > 1:
        raise PodSpecError(f"{PREFIX}gpu-milli: a fraction is of one GPU, but the pod asks for {whole} GPUs")
    sharing = ann.get(ANN_SHARING, "time-slicing")
    if sharing not in SHARING_MODES:
        raise PodSpecError(f"{ANN_SHARING}: {sharing!r} is not one of {sorted(SHARING_MODES)}")
    interconnect = ann.get(PREFIX + "interconnect", "any")
    if interconnect not in ("any", "nvlink", "same-node"):
        raise PodSpecError(f"{PREFIX}interconnect: {interconnect!r} is not any, nvlink or same-node")
    qos = ann.get(PREFIX + "qos", "batch")
    if qos not in ("latency-sensitive", "batch"):
        raise PodSpecError(f"{PREFIX}qos: {qos!r} is not latency-sensitive or batch")
    gang = ann.get(PREFIX + "gang")
    gang_size = int(_number(ann, "gang-size", 1, 4096) or 1)
    if gang_size > 1 and not gang:
        raise PodSpecError(f"{PREFIX}gang-size: needs {PREFIX}gang (the gang's name)")
    cpu, mem = _requests(pod)
    priority = priority_level(pod)
    models = tuple(m.strip() for m in ann.get(PREFIX + "gpu-models", "").split(",") if m.strip())
    duration = _number(ann, "duration-s", 1, 365 * 86400)
    w = Workload(
        id=key(pod), cpu_milli=cpu, memory_mib=mem,
        num_gpu=max(whole, 1 if milli is not None else 0), gpu_milli=int(milli or 1000),
        gpu_memory_mib=int(_number(ann, "gpu-memory-mib", 0, 1 << 22) or 0),
        models=models,
        min_gpu_memory_gib=_number(ann, "min-gpu-memory-gib", 0, 4096) or 0.0,
        min_memory_bandwidth_gbs=_number(ann, "min-memory-bandwidth-gbs", 0, 1e5) or 0.0,
        needs_tensor_cores=_flag(ann, "tensor-cores", False), needs_nvlink=interconnect == "nvlink",
        tenant=tenant, priority=priority, qos="LS" if qos == "latency-sensitive" else "BE",
        preemptible=_flag(ann, "preemptible", priority < PriorityLevel.HIGH),
        checkpointable=_flag(ann, "checkpoint", False),
        deferrable=_flag(ann, "deferrable", False), gang=f"{meta.get('namespace', '')}/{gang}" if gang else None,
        duration_s=duration, submit_s=submit_s,
        runtime=RuntimeEstimate.exact(duration, source="declared") if duration else None,
        labels={"sharing": "mps"} if sharing == "mps" else {},
    )
    return PodWorkload(w, gang_size)


def gpus_annotation(alloc: Allocation, uuids: Mapping[int, str]) -> str:
    return json.dumps([{"index": g, "uuid": uuids.get(g), "milli": m} for g, m in zip(alloc.gpus, alloc.milli,
                                                                                       strict=True)],
                      separators=(",", ":"))


def sharing_annotation(alloc: Allocation) -> str:
    return {"shared": "time-slicing", "mps": "mps", "mig": "mig"}.get(alloc.sharing, "exclusive")


def allocation_of(pod: Mapping[str, Any], node_index: int, w: Workload) -> Allocation:
    """The allocation a bound pod holds: from the GPUs annotated on it, else its first free GPUs (filled in later)."""
    ann = pod["metadata"].get("annotations") or {}
    raw = ann.get(ANN_GPUS)
    gpus: list[int] = []
    milli: list[int] = []
    if raw:
        try:
            entries = json.loads(raw)
            gpus = [int(e["index"]) for e in entries]
            milli = [int(e["milli"]) for e in entries]
        except (ValueError, KeyError, TypeError) as exc:
            raise PodSpecError(f"{ANN_GPUS}: {raw!r} is not the JSON gpuaware writes ({exc})") from None
    sharing = {"time-slicing": "shared", "mps": "mps", "mig": "mig"}.get(ann.get(ANN_SHARING, ""), "exclusive")
    return Allocation(w.id, node_index, gpus, milli, w.cpu_milli, w.memory_mib,
                      [w.gpu_memory_mib] * len(gpus), sharing)


def created_s(obj: dict[str, Any]) -> float:
    """An object's creationTimestamp in unix seconds (0 when it has none)."""
    ts = obj["metadata"].get("creationTimestamp")
    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
