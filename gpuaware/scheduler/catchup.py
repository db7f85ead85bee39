"""How far a reader is from the log ends it saw at start: catch-up bounded by progress, not wall time.

A restarting scheduler reads the compacted state topics from the beginning before it decides
anything. How long that takes grows with the log (and, until compaction runs, with time), so a
fixed deadline turns a large but healthy log into a restart loop. ``CatchUp`` instead gives up
only when the consumed offsets stop advancing for ``stall_timeout_s``; while they advance it
logs how far it is (offsets, per cent, rate, time to go) every ``report_every_s`` and keeps the
numbers the scheduler's gauges read. Offsets, not records, are counted: a gap that compaction
left counts as read.

Pure: positions are handed in, time comes from ``clock``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Mapping

log = logging.getLogger(__name__)


class CatchUpStalled(TimeoutError):
    """The consumed offsets did not advance for the stall timeout."""


class CatchUp:
    def __init__(self, stall_timeout_s: float = 30.0, report_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, what: str = "state feed"):
        if not stall_timeout_s > 0:
            raise ValueError(f"stall_timeout_s: {stall_timeout_s} must be positive")
        self.stall_timeout_s, self.report_every_s, self.clock, self.what = stall_timeout_s, report_every_s, clock, what
        self.targets: dict[Hashable, int] = {}
        self.positions: dict[Hashable, int] = {}
        self.total = 0
        self.began = self.advanced_at = self.reported_at = self.ended = 0.0
        self.done = False
        self.stalled = False
        self.stalled_for = 0.0  # how long without progress, when the stall was found

    def begin(self, targets: Mapping[Hashable, int], positions: Mapping[Hashable, int]) -> None:
        """Start from ``positions`` towards the log ends ``targets`` (both per partition)."""
        self.targets = dict(targets)
        self.positions = {p: positions.get(p, 0) for p in self.targets}
        self.total = sum(max(0, end - self.positions[p]) for p, end in self.targets.items())
        self.began = self.advanced_at = self.reported_at = self.ended = self.clock()
        self.done = self.remaining == 0

    @property
    def pending(self) -> list[Hashable]:
        """The partitions not yet read up to their target."""
        return [p for p, end in self.targets.items() if self.positions[p] < end]

    @property
    def remaining(self) -> int:
        return sum(max(0, end - self.positions[p]) for p, end in self.targets.items())

    @property
    def read(self) -> int:
        return self.total - self.remaining

    @property
    def ratio(self) -> float:
        return 1.0 if self.done or self.total == 0 else self.read / self.total

    @property
    def rate(self) -> float:
        """Offsets read per second since ``begin``."""
        elapsed = (self.ended if self.done else self.clock()) - self.began
        return self.read / elapsed if elapsed > 0 else 0.0

    def observe(self, positions: Mapping[Hashable, int]) -> None:
        """Take the consumer's positions (any subset of the partitions); judge progress, stall and report."""
        if self.done:
            return
        before = self.remaining
        for p, pos in positions.items():
            if p in self.positions:
                self.positions[p] = max(self.positions[p], pos)
        now = self.clock()
        if self.remaining < before:
            self.advanced_at, self.stalled = now, False
        if self.remaining == 0:
            self.done, self.ended = True, now
            log.info("%s caught up: %d records in %.1f s (%.0f records/s)", self.what, self.total, now - self.began,
                     self.rate)
            return
        if not self.stalled:  # kept as found until progress resumes
            self.stalled_for = now - self.advanced_at
            self.stalled = self.stalled_for >= self.stall_timeout_s
        if now - self.reported_at >= self.report_every_s:
            self.reported_at = now
            log.info("%s catching up: %s", self.what, self.describe())

    def describe(self) -> str:
        rate = self.rate
        to_go = f", about {self.remaining / rate:.0f} s to go" if rate > 0 else ""
        return f"{self.read} of {self.total} records ({self.ratio:.0%}), {rate:.0f} records/s{to_go}"

    def stall_error(self) -> CatchUpStalled:
        return CatchUpStalled(f"{self.what} catch-up stalled at {self.describe()}: no progress for "
                              f"{self.stalled_for:.0f} s (stall timeout {self.stall_timeout_s:.0f} s)")
