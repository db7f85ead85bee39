"""How good the runtime estimates the scheduler placed pods with turned out: each completion against the estimate
its pod had when the scheduler placed it.

``placed`` keeps, per pod placed, the estimate it was placed with (``PassActions.start``; a pod placed with no
estimate is not kept) and ``completed`` scores it against the runtime the completion measured, into a
window of the last ``window`` scored completions (500): over the ones placed with a learned estimate (``judged``:
source ``forecast`` or ``calibrated``), the rank correlation (Spearman) between predicted p50 and actual runtime
and the share of actual runtimes at or below the p90 (coverage; 0.9 when calibrated). A declared duration taken
as exact has its p90 at its p50, at the declaration: generous declarations would read as a coverage of 1 and
their order as the forecaster's, so these are not judged. Over the whole window, the
mean absolute error of log runtime against the p50 by the level the estimate came from (``owner``, ``tenant``,
``shape``, ``global`` for a forecast; ``declared`` for a declared duration, calibrated or not). Bounded: the
window, and at most ``placed_max`` pods placed and not yet ended (50,000; the oldest placement dropped first: a pod
deleted while running is never scored and leaves that way).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from gpuaware.scheduler.core.runtime import RuntimeEstimate

WINDOW = 500
RECENT = 5
JUDGED = ("forecast", "calibrated")  # the estimate sources learned from completions


@dataclass(frozen=True)
class Scored:
    key: str  # namespace/name
    p50_s: float
    p90_s: float
    actual_s: float
    level: str
    source: str = "forecast"


def level_of(e: RuntimeEstimate) -> str:
    return "declared" if e.source in ("declared", "calibrated") else (e.level or "global")


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the ranks); None with fewer than 3 pairs or no spread."""
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx <= 0 or syy <= 0 else sxy / math.sqrt(sxx * syy)


class ForecastQuality:
    def __init__(self, window: int = WINDOW, placed_max: int = 50_000):
        self.window: deque[Scored] = deque(maxlen=window)
        self.placed_max = placed_max
        self._placed: OrderedDict[str, RuntimeEstimate] = OrderedDict()
        self.published = 0  # completions published on job.completions.v1
        self.unscored = 0  # completions of pods placed with no estimate

    def placed(self, key: str, estimate: RuntimeEstimate | None) -> None:
        if estimate is None:
            self._placed.pop(key, None)
            return
        self._placed[key] = estimate
        self._placed.move_to_end(key)
        while len(self._placed) > self.placed_max:
            self._placed.popitem(last=False)

    def forget(self, key: str) -> None:
        self._placed.pop(key, None)

    def completed(self, key: str, actual_s: float) -> Scored | None:
        e = self._placed.pop(key, None)
        if e is None or actual_s <= 0:
            self.unscored += 1
            return None
        s = Scored(key, e.p50(), e.p90(), actual_s, level_of(e), e.source)
        self.window.append(s)
        return s

    def summary(self) -> dict:
        """The window's figures: ``completions``, ``judged`` (placed with a learned estimate) and over those
        ``spearman`` and ``p90_coverage``, ``mae_log`` per level, ``unscored`` and ``recent`` (the last
        ``RECENT``: predicted p50/p90 and actual seconds)."""
        w = list(self.window)
        judged = [s for s in w if s.source in JUDGED]
        by_level: dict[str, list[float]] = {}
        for s in w:
            by_level.setdefault(s.level, []).append(abs(math.log(s.actual_s) - math.log(max(s.p50_s, 1e-3))))
        return {
            "completions": len(w),
            "published": self.published,
            "unscored": self.unscored,
            "judged": len(judged),
            "spearman": spearman([s.p50_s for s in judged], [s.actual_s for s in judged]),
            "p90_coverage": sum(s.actual_s <= s.p90_s for s in judged) / len(judged) if judged else None,
            "mae_log": {lvl: sum(v) / len(v) for lvl, v in sorted(by_level.items())},
            "recent": [{"pod": s.key, "level": s.level, "p50_s": round(s.p50_s, 1), "p90_s": round(s.p90_s, 1),
                        "actual_s": round(s.actual_s, 1)} for s in w[-RECENT:]],
        }


def report(quality: ForecastQuality, table, now_s: float) -> dict:
    """Job runtimes as ``gpuaware up`` shows them: completions published, the runtime table (``table``:
    ``scheduler.runtimes.RuntimeTable`` or None without Kafka) and the window's figures, rounded."""
    q = quality.summary()
    age = now_s - table.newest_ms / 1000 if table is not None and table.newest_ms else None
    return {"completions_published": q["published"], "completions_scored": q["completions"],
            "completions_unscored": q["unscored"], "completions_judged": q["judged"],
            "runtime_keys": len(table.stats) if table is not None else None,
            "newest_record_age_s": round(age, 1) if age is not None else None,
            "spearman": round(q["spearman"], 3) if q["spearman"] is not None else None,
            "p90_coverage": round(q["p90_coverage"], 3) if q["p90_coverage"] is not None else None,
            "mae_log": {k: round(v, 3) for k, v in q["mae_log"].items()}, "recent": q["recent"]}
