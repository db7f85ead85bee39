"""Kubernetes annotation and label formats that more than one component reads or writes.

The scheduler writes a GPU cordon on the Node and the agent honours it; the scheduler writes a
pod's GPU assignment and the device plugin / MPS / MIG setup reads it. The whole pod contract is
in docs/scheduler.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

PREFIX = "gpuaware.io/"
GPU_RESOURCE = "nvidia.com/gpu"
ANN_GPUS = PREFIX + "gpus"
ANN_SHARING = PREFIX + "sharing"
ANN_CORDONED = PREFIX + "cordoned-gpus"  # on a Node: comma list of GPU indices that take no new work
ANN_POWER_CAPS = PREFIX + "power-caps"  # on a Node: JSON {GPU index: watts}, the caps the scheduler has in force
# on a Node, written by that node's agent: the caps NVML accepted, {GPU index: watts} (the acknowledgement)
ANN_POWER_CAPS_APPLIED = PREFIX + "power-caps-applied"
# On a Node: JSON {GPU index: unix time of its last reset}, written by the tooling that reset the GPUs
# (answering GPUMaintenanceRequired: GPUResetRequired). NVML does not announce a reset done by another
# process; this tells the node's agent, which judges those GPUs afresh (docs/health.md).
ANN_GPU_RESETS = PREFIX + "gpu-resets"
# On a Node, written by that node's agent from the kubelet's PodResources view: JSON {GPU index: ["ns/name", ...]},
# the pods holding each GPU, whoever scheduled them. The scheduler's remediation chain moves them off a failing GPU
# before a reset is requested (docs/health.md).
ANN_GPU_PODS = PREFIX + "gpu-pods"
ANN_CHECKPOINT_REQUEST = PREFIX + "checkpoint-requested"  # on a Pod: the time (RFC 3339) a checkpoint was asked
ANN_CHECKPOINT_DONE = PREFIX + "checkpoint-done"  # on a Pod, written by the workload when its checkpoint is safe
LABEL_PRODUCT = "nvidia.com/gpu.product"  # GPU Operator's GPU feature discovery
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB


def cordoned_gpus(node: Mapping[str, Any]) -> set[int]:
    """The GPU indices a Node's cordon annotation names; anything that is not an index is ignored."""
    raw = ((node["metadata"].get("annotations") or {}).get(ANN_CORDONED) or "").strip()
    return {int(x) for x in raw.split(",") if x.strip().isdigit()}


def cordon_value(gpus: Iterable[int]) -> str:
    return ",".join(map(str, sorted(set(gpus))))


def power_caps(node: Mapping[str, Any], key: str = ANN_POWER_CAPS) -> dict[int, int]:
    """The power caps a Node's annotation records, {GPU index: watts}; anything malformed is ignored."""
    raw = (node["metadata"].get("annotations") or {}).get(key) or ""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    out = {}
    for k, v in parsed.items():
        if isinstance(k, str) and k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out[int(k)] = v
    return out


def power_caps_value(caps: Mapping[int, int]) -> str | None:
    """The annotation's value; None (the annotation removed) when no cap is in force."""
    return json.dumps({str(g): int(w) for g, w in sorted(caps.items())}, separators=(",", ":")) if caps else None


def _gpu_map(node: Mapping[str, Any], key: str, want: str) -> Iterator[tuple[int, Any]]:
    """(GPU index, value) of a Node annotation holding a JSON object keyed by GPU index; ValueError names what is
    wrong (``want`` says what the object should map to)."""
    raw = (node["metadata"].get("annotations") or {}).get(key) or ""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ValueError(f"annotation {key}: not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"annotation {key}: want an object {{GPU index: {want}}}, got {raw[:80]!r}")
    for k, v in parsed.items():
        if not (isinstance(k, str) and k.isdigit()):
            raise ValueError(f"annotation {key}: key {k!r} is not a GPU index")
        yield int(k), v


def gpu_resets(node: Mapping[str, Any]) -> dict[int, float]:
    """The GPU resets a Node's annotation records, {GPU index: unix time}; ValueError names what is wrong."""
    out = {}
    for g, v in _gpu_map(node, ANN_GPU_RESETS, "unix time"):
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ValueError(f"annotation {ANN_GPU_RESETS}: GPU {g}: {v!r} is not a unix time")
        out[g] = float(v)
    return out


def gpu_resets_value(resets: Mapping[int, float]) -> str:
    return json.dumps({str(g): round(t, 3) for g, t in sorted(resets.items())}, separators=(",", ":"))


def gpu_pods(node: Mapping[str, Any]) -> dict[int, set[str]]:
    """The pods a Node's annotation says hold each GPU, {GPU index: {"ns/name"}}; ValueError names what is wrong."""
    out: dict[int, set[str]] = {}
    for g, v in _gpu_map(node, ANN_GPU_PODS, "[namespace/name]"):
        if not isinstance(v, list) or not all(isinstance(p, str) and p.count("/") == 1 and "" not in p.split("/")
                                              for p in v):
            raise ValueError(f"annotation {ANN_GPU_PODS}: GPU {g}: {v!r} is not a list of namespace/name")
        out[g] = set(v)
    return out


def gpu_pods_value(pods: Mapping[int, Iterable[str]]) -> str | None:
    """The annotation's value, sorted so that an unchanged map writes nothing; None (removed) when no GPU is held."""
    held = {str(g): sorted(set(p)) for g, p in sorted(pods.items()) if p}
    return json.dumps(held, separators=(",", ":")) if held else None
