"""Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

A node's fragmentation for a task type m is the free GPU compute that m could not use there: all
of it when m does not fit the node at all (CPU, memory, or not enough GPU), otherwise the free
share of GPUs too small for m (for m on a fraction of a GPU) or of GPUs not wholly free (for m on
whole GPUs). The expected fragmentation weighs that by the popularity of each type in the
workload. FGD places a task where the expected fragmentation grows least.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.framework import Candidates, CycleContext


@dataclass
class TaskTypes:
    """The target workload as a distribution over task shapes."""

    cpu: np.ndarray  # (T,)
    mem: np.ndarray
    num_gpu: np.ndarray
    milli: np.ndarray
    p: np.ndarray

    @classmethod
    def from_counts(cls, counts: dict[tuple[int, int, int, int], float], top: int | None = 64) -> TaskTypes:
        """Keys are (cpu, mem, num_gpu, milli); the ``top`` most common are kept."""
        items = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        arr = np.array([k[:4] for k, _ in items], dtype=np.int64).reshape(-1, 4)
        p = np.array([v for _, v in items], dtype=np.float64)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], p / p.sum())


def fragmentation(free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, types: TaskTypes) -> np.ndarray:
    """(R, T) fragmentation of R node states (free: (R, G) milli) for every task type."""
    total = free.sum(axis=1)[:, None].astype(np.float64)  # (R, 1)
    fits = (cpu[:, None] >= types.cpu[None, :]) & (mem[:, None] >= types.mem[None, :])
    out = np.broadcast_to(total, fits.shape).copy()
    share = (types.num_gpu == 1) & (types.milli < 1000)
    if share.any():
        # Types that differ only in CPU or memory share a GPU threshold: compute each once.
        d, inverse = np.unique(types.milli[share], return_inverse=True)
        usable = free[:, :, None] >= d[None, None, :]  # (R, G, D)
        frag = (free[:, :, None] * ~usable).sum(axis=1)[:, inverse]  # (R, S)
        any_usable = usable.any(axis=1)[:, inverse]
        out[:, share] = np.where(fits[:, share] & any_usable, frag, total)
    whole = types.num_gpu >= 1
    whole &= ~share
    if whole.any():
        full = (free == 1000).sum(axis=1)[:, None]
        partial = np.where(free < 1000, free, 0).sum(axis=1)[:, None].astype(np.float64)
        ok = fits[:, whole] & (full >= types.num_gpu[whole][None, :])
        out[:, whole] = np.where(ok, partial, total)
    cpu_only = types.num_gpu == 0
    if cpu_only.any():
        out[:, cpu_only] = np.where(fits[:, cpu_only], 0.0, total)
    return out


class FragmentationGradient:
    name = "fgd"

    def __init__(self, types: TaskTypes):
        self.types = types
        self._cluster_id: int | None = None
        self._versions: np.ndarray | None = None
        self._node_frag: np.ndarray | None = None

    def node_fragmentation(self, c) -> np.ndarray:
        """Expected fragmentation of every node now, recomputed only where a node changed."""
        if self._cluster_id != id(c) or self._versions is None or len(self._versions) != len(c):
            self._cluster_id = id(c)
            self._versions = c.version.copy()
            self._node_frag = fragmentation(c.gpu_free, c.cpu_free, c.mem_free, self.types) @ self.types.p
            return self._node_frag
        changed = np.flatnonzero(c.version != self._versions)
        if len(changed):
            self._node_frag[changed] = fragmentation(c.gpu_free[changed], c.cpu_free[changed], c.mem_free[changed],
                                                     self.types) @ self.types.p
            self._versions[changed] = c.version[changed]
        return self._node_frag

    def delta(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        """Expected fragmentation after minus before, per candidate (milli-GPU)."""
        c, w = ctx.cluster, ctx.workload
        before = self.node_fragmentation(c)[cand.node]
        if w.num_gpu == 1:
            # GPUs of one node with the same free share give the same after-state: score each once.
            keys = cand.node * 2048 + c.gpu_free[cand.node, cand.gpu]
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            n, g = cand.node[first], cand.gpu[first]
            free = c.gpu_free[n].copy()
            free[np.arange(len(n)), g] -= w.gpu_milli
        else:
            inverse = None
            n = cand.node
            free = c.gpu_free[n].copy()
            if w.num_gpu > 1:
                # Whole GPUs are interchangeable for fragmentation: take the first k fully free.
                ok = ctx.cache["gpu_ok"][n]
                take = np.cumsum(ok, axis=1) <= w.num_gpu
                free -= np.where(ok & take, 1000, 0)
        after = fragmentation(free, c.cpu_free[n] - w.cpu_milli, c.mem_free[n] - w.memory_mib,
                              self.types) @ self.types.p
        if inverse is not None:
            after = after[inverse.ravel()]
        return after - before

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        return -self.delta(ctx, cand)
