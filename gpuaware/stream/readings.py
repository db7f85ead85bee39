"""The GPUs' latest readings as columns: one row of doubles per GPU (``GpuTracker.slot``), read by the fleet check in
vector operations.

A worker judges every GPU it holds against its model's fleet every 5 s (gpuaware.stream.fleet_peers). With the
readings in a dict per GPU, the check's walk over 50,000
trackers, a tuple built of each, was ~9 % of a worker's logic, more than the statistics it fed (py-spy of ``python -m
gpuaware.bench.worker_cost --gpus 50000``). Here the check gathers its GPUs' rows in one numpy call. The rows live in
one flat ``array('d')``: a sample's read-modify-write of a few numbers costs what it cost in a dict (numpy's
per-element access costs more), and numpy reads the same buffer without a copy (``table``).

A row holds the smoothed readings (``NAMES``, NaN: none yet), which live only here (``GpuTracker.smoothed`` is a
read-only view of them), and what the check reads of the tracker's own fields, written with them: when its data is
fresh from (``GpuTracker.fresh_ms``), whether an operator's power cap holds its clocks, its single-bit ECC errors over
the window (NaN: none reported) and its model (a number per model name, NaN: none).

A tracker takes a row when it is made and gives it back when it is dropped (``GpuTracker.__del__``); a row given back is
reused. The rows grow as ``array`` grows (amortised doubling); a worker keeps them once grown. A processor makes its
trackers in its own ``readings`` (``READINGS`` unless given another), so a deep copy of it, store and all, makes its
new trackers in the copied store.
"""

from __future__ import annotations

import math
from array import array
from operator import attrgetter

import numpy as np

NAMES = ("util_gpu", "util_mem", "fb_used_mib", "power_w", "temp_c", "sm_clock_mhz")
UTIL, UTIL_MEM, FB, POWER, TEMP, CLOCK = range(len(NAMES))
FRESH, CAPPED, SBE, MODEL = range(len(NAMES), len(NAMES) + 4)
WIDTH = len(NAMES) + 4
NAN = math.nan
SW_POWER_CAP = 0x4  # NVML clocks event reason: an operator's or the scheduler's power cap holds the clocks
_EMPTY = array("d", (NAN,) * WIDTH)


class Readings:
    """The rows of every tracker that shares this store (``READINGS``, one per process, unless a tracker is given
    another)."""

    def __init__(self) -> None:
        self.values = array("d")
        self.free: list[int] = []
        self.models: dict[str, float] = {}

    def new(self) -> int:
        """A row of NaNs: the slot of a new tracker."""
        if self.free:
            slot = self.free.pop()
            self.values[slot * WIDTH:(slot + 1) * WIDTH] = _EMPTY
            return slot
        slot = len(self.values) // WIDTH
        self.values.extend(_EMPTY)
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def held(self) -> int:
        """Rows in use."""
        return len(self.values) // WIDTH - len(self.free)

    def model(self, name: str) -> float:
        """The number standing for a model name in the ``MODEL`` column (NaN for none)."""
        if not name:
            return NAN
        number = self.models.get(name)
        if number is None:
            number = self.models[name] = float(len(self.models))
        return number

    def table(self) -> np.ndarray:
        """Every row, as a (rows, ``WIDTH``) array over the same memory: valid until the next row is made (``array``
        may move its buffer as it grows, and refuses to while numpy holds it), so callers index it at once."""
        return np.frombuffer(self.values, dtype=np.float64).reshape(-1, WIDTH)


READINGS = Readings()


_READINGS_OF, _SLOT_OF = attrgetter("readings"), attrgetter("slot")


def gather(trackers: list) -> np.ndarray:
    """The rows of ``trackers`` (GpuTrackers of one store), in their order: a (len(trackers), ``WIDTH``) copy made
    in one call."""
    if not trackers:
        return np.empty((0, WIDTH))
    store = trackers[0].readings
    # attrgetter over the trackers, not a Python function per tracker: a fleet check gathers every GPU held.
    if any(r is not store for r in set(map(_READINGS_OF, trackers))):
        raise ValueError("rows are gathered from one store of readings at a time")
    return store.table()[np.fromiter(map(_SLOT_OF, trackers), dtype=np.intp, count=len(trackers))]
