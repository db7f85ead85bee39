"""Cyclic garbage collection for a process that holds a large, long-lived heap (a cluster's objects, a fleet's
GPU trackers).

CPython collects its oldest generation after 10 collections of the middle one, each after 10 of the youngest,
each after 700 net allocations: a scheduler holding thousands of pods' JSON and parsing a watch event per
change reached a full collection every second or two under a burst, each walking every object it holds
(~280 ms with the 1,213-node bench cluster: 3.6 s of a 25 s run in 13 pauses, holding the GIL, so no
Binding went out meanwhile). No collection runs while the process loads (its informers list every node and
pod), what was there when it became ready is frozen out of collection (it stays until the process ends or
refcounting frees it: cycles made while it loaded stay) and the youngest generation is collected after
50,000 allocations, which makes full collections rare; cycles made afterwards are still collected.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

YOUNG_THRESHOLD = 50_000
PYTHON_DEFAULT_THRESHOLD = gc.get_threshold()  # as the interpreter started (this module loads before any tuning)
# A count of the frozen objects walks their list: tens of millions at 50,000 GPUs, where counting every 10 s took 5 %
# of the worker's samples (docs/performance.md); what it watches for (held garbage) grows over minutes.
COUNT_EVERY_S = 300.0


def hold_collections() -> None:
    """Call as the process starts loading what it keeps: no collection walks the heap while it grows (the
    informers' lists of every node and pod are mostly acyclic; a collection would find little and walk it all)."""
    gc.disable()


def settle_long_lived_heap() -> None:
    """Call once the process has loaded what it keeps (e.g. informers synced)."""
    # No collection first: a full one walks the whole loaded heap (~0.2-0.3 s with the 1,213-node bench cluster
    # and a 2,000-pod backlog) before the first pass; the start-up's few cycles stay frozen with it.
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, max(middle, 20), old)
    gc.enable()


@contextlib.contextmanager
def loading_long_lived_heap() -> Iterator[None]:
    """``hold_collections`` for the block, ``settle_long_lived_heap`` after it, also when it fails: the
    collector is never left off."""
    hold_collections()
    try:
        yield
    finally:
        settle_long_lived_heap()


class FreezeSurvivors:
    """For a heap that grows as it works (a stream worker meets GPUs for as long as it runs, and keeps them):
    what survived a full collection is frozen out of the next ones, so each walks what came since.

    A stream worker holding 16,384 GPUs' trackers (2.5M tracked objects) ran a full collection every 3-30 s,
    each holding the GIL for 1.3-1.9 s and freeing nothing (docs/performance.md, the stream's "Where the time
    went", item 8); frozen, they took 3-40 ms. The price: a full collection is no test of long life, so what was
    alive at it only for the moment (a record in flight, a future) is frozen too, and if it dies in a cycle it is
    held until a ``reclaim``, which unfreezes so that the next full collection walks, and frees from, the whole
    heap once (the long pause, once). The caller reclaims where much long-lived state was let go (a rebalance),
    and one is made every ``reclaim_every_s`` in any case, which bounds what can be held. As a Prometheus
    collector it shows the frozen objects, so a growth that is not the fleet's shows. (CPython 3.11, which the
    image pins: later collectors number their generations differently.)"""

    def __init__(self, reclaim_every_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self.reclaim_every_s = reclaim_every_s
        self.clock = clock
        self.next_reclaim = clock() + reclaim_every_s
        self.frozen = self.reclaims = 0
        # A reclaim on the event loop's thread and a collection on another (one runs on whichever thread
        # allocates) may interleave: a freeze after the reclaim's unfreeze, by a collection that began before it,
        # would freeze a heap nobody walked. So a collection freezes only if no reclaim came since it started;
        # the lock keeps each side's check and change together. Neither side allocates a tracked object while
        # holding it, so no collection (and callback) can start inside it.
        self._lock = threading.RLock()
        self._reclaims_at_start = 0
        self._counted_at = -1e18
        self._frozen_objects = 0
        self._recount = False

    def install(self) -> FreezeSurvivors:
        # The interpreter's thresholds stay: frequent full collections are what keep each one small. (With the
        # young generation at 50,000, as settle_long_lived_heap sets, the first full collection came after the
        # worker had met 16,384 GPUs and walked all 2.4M objects at once: 1.4 s.)
        gc.callbacks.append(self._on_collection)
        return self

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def reclaim(self) -> None:
        """The next full collection walks (and frees from) the whole heap again."""
        with self._lock:
            gc.unfreeze()
            self._frozen_objects, self._counted_at = 0, self.clock()  # known without a count
            self._recount = True  # ... until the next freeze, which the next scrape counts
            self.reclaims += 1
            self.next_reclaim = self.clock() + self.reclaim_every_s

    def _on_collection(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        with self._lock:
            if phase == "start":
                self._reclaims_at_start = self.reclaims
            elif self.clock() >= self.next_reclaim:
                self.reclaim()
            elif self.reclaims == self._reclaims_at_start:
                gc.freeze()  # the survivors: what the heap holds now
                self.frozen += 1
                if self._recount:  # the first freeze after a reclaim: its count is not left at 0 for minutes
                    self._counted_at, self._recount = -1e18, False

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        if now - self._counted_at >= COUNT_EVERY_S:
            self._frozen_objects, self._counted_at = gc.get_freeze_count(), now
        yield GaugeMetricFamily("gpuaware_gc_frozen_objects", "objects kept out of the cyclic collector's "
                                "walks (gpuaware.plumbing.gc_policy.FreezeSurvivors; counted at most every 5 minutes)",
                                value=self._frozen_objects)
        yield CounterMetricFamily("gpuaware_gc_freezes", "full collections whose survivors were frozen",
                                  value=self.frozen)
        yield CounterMetricFamily("gpuaware_gc_reclaims", "unfreezes, each making the next full collection "
                                  "walk the whole heap", value=self.reclaims)


def fresh_process_gc() -> None:
    """Undo ``settle_long_lived_heap`` (a benchmark starting another scheduler in the same process): the earlier
    one's frozen heap is collected (a finished scheduler is garbage in cycles) and the thresholds are the
    interpreter's again."""
    gc.unfreeze()
    gc.set_threshold(*PYTHON_DEFAULT_THRESHOLD)
    gc.enable()
    gc.collect()
