"""Online per-series forecaster: River statistics as experts, combined by an exponentially weighted median.

The state about the series is River's:

- the experts are River statistics of the observed values: ``stats.Shift`` for the last value and
  the trend's lag, ``stats.RollingQuantile`` rolling medians, ``utils.Rolling(stats.Mean)``
  rolling means, ``stats.EWMean`` exponentially weighted means, and ``stats.RollingMode``, the most
  frequent exact value of the last hour: the plateau a memory series returns to after a dip. Each
  is a bounded statistic of observed values, so nothing can diverge. One set per series serves
  every horizon;
- the interval is split-conformal: ``stats.RollingQuantile`` of each horizon's last 30 signed errors.

Hand-written, because River has nothing equivalent or nothing as cheap:

- each expert's decayed absolute loss: River's ``stats.EWMean`` update on plain floats (one River
  object per expert, context and horizon was most of a GPU's objects; ``SeriesForecaster``);

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
from collections.abc import Iterable
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



def in_order_sum(values: Iterable[float]) -> float:
    """The values added one after the other, from 0.0: what ``sum`` gives on Python 3.11. From 3.12 ``sum`` compensates
    the rounding of floats (Neumaier), so it could differ in the last bit from the forecasters in numpy rows
    (``forecast_columns``), which add their columns in order."""
    total = 0.0
    for x in values:
        total += x
    return total

class _Horizon:
    """What the forecasts ``horizon`` steps ahead keep: each expert's decayed loss per context, the forecasts
    waiting for their step, and the last signed errors (the conformal interval's and the exported MAE's).

    ``abs_error`` is the errors' mean absolute value from a running sum: a worker's ``/metrics`` reads it for
    every GPU it holds, and summing 200 errors for each of 6 horizons of 50,000 GPUs was an eighth of the worker's
    time at that size (docs/performance.md). The sum is made again from the errors once per ``residuals`` errors,
    so what a float subtraction loses cannot pile up."""

    __slots__ = ("abs_sum", "chosen", "errors", "hi", "horizon", "lo", "loss", "pending", "seen", "since_summed")

    def __init__(self, horizon: int, alpha: float, residuals: int, interval_window: int):
        self.horizon = horizon
        self.loss = [[0.0] * len(EXPERTS) for _ in range(len(RUN_BUCKETS) + 1)]
        self.seen = [False] * (len(RUN_BUCKETS) + 1)
        self.lo = stats.RollingQuantile(alpha, interval_window)
        self.hi = stats.RollingQuantile(1 - alpha, interval_window)
        # (step it is for, the experts' values, the forecast, its context): tuples of numbers only, which the
        # cyclic collector stops tracking (an hour of forecasts waits at the 60-step horizon).
        self.pending: deque[tuple[int, tuple[float, ...], float, int]] = deque()
        self.errors: deque[float] = deque(maxlen=residuals)
        self.abs_sum = 0.0
        self.since_summed = 0
        self.chosen = 0  # the expert whose value the last forecast made is

    def add_error(self, error: float) -> None:
        errors = self.errors
        if errors and len(errors) == errors.maxlen:
            self.abs_sum -= abs(errors[0])
        errors.append(error)
        self.since_summed += 1
        if self.since_summed >= (errors.maxlen or 1):
            self.abs_sum, self.since_summed = in_order_sum(abs(e) for e in errors), 0
        else:
            self.abs_sum += abs(error)

    @property
    def abs_error(self) -> float | None:
        """Mean absolute error of the last errors (None before the first)."""
        return self.abs_sum / len(self.errors) if self.errors else None


class SeriesForecaster:
    """``learn_one(y)`` then ``forecast()``: the values ``horizons`` steps after the last learned one.

    As River's models do, only ``learn_one`` changes the state: it scores the forecasts made ``horizon`` steps
    earlier and makes (and queues for scoring) the forecasts from this step on, so every step is scored once
    whether ``forecast()``, a query, is called never, once or many times.

    The experts are statistics of the series, the same whatever the horizon, so one set serves every
    horizon; each horizon keeps what depends on it (its experts' losses, its pending forecasts, its
    interval). Forecasting three horizons here gives exactly what three single-horizon forecasters would
    (tests/stream/test_forecast.py) for a third of the experts' objects and updates.

    ``eta`` sets how fast an expert's weight falls with its excess loss, ``prior`` the handicap of
    every expert but the last value. Each horizon's ``errors`` keeps its last ``residuals`` signed errors,
    for the MAE the workers export.

    The interval's conformal quantiles come from the last ``interval_window`` errors only: errors
    come in bursts, and quantiles over a longer window keep a calm series' interval as wide as its
    last burst (over 200 errors the 80% interval covered 85% of the duty-cycle points). On
    independent noise, 30 errors' interpolated quantiles cover a little less than nominal (about
    74% in tests/stream/test_forecast.py); the finite-sample conformal ranks would fix that there
    and over-cover the real traces (87% of the duty-cycle points).

    The experts' decayed losses are plain floats, updated as River's ``stats.EWMean(1 - decay)`` updates
    (the first loss of a context taken as it is, then ``a * loss + (1 - a) * mean``: equal to the last bit,
    tests/stream/test_forecast.py), not one ``EWMean`` each: 36 per horizon were half a forecaster's
    objects, and a worker meeting 50,000 GPUs spent over half of its record handling building them and having
    the cyclic collector walk them (docs/performance.md).
    """

    def __init__(self, horizons: tuple[int, ...] = (5,), decay: float = 0.97, coverage: float = 0.8,
                 window: int = 30, residuals: int = 200, lower_bound: float | None = 0.0,
                 upper_bound: float | None = None, eta: float = 3.0, prior: float = 0.5, interval_window: int = 30):
        if not horizons or min(horizons) < 1 or len(set(horizons)) != len(horizons) \
                or not 0 < decay < 1 or not 0 < coverage < 1:
            raise ValueError("distinct horizons >= 1, 0 < decay < 1 and 0 < coverage < 1 are required")
        self.decay = decay
        self.coverage = coverage
        self.eta = eta
        self._fading = 1 - decay  # River's EWMean fading factor, as the losses were kept before
        self._keep = 1 - self._fading  # computed as River computes it, not as ``decay``: the same last bit
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
        self._weight = (1.0,) + (1.0 + prior,) * (len(EXPERTS) - 1)  # "last" is first
        self.horizons = {h: _Horizon(h, alpha, residuals, interval_window) for h in horizons}
        self.run = 0  # steps the value has not changed
        self.t = 0
        self.bounds = (lower_bound, upper_bound)

    def learn_one(self, y: float) -> None:
        """The value at the current step; resolves the forecasts made ``horizon`` steps ago."""
        y = float(y)
        fading, keep = self._fading, self._keep
        for h in self.horizons.values():
            pending = h.pending
            while pending and pending[0][0] <= self.t:
                _, experts, chosen, context = pending.popleft()
                loss = h.loss[context]
                if h.seen[context]:
                    for i, x in enumerate(experts):
                        loss[i] = fading * abs(x - y) + keep * loss[i]
                else:
                    for i, x in enumerate(experts):
                        loss[i] = abs(x - y)
                    h.seen[context] = True
                error = y - chosen
                h.add_error(error)
                h.lo.update(error)
                h.hi.update(error)
        self.run = self.run + 1 if y == self._last.get() else 0
        self._last.update(y)
        self._lag.update(y)
        self._spread.update(y)
        for s in self._stats:
            s.update(y)
        self.t += 1
        self._make_forecasts()

    def _make_forecasts(self) -> None:
        """Each horizon's forecast from this step: the experts' weighted median, queued to be scored by the value
        ``horizon`` steps later."""
        context = self._context()
        values = self._experts(self.horizons)
        for horizon, h in self.horizons.items():
            experts = values[horizon]
            h.chosen = self._combine(h, experts, context)
            h.pending.append((self.t - 1 + horizon, experts, self._clamp(experts[h.chosen]), context))

    def _experts(self, horizons: Iterable[int]) -> dict[int, tuple[float, ...]]:
        """Every expert's value per horizon: the statistics read once, the trend extrapolated per horizon."""
        last = self._last.get()
        lag = self._lag.get()
        slope = (last - lag) / 9 if lag is not None else 0.0
        base = (last, *(s.get() for s in self._stats))
        return {h: (*base, last + 0.5 * slope * h) for h in horizons}

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

    def _combine(self, h: _Horizon, experts: tuple[float, ...], context: int) -> int:
        """Index of the experts' weighted median, weights falling exponentially with relative excess loss."""
        if not h.seen[context]:
            seen = [c for c, s in enumerate(h.seen) if s]
            if not seen:
                return 0  # no loss yet anywhere: the last value
            context = seen[-1]
        losses = [loss * w for loss, w in zip(h.loss[context], self._weight, strict=True)]
        best = min(losses)
        scale = -self.eta / (best + 1e-12 * (abs(experts[0]) + 1.0))
        weights = [math.exp(scale * (loss - best)) for loss in losses]
        half = in_order_sum(weights) / 2
        acc = 0.0
        for i in sorted(range(len(experts)), key=experts.__getitem__):
            acc += weights[i]
            if acc >= half:
                return i
        return 0  # unreachable: the weights sum to more than half

    def forecast(self) -> dict[int, Forecast]:
        """Per horizon, the value that many steps after the last learned one, with its interval. A query: it reads
        the forecasts the last ``learn_one`` made and changes nothing."""
        if self._last.get() is None:
            raise ValueError("forecast() before any learn_one()")
        spread = self._spread.get()
        out = {}
        for horizon, h in self.horizons.items():
            mean = h.pending[-1][2]  # made by the last learn_one, the newest waiting to be scored
            if len(h.errors) >= MIN_ERRORS:
                lo_q, hi_q = min(h.lo.get(), 0.0), max(h.hi.get(), 0.0)
            else:  # too few errors yet: a wide interval from the series' own spread
                lo_q = -(spread or abs(mean) * 0.1 + 1.0)
                hi_q = -lo_q
            out[horizon] = Forecast(mean, self._clamp(mean + lo_q), self._clamp(mean + hi_q), EXPERTS[h.chosen])
        return out


class ExpertForecaster(SeriesForecaster):
    """A ``SeriesForecaster`` of one horizon: ``forecast()`` is that horizon's ``Forecast``."""

    def __init__(self, horizon: int = 5, **kwargs):
        super().__init__((horizon,), **kwargs)
        self.horizon = horizon

    @property
    def errors(self) -> deque[float]:
        return self.horizons[self.horizon].errors

    def forecast(self) -> Forecast:  # type: ignore[override]
        return super().forecast()[self.horizon]


def prequential(series: dict[str, np.ndarray], horizon: int = 5, warmup: int = 30, upper: float | None = None,
                columns: bool = False, **kwargs) -> dict:
    """Predict, then learn, over every series; errors of the model and of persistence (last value).

    ``columns``: the stream workers' forecaster, the same state in numpy rows
    (``gpuaware.stream.forecast_columns.ColumnForecaster``), rather than this module's River objects.

    Scored with River's ``metrics.MAE`` (imported here: ``river.metrics`` pulls in scipy, which the
    stream workers do not need). River's ``time_series.evaluate`` does not fit: it wants every step
    up to the horizon from one model and knows nothing of intervals.
    """
    import time

    from river import metrics

    model_mae, persistence_mae = metrics.MAE(), metrics.MAE()
    if columns:
        from gpuaware.stream.forecast_columns import ColumnForecaster, ForecastColumns

        rows = ForecastColumns((horizon,), **kwargs)
    covered = n = updates = 0
    spent = 0.0
    for values in series.values():
        v = np.asarray(values, dtype=float).tolist()
        model = ColumnForecaster(rows, upper_bound=upper) if columns else \
            ExpertForecaster(horizon=horizon, upper_bound=upper, **kwargs)
        for t in range(len(v) - horizon):
            started = time.perf_counter()
            model.learn_one(v[t])
            f = model.forecast()
            if columns:
                f = f[horizon]
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
