"""Kubernetes annotation and label formats that more than one component reads or writes.

The scheduler writes a GPU cordon on the Node and the agent honours it; the scheduler writes a
pod's GPU assignment and the device plugin / MPS / MIG setup reads it. The whole pod contract is
in docs/scheduler.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "gpuaware.io/"
GPU_RESOURCE = "nvidia.com/gpu"
ANN_GPUS = PREFIX + "gpus"
ANN_SHARING = PREFIX + "sharing"
ANN_CORDONED = PREFIX + "cordoned-gpus"  # on a Node: comma list of GPU indices that take no new work
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
