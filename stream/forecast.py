"""Online per-series forecaster: River statistics as experts, combined by an exponentially weighted median.

Every part that keeps state about the series is a River object:

- the experts are River statistics of the observed values: ``stats.Shift`` for the last value and
  the trend's lag, ``stats.RollingQuantile`` rolling medians, ``utils.Rolling(stats.Mean)``
  rolling means, ``stats.EWMean`` exponentially weighted means, and ``stats.RollingMode``, the most
  frequent exact value of the last hour: the plateau a memory series returns to after a dip. Each
  is a bounded statistic of observed values, so nothing can diverge;
- each expert's decayed absolute loss is a ``stats.EWMean`` of its errors;
- the interval is split-conformal: ``stats.RollingQuantile`` of this series' last 30 signed errors.

Hand-written, because River has nothing equivalent:

- the combination. River's ensembles and ``model_selection`` choose among regressors on feature
  dicts, scored on the current target; here the experts are forecasters of one series, scored on
  the value ``horizon`` steps later, so each forecast waits in a queue until its step arrives.
  The forecast is the weighted median of the experts, weights ``exp(-eta * excess loss)``: the
  median because the score is absolute error, and because the series (GPU memory especially) are
  plateaus with short dips, where a mean of experts is dragged into the dip;
- the context. Losses are kept per run-length bucket (how many steps the value has not changed),
  "sleeping experts": right after a change the medians are right (a dip comes back), on a long
  plateau the last value is;
- the prior for persistence: the other experts' losses count ``1 + prior`` times, so switching
  away from the last value must pay for itself.

River's own time-series models were measured as experts and left out (docs/forecasting.md):
``time_series.HoltWinters`` made both series slightly worse, SNARIMAX overshoots on memory series,
and importing ``river.time_series`` pulls in scipy (about 80 MiB per worker).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from river import stats, utils

EXPERTS = ("last", "median5", "median15", "median30", "median60", "mean5", "mean15",
           "ewma0.05", "ewma0.1", "ewma0.3", "mode60", "trend")
RUN_BUCKETS = (1, 4)  # context boundaries: the value unchanged for 0, 1-3 and 4+ steps
MIN_ERRORS = 20  # conformal quantiles from fewer errors than this are noise: use the series' own spread


@dataclass
class Forecast:
    mean: float
    lower: float
    upper: float
    expert: str  # the expert whose forecast is the weighted median


class ExpertForecaster:
    """``learn_one(y)`` then ``forecast()``: the value ``horizon`` steps after the last learned one.

    ``eta`` sets how fast an expert's weight falls with its excess loss, ``prior`` the handicap of
    every expert but the last value. ``errors`` keeps the last ``residuals`` signed errors, for the
    MAE the workers export.

    The interval's conformal quantiles come from the last ``interval_window`` errors only: errors
    come in bursts, and quantiles over a longer window keep a calm series' interval as wide as its
    last burst (over 200 errors the 80% interval covered 85% of the duty-cycle points). On
    independent noise, 30 errors' interpolated quantiles cover a little less than nominal (about
    74% in tests/stream/test_forecast.py); the finite-sample conformal ranks would fix that there
    and over-cover the real traces (87% of the duty-cycle points).
    """

    def __init__(self, horizon: int = 5, decay: float = 0.97, coverage: float = 0.8, window: int = 30,
                 residuals: int = 200, lower_bound: float | None = 0.0, upper_bound: float | None = None,
                 eta: float = 3.0, prior: float = 0.5, interval_window: int = 30):
        if horizon < 1 or not 0 < decay < 1 or not 0 < coverage < 1:
            raise ValueError("horizon >= 1, 0 < decay < 1 and 0 < coverage < 1 are required")
        self.horizon = horizon
        self.decay = decay
        self.coverage = coverage
        self.eta = eta
        alpha = (1 - coverage) / 2
        self._last = stats.Shift(0)
        self._lag = stats.Shift(9)
        self._stats = (
            stats.RollingQuantile(0.5, 5), stats.RollingQuantile(0.5, 15), stats.RollingQuantile(0.5, window),
            stats.RollingQuantile(0.5, 2 * window),
            utils.Rolling(stats.Mean, window_size=5), utils.Rolling(stats.Mean, window_size=15),
            stats.EWMean(0.05), stats.EWMean(0.1), stats.EWMean(0.3),
            stats.RollingMode(2 * window),
        )
        self._spread = stats.RollingPeakToPeak(window)
        # per context (run-length bucket): each expert's decayed absolute loss, and whether one arrived
        self._loss = [[stats.EWMean(1 - decay) for _ in EXPERTS] for _ in range(len(RUN_BUCKETS) + 1)]
        self._seen = [False] * (len(RUN_BUCKETS) + 1)
        self._weight = (1.0,) + (1.0 + prior,) * (len(EXPERTS) - 1)  # "last" is first
        self._lo = stats.RollingQuantile(alpha, interval_window)
        self._hi = stats.RollingQuantile(1 - alpha, interval_window)
        self.run = 0  # steps the value has not changed
        self.pending: deque[tuple[int, list[float], float, int]] = deque()
        self.errors: deque[float] = deque(maxlen=residuals)
        self.t = 0
        self.bounds = (lower_bound, upper_bound)

    def learn_one(self, y: float) -> None:
        """The value at the current step; resolves the forecasts made ``horizon`` steps ago."""
        y = float(y)
        while self.pending and self.pending[0][0] <= self.t:
            _, experts, chosen, context = self.pending.popleft()
            for loss, x in zip(self._loss[context], experts, strict=True):
                loss.update(abs(x - y))
            self._seen[context] = True
            error = y - chosen
            self.errors.append(error)
            self._lo.update(error)
            self._hi.update(error)
        self.run = self.run + 1 if y == self._last.get() else 0
        self._last.update(y)
        self._lag.update(y)
        self._spread.update(y)
        for s in self._stats:
            s.update(y)
        self.t += 1

    def _experts(self) -> list[float]:
        last = self._last.get()
        lag = self._lag.get()
        slope = (last - lag) / 9 if lag is not None else 0.0
        return [last, *(s.get() for s in self._stats), last + 0.5 * slope * self.horizon]

    def _context(self) -> int:
        context = 0
        for bound in RUN_BUCKETS:
            context += self.run >= bound
        return context

    def _clamp(self, x: float) -> float:
        lo, hi = self.bounds
        if lo is not None and x < lo:
            return lo
        if hi is not None and x > hi:
            return hi
        return x

    def _combine(self, experts: list[float], context: int) -> int:
        """Index of the experts' weighted median, weights falling exponentially with relative excess loss."""
        if not self._seen[context]:
            seen = [c for c, s in enumerate(self._seen) if s]
            if not seen:
                return 0  # no loss yet anywhere: the last value
            context = seen[-1]
        losses = [loss.get() * w for loss, w in zip(self._loss[context], self._weight, strict=True)]
        best = min(losses)
        scale = -self.eta / (best + 1e-12 * (abs(experts[0]) + 1.0))
        weights = [math.exp(scale * (loss - best)) for loss in losses]
        half = sum(weights) / 2
        acc = 0.0
        for i in sorted(range(len(experts)), key=experts.__getitem__):
            acc += weights[i]
            if acc >= half:
                return i
        return 0  # unreachable: the weights sum to more than half

    def forecast(self) -> Forecast:
        """The value ``horizon`` steps after the last learned one, with its interval."""
        if self._last.get() is None:
            raise ValueError("forecast() before any learn_one()")
        experts = self._experts()
        context = self._context()
        chosen = self._combine(experts, context)
        mean = self._clamp(experts[chosen])
        if len(self.errors) >= MIN_ERRORS:
            lo_q, hi_q = min(self._lo.get(), 0.0), max(self._hi.get(), 0.0)
        else:  # too few errors yet: a wide interval from the series' own spread
            spread = self._spread.get() or abs(mean) * 0.1 + 1.0
            lo_q, hi_q = -spread, spread
        self.pending.append((self.t - 1 + self.horizon, experts, mean, context))
        return Forecast(mean, self._clamp(mean + lo_q), self._clamp(mean + hi_q), EXPERTS[chosen])


def prequential(series: dict[str, np.ndarray], horizon: int = 5, warmup: int = 30, upper: float | None = None,
                **kwargs) -> dict:
    """Predict, then learn, over every series; errors of the model and of persistence (last value).

    Scored with River's ``metrics.MAE`` (imported here: ``river.metrics`` pulls in scipy, which the
    stream workers do not need). River's ``time_series.evaluate`` does not fit: it wants every step
    up to the horizon from one model and knows nothing of intervals.
    """
    import time

    from river import metrics

    model_mae, persistence_mae = metrics.MAE(), metrics.MAE()
    covered = n = updates = 0
    spent = 0.0
    for values in series.values():
        v = np.asarray(values, dtype=float).tolist()
        model = ExpertForecaster(horizon=horizon, upper_bound=upper, **kwargs)
        for t in range(len(v) - horizon):
            started = time.perf_counter()
            model.learn_one(v[t])
            f = model.forecast()
            spent += time.perf_counter() - started
            updates += 1
            if t >= warmup:
                target = v[t + horizon]
                model_mae.update(target, f.mean)
                persistence_mae.update(target, v[t])
                covered += f.lower <= target <= f.upper
                n += 1
    mae, persistence = model_mae.get(), persistence_mae.get()
    return {
        "series": len(series),
        "horizon": horizon,
        "points": n,
        "mae": round(mae, 4),
        "persistence_mae": round(persistence, 4),
        "ratio": round(mae / max(persistence, 1e-12), 4),
        "interval_coverage_80": round(covered / max(n, 1), 4),
        "us_per_update": round(1e6 * spent / max(updates, 1), 2),
    }
