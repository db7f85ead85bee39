"""Live GPU state (``scheduler.feed``) into the cluster model: health bands, staleness, where each GPU is."""

from __future__ import annotations

from collections import deque

import numpy as np

from scheduler.feed import StateView
from scheduler.kube.cache import ClusterCache

REAPPLY_EVERY_S = 1.0  # with nothing new, staleness still moves on


class LiveGpuState:
    def __init__(self, view: StateView, cache: ClusterCache):
        self.view, self.cache = view, cache
        self.where: dict[str, tuple[int, int]] = {}  # GPU UUID -> (node index, GPU index) in the current model
        self.band_changes: deque[tuple[float, str, int, int]] = deque(maxlen=10_000)  # (unix s, node, GPU, band)
        self._applied: tuple[int, int] | None = None
        self._applied_at = 0.0

    def apply(self, now: float) -> bool:
        """Bring the model's bands up to date; False when nothing could have changed since the last time."""
        # New records, a rebuilt model, or time passing (staleness) change what the model should say.
        key = (self.view.version, id(self.cache.cluster))
        if key == self._applied and now - self._applied_at < REAPPLY_EVERY_S:
            return False
        self._applied, self._applied_at = key, now
        c = self.cache.cluster
        where: dict[str, tuple[int, int]] = {}
        for node_name, ns in self.view.nodes.items():
            i = c.index.get(node_name)
            if i is not None:
                for g in ns.gpus:
                    if g.index < c.max_gpus:
                        where[g.uuid] = (i, g.index)
        self.where = where
        before = c.band.copy()
        self.view.apply(c, where.get, int(now * 1000))
        self.cache.apply_cordons()  # a cordon stands whatever the stream says
        for i, g in np.argwhere(c.band != before):
            self.band_changes.append((now, c.names[int(i)], int(g), int(c.band[i, g])))
        return True
