"""The named policies the simulator compares, all on the same framework."""

from __future__ import annotations

from scheduler.core.framework import Profile
from scheduler.core.plugins.bestfit import BestFit
from scheduler.core.plugins.capabilities import Capabilities
from scheduler.core.plugins.clustering import Clustering
from scheduler.core.plugins.cpu_for_gpus import CpuForGpus
from scheduler.core.plugins.dotprod import DotProduct
from scheduler.core.plugins.fgd import FragmentationGradient
from scheduler.core.plugins.health import HealthFilter
from scheduler.core.plugins.heterogeneity import HeterogeneityAffinity
from scheduler.core.plugins.least_allocated import LeastAllocated
from scheduler.core.plugins.model_affinity import ModelAffinity
from scheduler.core.plugins.model_reservation import ModelReservation
from scheduler.core.plugins.packing import GpuPacking
from scheduler.core.plugins.random_score import RandomScore
from scheduler.core.throughput import ThroughputTable
from scheduler.core.workload_mix import WorkloadMix

POLICIES = ("random", "k8s-default", "bestfit", "dotprod", "packing", "clustering", "fgd", "gpuaware")


def profile(name: str, mix: WorkloadMix, seed: int = 0, throughput: ThroughputTable | None = None) -> Profile:
    """``mix``: the pod shapes expected to keep arriving; FGD reads its 64 most common shapes, as the FGD
    artifact keeps only typical pods, and ``gpuaware`` also the CPU per GPU and the demand only some GPU
    models may serve. With a ``throughput`` table ``gpuaware`` also weighs each workload's speed on each
    GPU model (workloads without a ``gavel_class`` label score the same everywhere)."""
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
        return Profile(name, filters, [(FragmentationGradient(mix.task_types(top=64)), 1.0)])
    if name == "gpuaware":
        # FGD, and at the same weight two things FGD does not see: the CPU a node's free GPUs will need and a
        # GPU model's share of the demand only it can serve. Measured on the openb traces, part by part
        # (docs/scheduling.md, bench/gpuaware_ablation.py).
        scores = [(FragmentationGradient(mix.task_types(top=64)), 1.0),
                  (CpuForGpus(mix.cpu_per_gpu()), 1.0),
                  (ModelReservation(mix.model_demand()), 1.0)]
        if throughput is not None:
            scores.append((HeterogeneityAffinity(throughput), 0.3))
        return Profile(name, filters, scores)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
