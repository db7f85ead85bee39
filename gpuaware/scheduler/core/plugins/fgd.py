"""Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

A node's fragmentation for a task type m is the free GPU compute that m could not use there: all
of it when m does not fit the node at all (CPU, memory, or not enough GPU), otherwise the free
share of GPUs too small for m (for m on a fraction of a GPU) or of GPUs not wholly free (for m on
whole GPUs). The expected fragmentation weighs that by the popularity of each type in the
workload. FGD places a task where the expected fragmentation grows least.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.core.framework import Candidates, CycleContext


@dataclass
class TaskTypes:
    """The target workload as a distribution over task shapes."""

    cpu: np.ndarray  # (T,)
    mem: np.ndarray
    num_gpu: np.ndarray
    milli: np.ndarray
    p: np.ndarray

    def __post_init__(self) -> None:
        self.share = (self.num_gpu == 1) & (self.milli < 1000)
        self.whole = (self.num_gpu >= 1) & ~self.share
        self.cpu_only = self.num_gpu == 0
        # Types that differ only in CPU or memory share a GPU threshold: the GPU side is computed once each.
        self.thresholds, self.threshold_of = np.unique(self.milli[self.share], return_inverse=True)

    @classmethod
    def from_counts(cls, counts: dict[tuple[int, int, int, int], float], top: int | None = 64) -> TaskTypes:
        """Keys are (cpu, mem, num_gpu, milli); the ``top`` most common are kept."""
        items = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        arr = np.array([k[:4] for k, _ in items], dtype=np.int64).reshape(-1, 4)
        p = np.array([v for _, v in items], dtype=np.float64)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], p / p.sum())


@dataclass
class GpuFigures:
    """What fragmentation needs to know of R nodes' GPUs, per node (D: the types' share thresholds)."""

    total: np.ndarray  # (R,) free milli
    below: np.ndarray  # (R, D) free milli on GPUs with less free than the threshold
    usable: np.ndarray  # (R, D) GPUs with at least the threshold free
    full: np.ndarray  # (R,) wholly free GPUs
    partial: np.ndarray  # (R,) free milli on GPUs not wholly free

    @classmethod
    def of(cls, free: np.ndarray, thresholds: np.ndarray) -> GpuFigures:
        at_least = free[:, :, None] >= thresholds[None, None, :]  # (R, G, D)
        return cls(free.sum(axis=1).astype(np.float64), (free[:, :, None] * ~at_least).sum(axis=1).astype(np.float64),
                   at_least.sum(axis=1), (free == 1000).sum(axis=1),
                   np.where(free < 1000, free, 0).sum(axis=1).astype(np.float64))

    def rows(self, index: np.ndarray) -> GpuFigures:
        return GpuFigures(self.total[index], self.below[index], self.usable[index], self.full[index],
                          self.partial[index])

    def set_rows(self, index: np.ndarray, new: GpuFigures) -> None:
        for name in ("total", "below", "usable", "full", "partial"):
            getattr(self, name)[index] = getattr(new, name)

    def after_taking(self, was: np.ndarray, take: int, thresholds: np.ndarray) -> GpuFigures:
        """The same nodes after ``take`` milli (> 0) left one GPU per node that had ``was`` free."""
        now = was - take
        was_c, now_c, d = was[:, None], now[:, None], thresholds[None, :]
        return GpuFigures(self.total - take,
                          self.below - np.where(was_c < d, was_c, 0) + np.where(now_c < d, now_c, 0),
                          self.usable - (was_c >= d) + (now_c >= d),
                          self.full - (was == 1000),
                          self.partial - np.where(was < 1000, was, 0) + now)


def fragmentation_of(gpus: GpuFigures, cpu: np.ndarray, mem: np.ndarray, types: TaskTypes) -> np.ndarray:
    """(R, T) fragmentation of R node states for every task type."""
    total = gpus.total[:, None]
    fits = (cpu[:, None] >= types.cpu[None, :]) & (mem[:, None] >= types.mem[None, :])
    out = np.broadcast_to(total, fits.shape).copy()
    if types.share.any():
        frag = gpus.below[:, types.threshold_of]
        any_usable = gpus.usable[:, types.threshold_of] > 0
        out[:, types.share] = np.where(fits[:, types.share] & any_usable, frag, total)
    if types.whole.any():
        ok = fits[:, types.whole] & (gpus.full[:, None] >= types.num_gpu[types.whole][None, :])
        out[:, types.whole] = np.where(ok, gpus.partial[:, None], total)
    if types.cpu_only.any():
        out[:, types.cpu_only] = np.where(fits[:, types.cpu_only], 0.0, total)
    return out


class NodeFigures:
    """Every node's GPU figures and fragmentation, kept across cycles and recomputed only for the nodes whose
    version changed (a whole recomputation for a new cluster or one of another size).

    ``fragment(c, figures, rows)`` is the plugin's fragmentation of the nodes ``rows`` (node indices, or
    ``slice(None)`` for all) with those figures; ``on_new_cluster(c)`` refreshes what the plugin derives
    from the cluster's static facts (the artifact's model access) before the first ``fragment``.
    """

    def __init__(self, thresholds: np.ndarray,
                 fragment: Callable[[ClusterState, GpuFigures, np.ndarray | slice], np.ndarray],
                 on_new_cluster: Callable[[ClusterState], None] | None = None):
        self.thresholds = thresholds
        self.fragment = fragment
        self.on_new_cluster = on_new_cluster
        self._cluster_id: int | None = None
        self._versions: np.ndarray | None = None
        self.gpus: GpuFigures | None = None
        self.frag: np.ndarray | None = None
        # Per node, an id shared by the nodes in the same state as far as fragmentation can tell (free CPU,
        # memory, and the free compute of its GPUs as a multiset): FGD scores each such state once per cycle.
        self.state_id = np.zeros(0, dtype=np.int64)
        self._ids: dict[bytes, int] = {}

    def node_fragmentation(self, c) -> np.ndarray:
        if self._cluster_id != id(c) or self._versions is None or len(self._versions) != len(c):
            self._cluster_id = id(c)
            self._versions = c.version.copy()
            if self.on_new_cluster is not None:
                self.on_new_cluster(c)
            self.gpus = GpuFigures.of(c.gpu_free, self.thresholds)
            self.frag = self.fragment(c, self.gpus, slice(None))
            self._ids = {}
            self.state_id = self._state_ids(c, np.arange(len(c)))
            return self.frag
        changed = np.flatnonzero(c.version != self._versions)
        if len(changed):
            figures = GpuFigures.of(c.gpu_free[changed], self.thresholds)
            self.gpus.set_rows(changed, figures)
            self.frag[changed] = self.fragment(c, figures, changed)
            self._versions[changed] = c.version[changed]
            if len(self._ids) > 4 * len(c) + 64:  # states long gone: number the current ones afresh
                self._ids = {}
                self.state_id = self._state_ids(c, np.arange(len(c)))
            else:
                self.state_id[changed] = self._state_ids(c, changed)
        return self.frag

    def _state_ids(self, c, rows: np.ndarray) -> np.ndarray:
        free = np.sort(c.gpu_free[rows], axis=1)
        sig = np.concatenate([c.cpu_free[rows, None], c.mem_free[rows, None], free], axis=1).astype(np.int64)
        ids = self._ids
        return np.array([ids.setdefault(row.tobytes(), len(ids)) for row in sig], dtype=np.int64)


ROUND_DIGITS = 6
# A lookup table over the key range beats sorting (np.unique) the candidates only while that range is a small
# multiple of their number: the table is allocated and filled per call, and node state ids x 1001 free shares
# make the range millions on a cluster of a thousand nodes (14 ms a call for 6,000 candidates, against 0.4 ms
# sorting: the bench's scheduler spent most of each decision here).
DENSE_KEYS_PER_KEY = 8


def _first_of_each(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the index of one element with each distinct key, in key order; each element's place in that)."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(keys.max()) + 1
    if top > DENSE_KEYS_PER_KEY * len(keys) + 1024:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    one_at = np.full(top, -1, dtype=np.int64)
    one_at[keys] = np.arange(len(keys))  # of repeated keys one write stands: any of them will do
    present = np.flatnonzero(one_at >= 0)
    rank = np.empty(top, dtype=np.int64)
    rank[present] = np.arange(len(present))
    return one_at[present], rank[keys]


def fragmentation(free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, types: TaskTypes) -> np.ndarray:
    """(R, T) fragmentation of R node states (free: (R, G) milli) for every task type."""
    return fragmentation_of(GpuFigures.of(free, types.thresholds), cpu, mem, types)


class FragmentationGradient:
    name = "fgd"

    def __init__(self, types: TaskTypes):
        self.types = types
        self._nodes = NodeFigures(types.thresholds, lambda c, figures, rows: fragmentation_of(
            figures, c.cpu_free[rows], c.mem_free[rows], types) @ types.p)

    def node_fragmentation(self, c) -> np.ndarray:
        """Expected fragmentation of every node now, recomputed only where a node changed."""
        return self._nodes.node_fragmentation(c)

    def delta(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        """Expected fragmentation after minus before, per candidate (milli-GPU)."""
        c, w, t = ctx.cluster, ctx.workload, self.types
        before = self.node_fragmentation(c)[cand.node]
        # Candidates on nodes in the same state (``NodeFigures.state_id``) taking a GPU with the same free share
        # leave the same after-state: each is scored once, on its first candidate. A fleet of 50,000 GPUs has
        # few such states where it has thousands of nodes.
        state = self._nodes.state_id[cand.node]
        first, inverse = _first_of_each(state * 1001 + c.gpu_free[cand.node, cand.gpu] if w.num_gpu == 1 else state)
        n = cand.node[first]
        if w.num_gpu == 1:
            # From the node's figures with one GPU changed rather than from all its GPUs again.
            g = cand.gpu[first]
            gpus = self._nodes.gpus.rows(n).after_taking(c.gpu_free[n, g], w.gpu_milli, t.thresholds)
        else:
            # (Every GPU a multi-GPU workload may take is wholly free, so which ones it takes changes nothing
            # here: the after-state is its node state's.)
            free = c.gpu_free[n].copy()
            if w.num_gpu > 1:
                # Whole GPUs are interchangeable for fragmentation: take the first k fully free.
                ok = ctx.cache["gpu_ok"][n]
                take = np.cumsum(ok, axis=1) <= w.num_gpu
                free -= np.where(ok & take, 1000, 0)
            gpus = GpuFigures.of(free, t.thresholds)
        after = fragmentation_of(gpus, c.cpu_free[n] - w.cpu_milli, c.mem_free[n] - w.memory_mib, t) @ t.p
        # To a millionth of a milli-GPU: the matrix product's last bits depend on how many rows it was given, and
        # the framework's 0-100 normalisation would turn candidates that differ by rounding alone into 0 and 100.
        return np.round(after[inverse] - before, ROUND_DIGITS)

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        return -self.delta(ctx, cand)
