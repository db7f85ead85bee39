"""Live GPU state (``gpuaware.scheduler.feed``) into the cluster model: health bands, staleness, where each GPU is.

Where each GPU is (``where``) is kept, not rebuilt per pass: located again for a new model (nodes changed)
and for the nodes whose node state changed. The view keeps what the model is written from as columns, so a
pass writes the whole fleet in one vectorised step per column (``StateView.apply_slots``); at 50,000 GPUs
rebuilding ``where`` and writing GPU by GPU took most of the pass (docs/performance.md, "scheduler at fleet
scale").
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.cache import ClusterCache

REAPPLY_EVERY_S = 1.0  # with nothing new, staleness still moves on


class LiveGpuState:
    def __init__(self, view: StateView, cache: ClusterCache):
        self.view, self.cache = view, cache
        self.where: dict[str, tuple[int, int]] = {}  # GPU UUID -> (node index, GPU index) in the current model
        self.band_changes: deque[tuple[float, str, int, int]] = deque(maxlen=10_000)  # (unix s, node, GPU, band)
        # The GPUs whose state changed or that were located anew by the last ``apply`` (None: all, a new model):
        # what the health reactions need to look at besides the GPUs they are already acting on.
        self.changed: set[str] | None = None
        self._applied: tuple[int, int] | None = None
        self._applied_at = 0.0
        # The model the arrays below are for (held, not its id(): a rebuilt model may be given a freed one's id).
        self._model: ClusterState | None = None
        self._uuid_at = np.empty((0, 0), dtype=object)  # (node, GPU) -> UUID located there, or None
        self._slot_at = np.empty((0, 0), dtype=np.int64)  # (node, GPU) -> the view's slot of that UUID, or -1

    def apply(self, now: float) -> bool:
        """Bring the model's bands up to date; False when nothing could have changed since the last time."""
        # New records, a rebuilt model, or time passing (staleness) change what the model should say.
        key = (self.view.version, id(self.cache.cluster))
        if key == self._applied and now - self._applied_at < REAPPLY_EVERY_S:
            return False
        self._applied, self._applied_at = key, now
        c = self.cache.cluster
        changed, nodes = self.view.take_changes()
        if c is not self._model:
            self._locate_all()
            self.changed = None
        else:
            self.changed = changed | self._relocate(nodes)
        for uuid in changed:  # a GPU located before its first state arrived: its slot, with that state
            at = self.where.get(uuid)
            if at is not None:
                self._slot_at[at] = self.view.slot.get(uuid, -1)
        before = c.band.copy()
        self.view.apply_slots(c, self._slot_at, int(now * 1000))
        self.cache.apply_cordons(self._slot_at >= 0)  # a cordon stands whatever the stream says
        for i, g in np.argwhere(c.band != before):
            self.band_changes.append((now, c.names[int(i)], int(g), int(c.band[i, g])))
        return True

    def uuid_at(self, node: int, gpu: int) -> str | None:
        """The GPU located at (node index, GPU index) of the current model."""
        uuids = self._uuid_at
        return uuids[node, gpu] if node < uuids.shape[0] and gpu < uuids.shape[1] else None

    def _locate_all(self) -> None:
        c = self.cache.cluster
        self._model = c
        self.where = {}
        self._uuid_at = np.full(c.band.shape, None, dtype=object)
        self._slot_at = np.full(c.band.shape, -1, dtype=np.int64)
        self._relocate(self.view.nodes)

    def _relocate(self, nodes) -> set[str]:
        """Locate the GPUs of ``nodes`` (names) as their newest node state lists them; returns those placed
        somewhere new."""
        c, where, moved = self.cache.cluster, self.where, set()
        for node_name in nodes:
            ns = self.view.nodes.get(node_name)
            i = c.index.get(node_name)
            if ns is None or i is None:
                continue
            for g, old in enumerate(self._uuid_at[i]):
                if old is not None and where.get(old) == (i, g):
                    del where[old]
            self._uuid_at[i] = None
            self._slot_at[i] = -1
            for gpu in ns.gpus:
                if gpu.index < c.max_gpus:
                    if where.get(gpu.uuid, (i, gpu.index)) != (i, gpu.index):  # moved here from another node
                        j, h = where[gpu.uuid]
                        self._uuid_at[j, h], self._slot_at[j, h] = None, -1
                    where[gpu.uuid] = (i, gpu.index)
                    self._uuid_at[i, gpu.index] = gpu.uuid
                    self._slot_at[i, gpu.index] = self.view.slot.get(gpu.uuid, -1)
                    moved.add(gpu.uuid)
        return moved
