"""Online per-series forecaster: an ensemble that picks, per series, the expert that has been best.

River-style (``learn_one`` / ``forecast``, all state in the object). Each step the experts
(last value, rolling medians and means, EWMAs, a damped trend) forecast ``horizon`` steps ahead;
when that step's value arrives each expert's absolute error is folded into an exponentially
decayed loss, and the forecast comes from the expert with the lowest loss so far (follow the
leader with forgetting). Prediction intervals are split-conformal: the quantiles of this series'
recent signed errors of the chosen forecasts. Outputs are clamped to physical bounds, and no
expert can diverge (each is a bounded statistic of observed values).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

EXPERTS = ("last", "median5", "median15", "median30", "mean5", "mean15", "ewma0.1", "ewma0.3", "trend")


@dataclass
class Forecast:
    mean: float
    lower: float
    upper: float
    expert: str


class ExpertForecaster:
    def __init__(self, horizon: int = 5, decay: float = 0.97, coverage: float = 0.8, window: int = 30,
                 residuals: int = 200, lower_bound: float | None = 0.0, upper_bound: float | None = None):
        if horizon < 1 or not 0 < decay < 1 or not 0 < coverage < 1:
            raise ValueError("horizon >= 1, 0 < decay < 1 and 0 < coverage < 1 are required")
        self.horizon = horizon
        self.decay = decay
        self.alpha = (1 - coverage) / 2
        self.values: deque[float] = deque(maxlen=window)
        self.ewma = {0.1: None, 0.3: None}
        self.loss = np.zeros(len(EXPERTS))
        self.pending: deque[tuple[int, np.ndarray, float]] = deque()
        self.errors: deque[float] = deque(maxlen=residuals)
        self.t = 0
        self.bounds = (lower_bound, upper_bound)

    def learn_one(self, y: float) -> None:
        """The value at the current step; resolves the forecasts made ``horizon`` steps ago."""
        y = float(y)
        while self.pending and self.pending[0][0] <= self.t:
            _, experts, chosen = self.pending.popleft()
            self.loss = self.decay * self.loss + (1 - self.decay) * np.abs(experts - y)
            self.errors.append(y - chosen)
        self.values.append(y)
        for a, prev in self.ewma.items():
            self.ewma[a] = y if prev is None else a * y + (1 - a) * prev
        self.t += 1

    def _experts(self) -> np.ndarray:
        w = np.fromiter(self.values, dtype=float)
        last = w[-1]
        slope = (w[-1] - w[-10]) / 9 if len(w) >= 10 else 0.0
        return np.array([
            last, np.median(w[-5:]), np.median(w[-15:]), np.median(w[-30:]), w[-5:].mean(), w[-15:].mean(),
            self.ewma[0.1], self.ewma[0.3], last + 0.5 * slope * self.horizon,
        ])

    def _clamp(self, x: float) -> float:
        lo, hi = self.bounds
        if lo is not None:
            x = max(lo, x)
        if hi is not None:
            x = min(hi, x)
        return x

    def forecast(self) -> Forecast:
        """The value ``horizon`` steps after the last learned one, with its interval."""
        if not self.values:
            raise ValueError("forecast() before any learn_one()")
        experts = self._experts()
        best = int(np.argmin(self.loss))
        mean = self._clamp(float(experts[best]))
        self.pending.append((self.t - 1 + self.horizon, experts, mean))
        if len(self.errors) >= 20:
            lo_q, hi_q = np.quantile(np.fromiter(self.errors, dtype=float), [self.alpha, 1 - self.alpha])
        else:  # too few errors yet: a wide interval from the series' own spread
            spread = float(np.ptp(np.fromiter(self.values, dtype=float))) or abs(mean) * 0.1 + 1.0
            lo_q, hi_q = -spread, spread
        return Forecast(mean, self._clamp(mean + lo_q), self._clamp(mean + hi_q), EXPERTS[best])


def prequential(series: dict[str, np.ndarray], horizon: int = 5, warmup: int = 30, upper: float | None = None,
                **kwargs) -> dict:
    """Predict, then learn, over every series; errors of the model and of persistence (last value)."""
    import time

    abs_err = persist_err = 0.0
    covered = n = updates = 0
    spent = 0.0
    for values in series.values():
        v = np.asarray(values, dtype=float)
        model = ExpertForecaster(horizon=horizon, upper_bound=upper, **kwargs)
        for t in range(len(v) - horizon):
            started = time.perf_counter()
            model.learn_one(v[t])
            f = model.forecast()
            spent += time.perf_counter() - started
            updates += 1
            if t >= warmup:
                target = v[t + horizon]
                abs_err += abs(f.mean - target)
                persist_err += abs(v[t] - target)
                covered += f.lower <= target <= f.upper
                n += 1
    return {
        "series": len(series),
        "horizon": horizon,
        "points": n,
        "mae": round(abs_err / max(n, 1), 4),
        "persistence_mae": round(persist_err / max(n, 1), 4),
        "ratio": round(abs_err / max(persist_err, 1e-12), 4),
        "interval_coverage_80": round(covered / max(n, 1), 4),
        "us_per_update": round(1e6 * spent / max(updates, 1), 2),
    }
