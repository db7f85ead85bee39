"""Time to a limit: where a GPU's temperature settles and when it crosses slowdown, and when its memory runs out.

Alarms are graded by how close a GPU is to a limit it cannot pass without harm (docs/health.md,
"Severity"), not by how far it moved from its own usual. Two limits, two physics:

- temperature: a heat sink is a first-order system with time constant ``TAU_S``: ``dT/dt = (T_inf - T) / tau``,
  so a GPU warming at ``dT/dt`` now settles at ``T_inf = T + tau * dT/dt`` and reaches a temperature
  ``L < T_inf`` after ``tau * ln((T_inf - T) / (T_inf - L))``. A heat source that keeps growing (a
  drift: clogging fins, pump-out of the thermal paste) pushes ``T_inf`` up as it goes, so the
  estimate is refreshed every read;
- memory wear: rows remapped (Ampere and later, 512 spare rows for the framebuffer) or pages retired
  (before Ampere, 64 at most) count up toward a limit past which an uncorrectable error can no longer
  be mapped out (XID 64); a count rising steadily reaches it at ``(limit - count) / rate``;
- memory: a framebuffer filling at a steady rate runs out at ``(limit - used) / rate``. Workloads
  fill memory in ramps that stop (a framework's allocator growing to its footprint in its first
  minutes), so nothing is judged for ``warmup_s`` after the first reading, and the rate is fitted over
  ``window_s`` and must hold steadily, with a slope distinguishable from zero, for the whole window.
"""

from __future__ import annotations

import math
from collections import deque

TAU_S = 40.0  # the heat sink's time constant (gpuaware/agent/peers.py learns the line with the same)
FB_EXHAUSTED = 0.95  # share of the framebuffer at which allocations start failing (allocator fragmentation)
# A limit predicted this close is graded CRITICAL + DRAIN: the scheduler gives a pod 120 s to checkpoint
# (checkpoint_timeout_s, gpuaware/scheduler/settings.py) and as long again goes to the cordon, the
# eviction and the estimate's own error.
LEAD_S = 300.0
# NVIDIA's memory error management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/row-remapping.html): up to
# 512 row remappings for the framebuffer from Ampere on, 64 page retirements before.
ROW_REMAP_LIMIT = 512
PAGE_RETIRE_LIMIT = 64


def wear_limit(arch: str) -> int:
    """How many rows a GPU of ``arch`` can map out of its framebuffer (rows remapped, or pages retired)."""
    return PAGE_RETIRE_LIMIT if arch in ("Kepler", "Maxwell", "Pascal", "Volta", "Turing") else ROW_REMAP_LIMIT


def settles_at(temp_c: float, rate_c_per_s: float, tau_s: float = TAU_S) -> float:
    """Where a first-order heat sink warming at ``rate_c_per_s`` now settles."""
    return temp_c + tau_s * rate_c_per_s


def time_to_temp(temp_c: float, rate_c_per_s: float, limit_c: float, tau_s: float = TAU_S) -> float | None:
    """Seconds until ``limit_c`` (0 when already there); None when the GPU settles below it."""
    if temp_c >= limit_c:
        return 0.0
    settle = settles_at(temp_c, rate_c_per_s, tau_s)
    if settle <= limit_c:
        return None
    return tau_s * math.log((settle - temp_c) / (settle - limit_c))


class Trend:
    """Least-squares slope of one signal over the last ``window_s`` seconds, with its standard error.

    Running sums (added and taken away as points enter and leave), so a read costs the same whatever
    the window: the agent feeds one per GPU per watch read.
    """

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.points: deque[tuple[float, float]] = deque()
        self.t0: float | None = None  # times relative to the first point, for precision
        self.sums = [0.0] * 5  # t, v, t*t, t*v, v*v

    def _account(self, t: float, v: float, sign: float) -> None:
        s = self.sums
        s[0] += sign * t
        s[1] += sign * v
        s[2] += sign * t * t
        s[3] += sign * t * v
        s[4] += sign * v * v

    def add(self, ts: float, value: float) -> None:
        if self.t0 is None:
            self.t0 = ts
        self.points.append((ts - self.t0, value))
        self._account(ts - self.t0, value, 1.0)
        while self.points and self.points[0][0] < ts - self.t0 - self.window_s:
            self._account(*self.points.popleft(), -1.0)

    def span(self) -> float:
        return self.points[-1][0] - self.points[0][0] if len(self.points) > 1 else 0.0

    def steady_rate(self, min_span_s: float) -> float | None:
        """The slow end (2 standard errors) of a rate that held steadily over at least ``min_span_s``: the
        points lie on the line, scatter within a tenth of the rise. A step or a ramp that stopped inside
        the window is not steady; None then, or when the rate is not above zero."""
        fit = self.fit() if self.span() >= min_span_s else None
        if fit is None:
            return None
        rate, err, sd = fit
        slow = rate - 2 * err
        if slow <= 0 or sd > 0.1 * rate * self.span():
            return None
        # Every quarter of the window rises at half the rate or more (a ramp that stopped has a flat end).
        pts = list(self.points)
        q = len(pts) // 4
        for part in (pts[:q + 1], pts[q:2 * q + 1], pts[2 * q:3 * q + 1], pts[3 * q:]):
            if len(part) > 1 and (part[-1][1] - part[0][1]) < 0.5 * rate * (part[-1][0] - part[0][0]):
                return None
        return slow

    def slope(self) -> tuple[float, float] | None:
        """(slope per second, its standard error); None with fewer than 3 points."""
        fit = self.fit()
        return fit[:2] if fit is not None else None

    def fit(self) -> tuple[float, float, float] | None:
        """(slope per second, its standard error, the residuals' standard deviation)."""
        n = len(self.points)
        if n < 3:
            return None
        st, sv, stt, stv, svv = self.sums
        sxx = stt - st * st / n
        if sxx <= 1e-9:
            return None
        sxy = stv - st * sv / n
        syy = svv - sv * sv / n
        b = sxy / sxx
        resid = max(0.0, syy - b * sxy)
        sd = math.sqrt(resid / max(n - 2, 1))
        return b, sd / math.sqrt(sxx), sd


class MemoryRunway:
    """Time until the framebuffer is exhausted, from the trend of its use over ``window_s``.

    Returns (seconds, seconds at the slow end of the slope's ~95 % interval) while the fill rate has
    held for the whole window and is distinguishable from zero; the slow end is what grades (a
    prediction the interval does not support pages no one).
    """

    def __init__(self, fb_total_mib: float, window_s: float = 600.0, every_s: float = 5.0, warmup_s: float = 600.0):
        self.limit = FB_EXHAUSTED * fb_total_mib
        self.trend = Trend(window_s)
        self.every_s = every_s  # the fit is over a few minutes: a point every few seconds is plenty
        self.warmup_s = warmup_s
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    def learn_one(self, ts: float, used_mib: float | None) -> tuple[float, float] | None:
        if used_mib is None:
            return None
        self.first_ts = ts if self.first_ts is None else self.first_ts
        if ts - self.first_ts < self.warmup_s:
            # A job sizes its memory in its first minutes (the allocator growing to its footprint): a ramp
            # that stops. Only growth after that is judged.
            return None
        if self.last_ts is None or ts - self.last_ts >= self.every_s - 1e-6:
            self.trend.add(ts, used_mib)
            self.last_ts = ts
        if used_mib >= self.limit:
            return 0.0, 0.0
        # A leak is a steady rate; a workload's memory moves in steps and plateaus.
        slow = self.trend.steady_rate(self.trend.window_s - self.every_s)
        if slow is None:
            return None
        rate = self.trend.slope()[0]
        left = self.limit - used_mib
        return left / rate, left / slow


class WearRunway:
    """Time until a GPU runs out of rows to remap (pages to retire), from the trend of the count over ``window_s``.

    (seconds, seconds at the slow end of the rate's interval) while the count has risen steadily, by at
    least ``min_rise`` over the window (a healthy board maps out a row or two in its life, not a stream).
    """

    def __init__(self, window_s: float = 300.0, min_rise: int = 5):
        self.trend = Trend(window_s)
        self.min_rise = min_rise
        self.last: tuple[float, int] | None = None

    def learn_one(self, ts: float, count: int, limit: int) -> tuple[float, float] | None:
        if self.last is not None and count < self.last[1]:
            self.trend = Trend(self.trend.window_s)  # a counter that went down is another board's (replaced)
        if self.last is None or ts > self.last[0]:
            self.trend.add(ts, float(count))
            self.last = (ts, count)
        if count >= limit:
            return 0.0, 0.0
        pts = self.trend.points
        if len(pts) < 3 or pts[-1][1] - pts[0][1] < self.min_rise:
            return None
        slow = self.trend.steady_rate(0.5 * self.trend.window_s)
        if slow is None:
            return None
        rate = self.trend.slope()[0]
        return (limit - count) / rate, (limit - count) / slow
