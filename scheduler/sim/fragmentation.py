"""The FGD fragmentation experiment (Weng et al., ATC'23), on the same scheduling core.

Pods are sampled (seeded, with replacement) from a pod trace and arrive one by one with no
departures until the requested GPU total reaches 130% of the cluster's GPU capacity. After each
arrival the allocated GPU capacity is recorded; the report gives the share of GPU capacity left
unallocated as the arrived load passes 80 ... 130%.

Allocated means the GPU compute the placed pods *requested*: a policy that rounds a fractional
request up to a whole GPU (``k8s-default``) blocks that GPU, but the rounding is waste, not
allocation, so it counts as unallocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.cluster import ClusterState, NodeSpec
from scheduler.core.framework import Profile, Scheduler
from scheduler.core.policies import profile
from scheduler.core.workload import Workload
from scheduler.core.workload_mix import WorkloadMix
from scheduler.sim.openb import TracePod

LOAD_POINTS = (80, 90, 100, 110, 120, 130)


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


def run_fragmentation(nodes: list[NodeSpec], pods: list[TracePod], policy: str, seed: int,
                      progress: Callable[[float], None] | None = None,
                      make_profile: Callable[[str, WorkloadMix, int], Profile] = profile) -> FragmentationRun:
    """``make_profile`` builds the named policy from the mix (the ablation bench passes its own)."""
    cluster = ClusterState(nodes)
    capacity = cluster.total_gpu_milli
    scheduler = Scheduler(make_profile(policy, WorkloadMix.of(p.workload for p in pods), seed), seed=seed)
    rng = np.random.default_rng(seed)
    run = FragmentationRun(policy, seed)
    requested = 0
    placed = 0
    i = 0
    while requested < 1.3 * capacity:
        pod = pods[int(rng.integers(len(pods)))].workload
        w = Workload(f"{pod.id}-{i}", pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli,
                     models=pod.models, qos=pod.qos)
        i += 1
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
            progress(requested / (1.3 * capacity))
    return run


def summarize(runs: list[FragmentationRun]) -> dict:
    lat = np.concatenate([np.asarray(r.latencies_s) for r in runs])
    return {
        "policy": runs[0].policy,
        "seeds": [r.seed for r in runs],
        "unallocated_pct": {str(x): round(float(np.mean([r.unallocated_at(x) for r in runs])), 2) for x in LOAD_POINTS},
        "unallocated_pct_std": {str(x): round(float(np.std([r.unallocated_at(x) for r in runs])), 2)
                                for x in LOAD_POINTS},
        "decisions": len(lat),
        "decisions_per_s": round(float(len(lat) / lat.sum()), 1),
        "p99_decision_ms": round(float(np.percentile(lat, 99) * 1000), 3),
        "failed_placements": int(sum(r.failed for r in runs)),
    }
