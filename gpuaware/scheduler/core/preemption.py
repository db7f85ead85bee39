"""Victim selection: free enough capacity on one node at the least cost.

Cost of evicting a running workload = a priority term (never evict equal or higher priority),
the work lost since its last checkpoint (all of it when it cannot checkpoint), a restart
overhead, and, when its runtime is estimated, how close it is to its end (work predicted to end
within ``NEAR_END_S`` frees its room soon anyway: evicting it throws away work for little).
Borrowed work (its tenant over quota) is cheaper to reclaim.

Both searches only read the cluster (the pass hands them its read-only snapshot): a victim's
removal is simulated on scratch copies of one node's free GPU compute, CPU and memory, and only
the caller's ``evict`` releases what is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation, ClusterSnapshot, ClusterState
from gpuaware.scheduler.core.workload import Workload

RESTART_OVERHEAD_S = 120.0
PRIORITY_COST_S = 1e6
NEAR_END_S = 1800.0


@dataclass
class Running:
    workload: Workload
    allocation: Allocation
    started_s: float
    done_s: float  # work already banked (checkpointed) before this start
    checkpoint_every_s: float | None  # None: cannot checkpoint
    borrowed: bool = False
    ran_s: float = 0.0  # wall seconds run before this start whose work was kept (what runtimes are measured in)

    def lost_if_evicted(self, now: float) -> float:
        ran = max(0.0, now - self.started_s)
        if self.checkpoint_every_s is None:
            return self.done_s + ran
        return ran % self.checkpoint_every_s

    def elapsed(self, now: float) -> float:
        """Wall seconds it has run, kept from before this start and since: what its runtime estimate is of."""
        return self.ran_s + max(0.0, now - self.started_s)

    def eviction_cost(self, now: float) -> float:
        """Seconds an eviction throws away: the work lost, and the room it would free soon anyway."""
        near_end = 0.0
        if self.workload.runtime is not None:
            near_end = max(0.0, NEAR_END_S - self.workload.runtime.remaining(self.elapsed(now)))
        return self.lost_if_evicted(now) + near_end


def fits_on_node(free: np.ndarray, cpu_free: int, mem_free: int, w: Workload) -> bool:
    if cpu_free < w.cpu_milli or mem_free < w.memory_mib:
        return False
    if w.num_gpu == 0:
        return True
    if w.num_gpu == 1:
        return bool((free >= w.gpu_milli).any())
    return int((free >= 1000).sum()) >= w.num_gpu


def select_victims(cluster: ClusterSnapshot | ClusterState, w: Workload, running: dict[str, Running], now: float,
                   allowed_nodes: np.ndarray | None = None, max_nodes: int = 32,
                   reclaimable: Callable[[Running], bool] | None = None) -> tuple[int, list[Running]] | None:
    """The node and the cheapest victims that make ``w`` fit there, or None.

    Victims are preemptible workloads of lower priority, plus those ``reclaimable`` says run on
    capacity their tenant borrowed and ``w``'s tenant is owed.
    """
    by_node: dict[int, list[Running]] = {}
    for r in running.values():
        lower = r.workload.priority < w.priority and r.workload.preemptible
        if lower or (reclaimable is not None and r.workload.preemptible and reclaimable(r)):
            by_node.setdefault(r.allocation.node, []).append(r)
    best: tuple[float, int, list[Running]] | None = None
    # Most reclaimable GPU first: those nodes are likeliest to fit with the fewest victims.
    order = sorted(by_node, key=lambda n: -sum(sum(r.allocation.milli) for r in by_node[n]))
    for n in order[:max_nodes]:
        if allowed_nodes is not None and not allowed_nodes[n]:
            continue
        free = cluster.gpu_free[n].copy()
        free[~cluster.gpu_exists[n] | (cluster.band[n] >= 2)] = -1
        cpu, mem = int(cluster.cpu_free[n]), int(cluster.mem_free[n])
        chosen, cost = [], 0.0
        victims = sorted(by_node[n], key=lambda r: (not r.borrowed, r.workload.priority, r.eviction_cost(now)))
        for r in victims:
            if fits_on_node(free, cpu, mem, w):
                break
            chosen.append(r)
            cost += (PRIORITY_COST_S * (r.workload.priority + 1) * (0.5 if r.borrowed else 1.0)
                     + r.eviction_cost(now) + RESTART_OVERHEAD_S)
            for g, m in zip(r.allocation.gpus, r.allocation.milli, strict=True):
                free[g] += m
            cpu += r.allocation.cpu_milli
            mem += r.allocation.memory_mib
        if chosen and fits_on_node(free, cpu, mem, w) and (best is None or cost < best[0]):
            best = (cost, n, chosen)
    return None if best is None else (best[1], best[2])


def earliest_fit(cluster: ClusterSnapshot | ClusterState, w: Workload, running: dict[str, Running],
                 finish_at: Mapping[str, float], now: float) -> tuple[int, float] | None:
    """The node where ``w`` would fit soonest as running work ends (expected finish times), and when.

    The reservation that backfill respects: later work may use that node only if it ends before then.
    """
    by_node: dict[int, list[Running]] = {}
    for r in running.values():
        by_node.setdefault(r.allocation.node, []).append(r)
    best: tuple[int, float] | None = None
    for n, rs in by_node.items():
        if w.models and str(cluster.models[n]) not in w.models:
            continue
        free = cluster.gpu_free[n].copy()
        free[~cluster.gpu_exists[n] | (cluster.band[n] >= 2)] = -1
        cpu, mem = int(cluster.cpu_free[n]), int(cluster.mem_free[n])
        for r in sorted(rs, key=lambda r: finish_at.get(r.workload.id, now)):
            for g, m in zip(r.allocation.gpus, r.allocation.milli, strict=True):
                if free[g] >= 0:
                    free[g] += m
            cpu += r.allocation.cpu_milli
            mem += r.allocation.memory_mib
            if fits_on_node(free, cpu, mem, w):
                t = finish_at.get(r.workload.id, now)
                if t < math.inf and (best is None or t < best[1]):  # an unknown end frees nothing we can wait for
                    best = (n, t)
                break
    return best
