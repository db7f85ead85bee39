"""What the API says a pod or claim holds, charged to the core's model as far as the model has room.

The API is the truth; the model may be short of it (another scheduler over-committed a node, a race this
scheduler lost). Charging never takes a node's free CPU, memory or a GPU's free compute below zero.
"""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation, ClusterState


def clamp(cluster: ClusterState, alloc: Allocation) -> None:
    """CPU and memory as far as the node has them free."""
    n = alloc.node
    alloc.cpu_milli = min(alloc.cpu_milli, int(cluster.cpu_free[n]))
    alloc.memory_mib = min(alloc.memory_mib, int(cluster.mem_free[n]))


def clamp_gpus(cluster: ClusterState, alloc: Allocation) -> None:
    """Each GPU's compute as far as it has it free."""
    alloc.milli = [min(m, int(cluster.gpu_free[alloc.node, g])) for g, m in zip(alloc.gpus, alloc.milli, strict=True)]
