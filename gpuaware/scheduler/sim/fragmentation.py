"""The FGD fragmentation experiment (Weng et al., ATC'23), on the same scheduling core.

Two protocols decide which pods arrive, one by one with no departures, until the requested GPU
total reaches 130% of the cluster's GPU capacity:

- ``sample`` (the default): pods sampled (seeded, with replacement) from the pod trace; the report
  gives the share of GPU capacity left unallocated just before the arrived load passes 80 ... 130%,
  the mean over seeds.
- ``artifact``: as the FGD artifact runs it (``pkg/simulator/core.go``: ``SortClusterPods`` with
  ``shufflePod`` then ``TunePodsByNodeTotalResource``): the whole trace shuffled, then random copies
  of trace pods appended while the next one's per-GPU milli still fits under 130% (``tuneUpPods``'s
  own test), or random pods dropped above it (``tuneDownPods``); the figure at x% arrived is the mean
  allocation of the arrivals whose arrived load rounds to x (``experiments/analysis/
  merge_alloc_discrete.py``; x±1 when none does), the median over seeds, as published.

After each arrival the allocated GPU capacity is recorded.

Allocated means the GPU compute the placed pods *requested*: a policy that rounds a fractional
request up to a whole GPU (``k8s-default``) blocks that GPU, but the rounding is waste, not
allocation, so it counts as unallocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.sim.openb import TracePod

LOAD_POINTS = (80, 90, 100, 110, 120, 130)
PROTOCOLS = ("sample", "artifact")
TARGET_LOAD = 1.3


@dataclass
class FragmentationRun:
    policy: str
    seed: int
    arrived_pct: list[float] = field(default_factory=list)
    allocated_pct: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failed: int = 0

    def unallocated_at(self, load: float) -> float:
        """Unallocated share of GPU capacity just before the arrived load passes ``load`` percent."""
        arrived = np.asarray(self.arrived_pct)
        i = max(0, int(np.searchsorted(arrived, load, side="right")) - 1)
        return 100.0 - self.allocated_pct[i]

    def unallocated_binned(self, load: int) -> float:
        """The artifact's figure: 100 minus the mean allocation of arrivals whose load rounds to ``load``."""
        arrived = np.round(np.asarray(self.arrived_pct))  # pandas round(x, 0): half to even, as numpy
        allocated = np.asarray(self.allocated_pct)
        at = arrived == load
        if not at.any():
            at = (arrived >= load - 1) & (arrived <= load + 1)
        return 100.0 - float(np.round(allocated[at].mean(), 2)) if at.any() else float("nan")


def _gpu_milli(w: Workload) -> int:
    return w.gpu_milli_total


def artifact_arrivals(pods: list[TracePod], capacity: int, seed: int) -> list[Workload]:
    """The artifact's arrival order: the whole trace shuffled, then tuned to 130% of ``capacity``."""
    rng = np.random.default_rng(seed)
    trace = [p.workload for p in pods]
    order = [trace[i] for i in rng.permutation(len(trace))]
    requested = sum(_gpu_milli(w) for w in order)
    target = TARGET_LOAD * capacity
    while requested > target and order:  # tuneDownPods
        requested -= _gpu_milli(order.pop(int(rng.integers(len(order)))))
    while True:  # tuneUpPods: its test reads the per-GPU milli (MilliGpu), not the pod's total
        w = trace[int(rng.integers(len(trace)))]
        if requested + (w.gpu_milli if w.num_gpu else 0) > target:
            break
        requested += _gpu_milli(w)
        order.append(w)
    return order


def _arrivals(pods: list[TracePod], capacity: int, seed: int, protocol: str):
    if protocol == "artifact":
        yield from artifact_arrivals(pods, capacity, seed)
        return
    rng = np.random.default_rng(seed)
    requested = 0
    while requested < TARGET_LOAD * capacity:
        w = pods[int(rng.integers(len(pods)))].workload
        requested += w.gpu_milli_total
        yield w


def run_fragmentation(nodes: list[NodeSpec], pods: list[TracePod], policy: str, seed: int,
                      progress: Callable[[float], None] | None = None,
                      make_profile: Callable[[str, WorkloadMix, int], Profile] = profile,
                      protocol: str = "sample") -> FragmentationRun:
    """``make_profile`` builds the named policy from the mix (the ablation bench passes its own)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    cluster = ClusterState(nodes)
    capacity = cluster.total_gpu_milli
    scheduler = Scheduler(make_profile(policy, WorkloadMix.of(p.workload for p in pods), seed), seed=seed)
    run = FragmentationRun(policy, seed)
    requested = 0
    placed = 0
    for i, pod in enumerate(_arrivals(pods, capacity, seed, protocol), start=1):
        w = Workload(f"{pod.id}-{i - 1}", pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli,
                     models=pod.models, qos=pod.qos)
        requested += w.gpu_milli_total
        decision = scheduler.schedule(cluster, w)
        run.latencies_s.append(decision.latency_s)
        if decision.allocation is None:
            run.failed += 1
        else:
            placed += w.gpu_milli_total
        run.arrived_pct.append(100.0 * requested / capacity)
        run.allocated_pct.append(100.0 * placed / capacity)
        if progress and i % 200 == 0:
            progress(requested / (TARGET_LOAD * capacity))
    return run


def summarize(runs: list[FragmentationRun], protocol: str = "sample") -> dict:
    lat = np.concatenate([np.asarray(r.latencies_s) for r in runs])
    if protocol == "artifact":
        at = {x: [r.unallocated_binned(x) for r in runs] for x in LOAD_POINTS}
        figures = {"protocol": "artifact",
                   "unallocated_pct": {str(x): round(float(np.median(v)), 2) for x, v in at.items()},
                   "unallocated_pct_iqr": {str(x): [round(float(q), 2) for q in np.percentile(v, [25, 75])]
                                           for x, v in at.items()}}
    else:
        at = {x: [r.unallocated_at(x) for r in runs] for x in LOAD_POINTS}
        figures = {"unallocated_pct": {str(x): round(float(np.mean(v)), 2) for x, v in at.items()}}
    figures["unallocated_pct_std"] = {str(x): round(float(np.std(v)), 2) for x, v in at.items()}
    return {
        "policy": runs[0].policy,
        "seeds": [r.seed for r in runs],
        **figures,
        "decisions": len(lat),
        "decisions_per_s": round(float(len(lat) / lat.sum()), 1),
        "p99_decision_ms": round(float(np.percentile(lat, 99) * 1000), 3),
        "failed_placements": int(sum(r.failed for r in runs)),
    }
