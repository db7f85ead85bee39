"""The cluster model as numpy arrays, so every plugin scores all GPUs at once.

Nodes are rows; GPU slots are columns (``max_gpus`` wide; a node with fewer GPUs has its extra
slots at capacity 0). Compute is in milli-GPU (1000 = one whole GPU), memory in MiB.

``ClusterState`` is the mutable model: only the framework's reserve (``allocate``), the caller's
release and resize, and the live state's writers change it. Plugins see ``ClusterSnapshot``
(``ClusterState.snapshot()``): the same arrays as read-only views and no mutating methods, as
kube-scheduler's plugins see its ``Snapshot`` and only assume/reserve touch the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from gpuaware.contract.events import HealthBand

MIG_SLICE_MILLI = 143  # one of the seven compute slices of an A100/H100 in MIG mode (1g)


def mig_round(milli: np.ndarray | int) -> np.ndarray | int:
    """A request on a MIG GPU takes whole slices (a 7/7 request is the whole GPU)."""
    return np.minimum(-(-np.asarray(milli) // MIG_SLICE_MILLI) * MIG_SLICE_MILLI, 1000) if np.ndim(milli) else \
        min(-(-int(milli) // MIG_SLICE_MILLI) * MIG_SLICE_MILLI, 1000)


BAND_CODE = {HealthBand.HEALTHY: 0, HealthBand.DEGRADED: 1, HealthBand.CRITICAL: 2, HealthBand.UNKNOWN: 0}


@dataclass
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    gpu_memory_mib: int = 0
    nvlink_groups: list[int] | None = None  # per GPU; None = all GPUs on one island
    mig: list[bool] | None = None  # per GPU: MIG mode on (compute only in 1/7 slices)


@dataclass
class Allocation:
    workload_id: str
    node: int
    gpus: list[int]
    milli: list[int]  # per GPU in ``gpus``
    cpu_milli: int
    memory_mib: int
    gpu_memory_mib: list[int] = field(default_factory=list)
    sharing: str = "exclusive"


class ClusterReads:
    """What both the model and its snapshot answer from the arrays alone."""

    __slots__ = ()
    names: list[str] | tuple[str, ...]
    models: np.ndarray
    model_names: list[str] | tuple[str, ...]
    gpu_cap: np.ndarray
    gpu_free: np.ndarray
    gpu_mem_cap: np.ndarray

    def gpu_memory_by_model(self) -> dict[str, int]:
        """The memory of one GPU of each model, MiB (the largest a node of it reports): what a whole GPU
        counts against a GPU-memory quota."""
        return {m: int(self.gpu_mem_cap[self.models == m].max(initial=0)) for m in self.model_names}

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_cap.sum())

    @property
    def allocated_gpu_milli(self) -> int:
        return int((self.gpu_cap - self.gpu_free).sum())


class ClusterState(ClusterReads):
    def __init__(self, nodes: list[NodeSpec]):
        self.names = [n.name for n in nodes]
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.models = np.array([n.model for n in nodes])
        self.model_names = sorted(set(self.models.tolist()))
        self.model_id = np.array([self.model_names.index(m) for m in self.models])
        n, g = len(nodes), max((x.gpus for x in nodes), default=1) or 1
        self.max_gpus = g
        self.cpu_cap = np.array([x.cpu_milli for x in nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in nodes], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_count = np.array([x.gpus for x in nodes], dtype=np.int64)
        slot = np.arange(g)[None, :] < self.gpu_count[:, None]
        self.gpu_exists = slot
        self.gpu_cap = np.where(slot, 1000, 0).astype(np.int64)
        self.gpu_free = self.gpu_cap.copy()
        mem = np.array([x.gpu_memory_mib for x in nodes], dtype=np.int64)[:, None]
        self.gpu_mem_cap = np.where(slot, mem, 0)
        self.gpu_mem_free = self.gpu_mem_cap.copy()
        self.band = np.zeros((n, g), dtype=np.int8)  # 0 healthy, 1 degraded, 2 critical
        self.util = np.zeros((n, g), dtype=np.float32)  # live utilisation 0-100 (from gpu.state.v1)
        self.forecast_util = np.zeros((n, g), dtype=np.float32)
        self.temp = np.zeros((n, g), dtype=np.float32)
        # More of the stream's per-GPU state, read only by the stream plugins; ``live`` False (the default,
        # and for a stale GPU) makes each of them fall back to what the requests alone say.
        self.live = np.zeros((n, g), dtype=bool)
        self.forecast_mem = np.zeros((n, g), dtype=np.float32)  # MiB, upper end of the forecast interval
        self.power = np.zeros((n, g), dtype=np.float32)  # W
        self.power_limit = np.zeros((n, g), dtype=np.float32)  # W; 0 = unknown
        self.fingerprint = np.full((n, g), "", dtype=object)  # workload class; "" = unknown
        groups = np.zeros((n, g), dtype=np.int64)
        for i, x in enumerate(nodes):
            if x.nvlink_groups is not None:
                groups[i, : len(x.nvlink_groups)] = x.nvlink_groups
        self.nvlink = groups
        mig = np.zeros((n, g), dtype=bool)
        for i, x in enumerate(nodes):
            if x.mig is not None:
                mig[i, : len(x.mig)] = x.mig
        self.mig = mig
        self.has_mig = bool(mig.any())
        self.allocations: dict[str, Allocation] = {}
        self.node_workloads = np.zeros(n, dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)  # bumped on every change of a node, for plugin caches
        self._shapes: dict[tuple[int, int], np.ndarray] = {}
        self._snapshot: ClusterSnapshot | None = None

    def snapshot(self) -> ClusterSnapshot:
        """The read-only view plugins get, one per cluster, brought up to date at the start of each cycle."""
        s = self.__dict__.get("_snapshot")
        if s is None:
            s = self._snapshot = ClusterSnapshot(self)
        else:
            s.refresh()
        return s

    def __getstate__(self) -> dict:
        # The snapshot's views are of this object's arrays: a copy builds its own.
        return {k: v for k, v in self.__dict__.items() if k != "_snapshot"}

    def shape_count(self, num_gpu: int, milli: int) -> np.ndarray:
        """How many workloads of this GPU shape each node runs."""
        key = (num_gpu, milli if num_gpu else 0)
        if key not in self._shapes:
            self._shapes[key] = np.zeros(len(self.names), dtype=np.int64)
        return self._shapes[key]

    def _count(self, a: Allocation, delta: int) -> None:
        self.version[a.node] += 1
        self.node_workloads[a.node] += delta
        self.shape_count(len(a.gpus), a.milli[0] if a.gpus else 0)[a.node] += delta

    def set_band(self, node: int, gpu: int, band: HealthBand) -> None:
        self.band[node, gpu] = BAND_CODE[band]
        self.version[node] += 1

    def allocate(self, a: Allocation) -> None:
        if a.workload_id in self.allocations:
            raise ValueError(f"{a.workload_id} is already allocated")
        n = a.node
        if self.cpu_free[n] < a.cpu_milli or self.mem_free[n] < a.memory_mib:
            raise ValueError(f"{a.workload_id}: node {self.names[n]} lacks CPU or memory")
        for g, m in zip(a.gpus, a.milli, strict=True):
            if not self.gpu_exists[n, g] or self.gpu_free[n, g] < m:
                raise ValueError(f"{a.workload_id}: GPU {g} of {self.names[n]} has {self.gpu_free[n, g]} milli free, "
                                 f"needs {m}")
        mems = a.gpu_memory_mib or [0] * len(a.gpus)
        for g, mm in zip(a.gpus, mems, strict=True):
            if self.gpu_mem_cap[n, g] and self.gpu_mem_free[n, g] < mm:
                raise ValueError(f"{a.workload_id}: GPU {g} of {self.names[n]} lacks memory")
        self.cpu_free[n] -= a.cpu_milli
        self.mem_free[n] -= a.memory_mib
        for g, m, mm in zip(a.gpus, a.milli, mems, strict=True):
            self.gpu_free[n, g] -= m
            if self.gpu_mem_cap[n, g]:
                self.gpu_mem_free[n, g] -= mm
        self.allocations[a.workload_id] = a
        self._count(a, 1)

    def release(self, workload_id: str) -> Allocation:
        a = self._unbook(workload_id)
        n = a.node
        for g in a.gpus:
            if self.live[n, g] and self.gpu_free[n, g] == self.gpu_cap[n, g] and \
                    self.gpu_mem_free[n, g] == self.gpu_mem_cap[n, g]:
                # The stream's forecasts and class are of the jobs it last saw, and the last of them just left:
                # until its next reading the GPU holds nothing, not what they were forecast to use.
                self.forecast_util[n, g] = self.forecast_mem[n, g] = 0.0
                self.fingerprint[n, g] = ""
        return a

    def resize(self, a: Allocation) -> None:
        """Charge a running workload ``a`` in place of what it holds: it stays, so its GPUs keep their readings."""
        self._unbook(a.workload_id)
        self.allocate(a)

    def _unbook(self, workload_id: str) -> Allocation:
        a = self.allocations.pop(workload_id)
        self._count(a, -1)
        n = a.node
        self.cpu_free[n] += a.cpu_milli
        self.mem_free[n] += a.memory_mib
        for g, m, mm in zip(a.gpus, a.milli, a.gpu_memory_mib or [0] * len(a.gpus), strict=True):
            self.gpu_free[n, g] += m
            if self.gpu_mem_cap[n, g]:
                self.gpu_mem_free[n, g] += mm
        return a

    def check_invariants(self) -> None:
        assert (self.gpu_free >= 0).all() and (self.gpu_free <= self.gpu_cap).all()
        assert (self.cpu_free >= 0).all() and (self.mem_free >= 0).all()
        assert (self.gpu_mem_free >= 0).all()
        used = np.zeros_like(self.gpu_free)
        for a in self.allocations.values():
            for g, m in zip(a.gpus, a.milli, strict=True):
                used[a.node, g] += m
        assert (used == self.gpu_cap - self.gpu_free).all()


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


class ClusterSnapshot(ClusterReads):
    """A ``ClusterState`` as plugins see it: every array a read-only view of the model's own (no copy; writing
    one raises ``ValueError``), names as tuples, allocations and the name index as read-only mappings, and
    no ``allocate``, ``release``, ``resize`` or ``set_band``. Its attributes cannot be rebound. (One hole is
    numpy's: ``ufunc.at``, e.g. ``np.add.at``, ignores the writeable flag as of numpy 2.4.)

    The views show the model as it is: the core runs one cycle at a time and nothing writes the model
    between a cycle's start and its reserve, so within a cycle this is the state the cycle began with.
    ``refresh`` (each cycle) rebuilds a view only where the model's attribute was rebound.
    """

    ARRAYS = ("models", "model_id", "cpu_cap", "mem_cap", "cpu_free", "mem_free", "gpu_count", "gpu_exists",
              "gpu_cap", "gpu_free", "gpu_mem_cap", "gpu_mem_free", "band", "util", "forecast_util", "temp", "live",
              "forecast_mem", "power", "power_limit", "fingerprint", "nvlink", "mig", "node_workloads", "version")
    # Read as they are (immutable values), or wrapped read-only: (attribute, how).
    OTHERS = (("max_gpus", None), ("has_mig", None), ("names", tuple), ("model_names", tuple),
              ("index", MappingProxyType), ("allocations", MappingProxyType))
    __slots__ = (*ARRAYS, *(name for name, _ in OTHERS), "_src", "_sources", "_shape_views", "_no_shape")

    if TYPE_CHECKING:  # the attributes ClusterState documents, as their read-only kinds
        names: tuple[str, ...]
        model_names: tuple[str, ...]
        index: Mapping[str, int]
        allocations: Mapping[str, Allocation]
        max_gpus: int
        has_mig: bool

    def __init__(self, cluster: ClusterState):
        put = object.__setattr__
        put(self, "_src", cluster)
        put(self, "_sources", {})
        put(self, "_shape_views", {})
        put(self, "_no_shape", _read_only(np.zeros(len(cluster.names), dtype=np.int64)))
        self.refresh()

    def refresh(self) -> None:
        put, src, sources = object.__setattr__, self._src, self._sources
        for name in self.ARRAYS:
            a = getattr(src, name)
            if sources.get(name) is not a:
                sources[name] = a
                put(self, name, _read_only(a))
        for name, wrap in self.OTHERS:
            v = getattr(src, name)
            if wrap is None:
                put(self, name, v)
            elif sources.get(name) is not v:
                sources[name] = v
                put(self, name, wrap(v))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"the cluster snapshot is read-only: {name} cannot be set (plugins change nothing; "
                             "the framework's reserve does)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"the cluster snapshot is read-only: {name} cannot be deleted")

    def shape_count(self, num_gpu: int, milli: int) -> np.ndarray:
        """How many workloads of this GPU shape each node runs (zeros for a shape nobody ever ran: reading
        registers nothing; ``ClusterState.allocate`` does)."""
        key = (num_gpu, milli if num_gpu else 0)
        view = self._shape_views.get(key)
        if view is None:
            counts = self._src._shapes.get(key)
            if counts is None:
                return self._no_shape
            view = self._shape_views[key] = _read_only(counts)
        return view
