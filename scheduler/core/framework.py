"""A scheduling cycle in the shape of the kube-scheduler framework, vectorized over GPUs.

    PreFilter -> Filter (node masks, GPU masks) -> candidates -> Score (weighted, normalized)
    -> select -> Reserve (the allocation) -> Bind (the caller's: simulator or Kubernetes)

Plugins are small objects, one per file in ``plugins/``, each implementing some of:
``filter_nodes(ctx) -> bool[N]``, ``filter_gpus(ctx) -> bool[N, G]``, ``score(ctx, cand) -> float[C]``.
Candidates are (node, gpu) pairs for workloads on one GPU, or (node, -1) for CPU-only and
multi-GPU workloads (whose GPUs the framework picks, one NVLink island first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from scheduler.core.cluster import Allocation, ClusterState, mig_round
from scheduler.core.workload import Workload


@dataclass
class Candidates:
    node: np.ndarray
    gpu: np.ndarray  # -1: CPU-only, or several whole GPUs picked at reserve time

    def __len__(self) -> int:
        return len(self.node)


@dataclass
class CycleContext:
    cluster: ClusterState
    workload: Workload
    cache: dict = field(default_factory=dict)


class Plugin(Protocol):
    name: str


@dataclass
class Decision:
    workload: Workload
    allocation: Allocation | None
    reasons: list[str]
    score: float | None = None
    latency_s: float = 0.0


@dataclass
class Profile:
    """A named set of plugins with score weights (kube-scheduler's profile)."""

    name: str
    filters: list[Plugin]
    scores: list[tuple[Plugin, float]]
    whole_gpus_only: bool = False  # round fractional requests up (kube's device plugin without sharing)


def gpu_fit(ctx: CycleContext) -> np.ndarray:
    c, w = ctx.cluster, ctx.workload
    milli = 1000 if w.num_gpu > 1 else w.gpu_milli
    need = np.where(c.mig, mig_round(milli), milli) if c.has_mig else milli
    ok = c.gpu_exists & (c.gpu_free >= need)
    if w.gpu_memory_mib:
        ok &= (c.gpu_mem_cap == 0) | (c.gpu_mem_free >= w.gpu_memory_mib)
    return ok


class Scheduler:
    def __init__(self, profile: Profile, seed: int = 0):
        self.profile = profile
        self.rng = np.random.default_rng(seed)

    def effective(self, w: Workload) -> Workload:
        if self.profile.whole_gpus_only and w.shares_gpu:
            return Workload(**{**w.__dict__, "gpu_milli": 1000})
        return w

    def candidates(self, ctx: CycleContext, node_mask: np.ndarray | None = None) -> tuple[Candidates, list[str]]:
        c, w = ctx.cluster, ctx.workload
        reasons: list[str] = []
        node_ok = (c.cpu_free >= w.cpu_milli) & (c.mem_free >= w.memory_mib)
        if node_mask is not None:
            if (node_ok & ~node_mask).any():
                reasons.append(f"{int((node_ok & ~node_mask).sum())} reserved for higher-priority work")
            node_ok &= node_mask
        if (~node_ok).any():
            reasons.append(f"{int((~node_ok).sum())} insufficient cpu/memory")
        gpu_ok = gpu_fit(ctx) if w.num_gpu else None
        for p in self.profile.filters:
            if hasattr(p, "filter_nodes"):
                m = p.filter_nodes(ctx)
                if (node_ok & ~m).any():
                    reasons.append(f"{int((node_ok & ~m).sum())} {p.name}")
                node_ok &= m
            if gpu_ok is not None and hasattr(p, "filter_gpus"):
                m = p.filter_gpus(ctx)
                dropped = gpu_ok & ~m
                if dropped.any():
                    reasons.append(f"{int(dropped.sum())} GPUs excluded by {p.name}")
                gpu_ok &= m
        ctx.cache["gpu_ok"] = gpu_ok
        if w.num_gpu == 0:
            nodes = np.flatnonzero(node_ok)
            return Candidates(nodes, np.full(len(nodes), -1)), reasons
        gpu_ok = gpu_ok & node_ok[:, None]
        if w.num_gpu == 1:
            n, g = np.nonzero(gpu_ok)
            if len(n) == 0 and node_ok.any():
                reasons.append("no GPU with enough free compute/memory")
            return Candidates(n, g), reasons
        enough = gpu_ok.sum(axis=1) >= w.num_gpu
        if node_ok.any() and not (enough & node_ok).any():
            reasons.append(f"no node with {w.num_gpu} free GPUs")
        nodes = np.flatnonzero(enough)
        return Candidates(nodes, np.full(len(nodes), -1)), reasons

    def pick_gpus(self, ctx: CycleContext, node: int) -> list[int]:
        """k whole GPUs on one node, from one NVLink island when one has enough."""
        w, c = ctx.workload, ctx.cluster
        free = np.flatnonzero(ctx.cache["gpu_ok"][node])
        groups = c.nvlink[node, free]
        best: list[int] | None = None
        for gid in np.unique(groups):
            members = free[groups == gid]
            if len(members) >= w.num_gpu and (best is None or len(members) < len(best)):
                best = members.tolist()  # the smallest island that fits keeps bigger ones whole
        return (best or free.tolist())[: w.num_gpu]

    def total_score(self, ctx: CycleContext, cand: Candidates) -> tuple[np.ndarray, list[str]]:
        """Weighted sum of every score plugin, each normalised to 0-100 over the candidates."""
        total = np.zeros(len(cand))
        parts = []
        for plugin, weight in self.profile.scores:
            s = np.asarray(plugin.score(ctx, cand), dtype=np.float64)
            lo, hi = s.min(), s.max()
            norm = (s - lo) / (hi - lo) * 100 if hi > lo else np.zeros_like(s)
            total += weight * norm
            parts.append(plugin.name)
        return total, parts

    def rank(self, cluster: ClusterState, workload: Workload,
             node_mask: np.ndarray | None = None) -> tuple[np.ndarray, list[str]]:
        """Every node's best score for ``workload`` (-inf where it cannot go) and why nodes failed.

        Nothing is reserved: this is the question kube-scheduler's extender asks (filter, prioritize).
        """
        w = self.effective(workload)
        ctx = CycleContext(cluster, w)
        cand, reasons = self.candidates(ctx, node_mask)
        best = np.full(len(cluster), -np.inf)
        if len(cand):
            total, _ = self.total_score(ctx, cand)
            np.maximum.at(best, cand.node, total)
        return best, reasons

    def schedule(self, cluster: ClusterState, workload: Workload, node_mask: np.ndarray | None = None) -> Decision:
        """One scheduling cycle; ``node_mask`` (False = off limits) carries reservations."""
        started = time.perf_counter()
        w = self.effective(workload)
        ctx = CycleContext(cluster, w)
        cand, reasons = self.candidates(ctx, node_mask)
        if len(cand) == 0:
            why = f"0/{len(cluster)} nodes available: " + (", ".join(reasons) or "no feasible node")
            return Decision(workload, None, [why], latency_s=time.perf_counter() - started)
        total, parts = self.total_score(ctx, cand)
        best = np.flatnonzero(total >= total.max() - 1e-9)
        i = int(best[0]) if len(best) == 1 else int(self.rng.choice(best))
        node, gpu = int(cand.node[i]), int(cand.gpu[i])
        if w.num_gpu == 0:
            gpus, milli = [], []
        elif w.num_gpu == 1:
            on_mig = bool(cluster.mig[node, gpu])
            gpus, milli = [gpu], [mig_round(w.gpu_milli) if on_mig else w.gpu_milli]
        else:
            gpus = self.pick_gpus(ctx, node)
            milli = [1000] * len(gpus)
        if w.num_gpu == 1 and cluster.mig[node, gpus[0]]:
            sharing = "mig"
        elif w.shares_gpu:
            sharing = "mps" if w.labels.get("sharing") == "mps" else "shared"  # shared = time-slicing
        else:
            sharing = "exclusive"
        alloc = Allocation(workload.id, node, gpus, milli, w.cpu_milli, w.memory_mib,
                           [w.gpu_memory_mib] * len(gpus), sharing)
        cluster.allocate(alloc)
        why = [f"{cluster.names[node]} gpus={gpus} by {'+'.join(parts) or 'first fit'}",
               f"{len(cand)} candidates"]
        return Decision(workload, alloc, why, float(total[i]), time.perf_counter() - started)
