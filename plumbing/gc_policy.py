"""Cyclic garbage collection for a process that holds a large, long-lived heap (a cluster's objects).

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
from collections.abc import Iterator

YOUNG_THRESHOLD = 50_000
PYTHON_DEFAULT_THRESHOLD = gc.get_threshold()  # as the interpreter started (this module loads before any tuning)


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


def fresh_process_gc() -> None:
    """Undo ``settle_long_lived_heap`` (a benchmark starting another scheduler in the same process): the earlier
    one's frozen heap is collected (a finished scheduler is garbage in cycles) and the thresholds are the
    interpreter's again."""
    gc.unfreeze()
    gc.set_threshold(*PYTHON_DEFAULT_THRESHOLD)
    gc.enable()
    gc.collect()
