"""The named policies the simulator compares, all on the same framework."""

from __future__ import annotations

from scheduler.core.framework import Profile
from scheduler.core.plugins.bestfit import BestFit
from scheduler.core.plugins.capabilities import Capabilities
from scheduler.core.plugins.clustering import Clustering
from scheduler.core.plugins.dotprod import DotProduct
from scheduler.core.plugins.fgd import FragmentationGradient, TaskTypes
from scheduler.core.plugins.health import HealthFilter
from scheduler.core.plugins.heterogeneity import HeterogeneityAffinity
from scheduler.core.plugins.least_allocated import LeastAllocated
from scheduler.core.plugins.model_affinity import ModelAffinity
from scheduler.core.plugins.packing import GpuPacking
from scheduler.core.plugins.random_score import RandomScore
from scheduler.core.throughput import ThroughputTable

POLICIES = ("random", "k8s-default", "bestfit", "dotprod", "packing", "clustering", "fgd", "gpuaware")


def profile(name: str, types: TaskTypes, seed: int = 0, model_types: TaskTypes | None = None,
            throughput: ThroughputTable | None = None) -> Profile:
    """``types``: the workload's 64 most common shapes (what FGD uses); ``model_types``: the same with
    each shape's allowed GPU models, which ``gpuaware`` uses so type-constrained demand counts only on
    the nodes it may use. With a ``throughput`` table ``gpuaware`` also weighs each workload's speed
    on each GPU model (workloads without a ``gavel_class`` label score the same everywhere)."""
    filters = [ModelAffinity(), Capabilities(), HealthFilter()]
    if name == "random":
        return Profile(name, filters, [(RandomScore(seed), 1.0)])
    if name == "k8s-default":
        return Profile(name, filters, [(LeastAllocated(), 1.0)], whole_gpus_only=True)
    if name == "bestfit":
        return Profile(name, filters, [(BestFit(), 1.0)])
    if name == "dotprod":
        return Profile(name, filters, [(DotProduct(), 1.0)])
    if name == "packing":
        return Profile(name, filters, [(GpuPacking(), 1.0)])
    if name == "clustering":
        return Profile(name, filters, [(Clustering(), 1.0)])
    if name == "fgd":
        return Profile(name, filters, [(FragmentationGradient(types), 1.0)])
    if name == "gpuaware":
        # FGD decides; best fit only breaks its (near-)ties, which FGD leaves to chance: measured to leave
        # fewer GPUs unallocated than FGD alone (docs/scheduling.md).
        scores = [(FragmentationGradient(model_types or types), 1.0), (BestFit(), 0.01)]
        if throughput is not None:
            scores.append((HeterogeneityAffinity(throughput), 0.3))
        return Profile(name, filters, scores)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
