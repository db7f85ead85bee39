"""Consolidation: move fractional workloads so whole GPUs come free (the rebalancer's migrations).

A move is proposed when a GPU's only shared workloads can all move onto other, already shared
GPUs (best fit: the least free share that still fits) on nodes with the CPU and memory for them,
so the move frees a whole GPU without breaking another one. Pure: it returns moves; the caller
checkpoints, migrates and records them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState


@dataclass
class Move:
    workload_id: str
    from_node: int
    from_gpu: int
    to_node: int
    to_gpu: int
    reason: str = "consolidate: frees a whole GPU"


def consolidation_moves(cluster: ClusterState, max_moves: int = 16, movable: set[str] | None = None) -> list[Move]:
    residents: dict[tuple[int, int], list[str]] = {}
    for a in cluster.allocations.values():
        if a.sharing == "shared" and len(a.gpus) == 1:
            residents.setdefault((a.node, a.gpus[0]), []).append(a.workload_id)
    free = cluster.gpu_free.copy()
    cpu, mem = cluster.cpu_free.copy(), cluster.mem_free.copy()
    usable = cluster.gpu_exists & (cluster.band == 0)
    moves: list[Move] = []
    # Emptiest shared GPUs first: they are the cheapest to vacate.
    for (n, g), ids in sorted(residents.items(), key=lambda kv: -free[kv[0]]):
        if len(moves) + len(ids) > max_moves:
            break
        if movable is not None and not set(ids) <= movable:
            continue
        plan: list[Move] = []
        trial_free, trial_cpu, trial_mem = free.copy(), cpu.copy(), mem.copy()
        for wid in sorted(ids, key=lambda i: -cluster.allocations[i].milli[0]):
            a = cluster.allocations[wid]
            need = a.milli[0]
            shared = usable & (trial_free >= need) & (trial_free < 1000)
            shared[n, g] = False
            shared &= (trial_cpu >= a.cpu_milli)[:, None] & (trial_mem >= a.memory_mib)[:, None]
            if not shared.any():
                plan = []
                break
            slack = np.where(shared, trial_free - need, 10**9)
            tn, tg = np.unravel_index(int(np.argmin(slack)), slack.shape)
            trial_free[tn, tg] -= need
            trial_free[n, g] += need
            if tn != n:
                trial_cpu[tn] -= a.cpu_milli
                trial_mem[tn] -= a.memory_mib
                trial_cpu[n] += a.cpu_milli
                trial_mem[n] += a.memory_mib
            plan.append(Move(wid, n, g, int(tn), int(tg)))
        if plan and trial_free[n, g] == cluster.gpu_cap[n, g]:
            moves.extend(plan)
            free, cpu, mem = trial_free, trial_cpu, trial_mem
    return moves
