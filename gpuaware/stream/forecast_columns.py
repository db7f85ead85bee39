"""``SeriesForecaster``'s state in numpy rows, one row per series: the stream workers' forecasters.

``gpuaware.stream.forecast.SeriesForecaster`` keeps a series' state in River objects: ten statistics, two
quantiles, a queue of pending forecasts and a deque of errors per horizon. A worker holds two series per GPU, and
those objects (each with its own deque or sorted list, every float a boxed object) were most of what a worker held
per GPU (docs/stream.md, "Memory"). Here a series is a row of two arrays (``ForecastColumns``), and what the
River statistics keep is kept as the numbers they are computed from:

- the last ``2 * window`` values, oldest first: ``stats.Shift``, the ``stats.RollingQuantile`` medians and
  ``stats.RollingPeakToPeak`` are read from them (a sorted copy of the last k values, interpolated as River's
  quantile interpolates: ``rolling_quantile``), and ``stats.RollingMode``'s ties go to the value it has counted the
  longest, as its dict's insertion order does, so each value carries the step its count started at;
- ``utils.Rolling(stats.Mean)``'s count and mean, updated and reverted with River's formulas, and
  ``stats.EWMean``'s mean;
- per horizon, the experts' decayed losses and the last ``residuals`` signed errors (the exported mean absolute
  error's and, the last ``interval_window`` of them, the interval's);
- the forecasts waiting for their step: the experts' values of the last ``max(horizons)`` steps (one step's experts
  serve every horizon), but the last value and the trend (``last + slope * horizon / 2``), which with the step's
  context are read again from the values kept, and per horizon the forecast each of its last ``horizon`` steps made.

A row is two parts: the numbers a forecast is read from, in float64 (the head, the values, and per horizon the chosen
expert, the errors' absolute sum and the forecasts of its last steps), and the rest in float32 (``wide`` and
``narrow`` numbers): the steps the values' counts started at (whole numbers, exact in float32 below 2**24 minutes, 31
years), the pending experts' values, the decayed losses with their contexts' seen flags, and the signed errors. A row
is 2,812 bytes with the stream's parameters, where float64 throughout, the pending steps' last values, slopes and
contexts kept, took 5,200 (docs/stream.md, "Memory"). The values, the statistics and the experts of each forecast are
``SeriesForecaster``'s bit for bit; the experts but the last value and the trend are scored from their float32 values
(a relative error of at most 2**-24), and the kept losses and errors are float32, so a loss, an error or an interval
bound may differ from River's in its last digits: tests/stream/test_forecast_columns.py replays both on the same
series and holds those to 1e-6 of the series' scale and the forecast means equal (of experts equal in value, it may
name another); the held-out evaluation (``gpuaware eval forecast --split holdout --columns``) gives the River
forecaster's figures. An error is rounded to float32 when made, so a forecast read back from the row equals the one
``learn`` returned, and a row rebuilt from the same values (a restart) is the same row. Rows live in chunks of
``CHUNK`` rows, allocated as they are needed and never moved, so a growing worker never copies what it holds; the row
of a series dropped (``ColumnForecaster.__del__``: its GPU's tracker is gone) is reused.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter

import numpy as np

from gpuaware.stream.forecast import EXPERTS, MIN_ERRORS, RUN_BUCKETS, Forecast, in_order_sum

CHUNK = 1024
N_EXPERTS = len(EXPERTS)
N_CONTEXTS = len(RUN_BUCKETS) + 1
# A step's pending part: the experts but the last value and the trend, which with the step's context are read from the
# values kept (the same numbers: ``_made``)
STEP = N_EXPERTS - 2
RUN_MAX = max(RUN_BUCKETS)
LOSSES = N_CONTEXTS * N_EXPERTS
EW = (0.05, 0.1, 0.3)  # stats.EWMean fading factors, as in SeriesForecaster
# the row's head: t, run, lower bound, upper bound (NaN: none), the 5- and 15-step means' (count, mean), the EW means
T, RUN, LOWER, UPPER, MEAN5, MEAN15, EWMEANS = 0, 1, 2, 3, 4, 6, 8
HEAD = EWMEANS + len(EW)


def rolling_quantile(ordered: list[float], q: float, window: int) -> float:
    """What River's ``stats.RollingQuantile(q, window)`` returns over a window holding ``ordered`` (sorted): the
    interpolation of its Rust implementation (tests/stream/test_forecast_columns.py compares the two)."""
    n = len(ordered)
    idx = q * ((n if n < window else window) - 1)
    lo = int(idx)
    hi = min(lo + 1, n - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (idx - lo)


class ForecastColumns:
    """The rows of every series forecast with one set of ``SeriesForecaster``'s parameters (the bounds are per
    row)."""

    def __init__(self, horizons: tuple[int, ...] = (5,), decay: float = 0.97, coverage: float = 0.8,
                 window: int = 30, residuals: int = 200, eta: float = 3.0, prior: float = 0.5,
                 interval_window: int = 30):
        if not horizons or min(horizons) < 1 or len(set(horizons)) != len(horizons) \
                or not 0 < decay < 1 or not 0 < coverage < 1 or not 1 <= interval_window <= residuals:
            raise ValueError("distinct horizons >= 1, 0 < decay < 1, 0 < coverage < 1 and "
                             "1 <= interval_window <= residuals are required")
        self.horizons = tuple(horizons)
        self.window = window
        self.modal = 2 * window  # stats.RollingMode's window
        self.depth = max(self.horizons)  # steps whose experts wait to be scored
        # the longest statistic's window, and the oldest pending step's slope: the values kept
        self.span = max(self.modal, 15, 10, self.depth + 9)
        self.residuals = residuals
        self.interval_window = interval_window
        self.eta = eta
        self.fading = 1 - decay  # as SeriesForecaster computes them: the same last bit
        self.keep = 1 - self.fading
        self.alpha = (1 - coverage) / 2
        self.weight = (1.0,) + (1.0 + prior,) * (N_EXPERTS - 1)  # "last" is first
        # A row read as one list: its float64 part (``wide`` numbers), then its float32 part. Float64: the head, the
        # values oldest first (ending at ``values_end``), and per horizon the chosen expert, the errors' absolute sum
        # and the forecasts of its last ``horizon`` steps. Float32: the steps the values' counts started at (ending at
        # ``steps_end``), the pending steps' experts, and per horizon the losses per context, seen per context and
        # the errors. ``parts``: per horizon, where in that list its losses, seen flags, errors, chosen expert, sum
        # and forecasts start.
        self.values_end = HEAD + self.span
        wide = self.values_end + sum(2 + h for h in self.horizons)
        self.wide = wide
        self.steps_end = wide + self.span
        self.pending = self.steps_end
        narrow = self.pending + self.depth * STEP
        self.parts: list[tuple[int, int, int, int, int, int]] = []
        offset = self.values_end
        for h in self.horizons:
            self.parts.append((narrow, narrow + LOSSES, narrow + LOSSES + N_CONTEXTS, offset, offset + 1, offset + 2))
            narrow += LOSSES + N_CONTEXTS + residuals
            offset += 2 + h
        self.narrow = narrow - wide
        # From this many values learned on, ``learn`` takes the same branches whatever the count: the values, the
        # errors and the pending forecasts are full (``learn_many`` learns such rows together).
        self.mature = max(self.span, self.residuals + self.depth, MIN_ERRORS + self.depth, self.window)
        self.chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self.free: list[int] = []
        self.used = 0

    @property
    def row_bytes(self) -> int:
        return self.wide * 8 + self.narrow * 4

    # ------------------------------------------------------------------ rows

    def new(self, lower: float | None = 0.0, upper: float | None = None) -> int:
        """A fresh series' row."""
        if self.free:
            slot = self.free.pop()
        else:
            slot = self.used
            self.used += 1
            if slot >= len(self.chunks) * CHUNK:
                self.chunks.append((np.zeros((CHUNK, self.wide)), np.zeros((CHUNK, self.narrow), np.float32)))
        row, narrow = self._rows(slot)
        row[:] = 0.0
        narrow[:] = 0.0
        row[LOWER] = math.nan if lower is None else lower
        row[UPPER] = math.nan if upper is None else upper
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def _rows(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """The row's float64 and float32 parts."""
        wide, narrow = self.chunks[slot // CHUNK]
        return wide[slot % CHUNK], narrow[slot % CHUNK]

    def _list(self, slot: int) -> list[float]:
        wide, narrow = self._rows(slot)
        return wide.tolist() + narrow.tolist()

    def held(self) -> int:
        """Rows in use."""
        return self.used - len(self.free)

    # ------------------------------------------------------------------ learning

    def learn(self, slot: int, y: float, forecast: bool = False) -> dict[int, Forecast] | None:
        """``SeriesForecaster.learn_one`` on the row: the forecasts due now scored, the statistics updated, the next
        forecasts made; with ``forecast``, what ``forecast`` returns after it. The row is read into a list once and
        written back once (through an ``array``, a copy of its buffer): numpy's per-element access costs more than the
        arithmetic."""
        y = float(y)
        arr, narrow = self._rows(slot)
        r = arr.tolist() + narrow.tolist()
        t = int(r[T])
        span = self.span
        n = min(t, span)
        values = r[self.values_end - n:self.values_end]
        steps = r[self.steps_end - n:self.steps_end]
        fading, keep = self.fading, self.keep
        for h, (loss_at, seen_at, errors_at, _, total_at, made_at) in zip(self.horizons, self.parts,
                                                                            strict=True):
            if t < h:
                continue
            # the forecast made ``h`` steps ago: its step's experts and the trend for this horizon
            experts, context = self._made(r, values, t - h, h)
            chosen = r[made_at + t % h]
            loss = loss_at + context * N_EXPERTS
            seen = seen_at + context
            if r[seen]:
                r[loss:loss + N_EXPERTS] = [fading * abs(x - y) + keep * kept
                                            for x, kept in zip(experts, r[loss:loss + N_EXPERTS], strict=True)]
            else:
                r[loss:loss + N_EXPERTS] = [abs(x - y) for x in experts]
                r[seen] = 1.0
            # rounded as the row keeps it: the running sum and this step's interval see what is kept
            self._add_error(r, errors_at, total_at, t - h, array("f", (y - chosen,))[0])
        # the statistics, updated as River updates them
        r[RUN] = r[RUN] + 1 if n and y == values[-1] else 0.0
        for at, k in ((MEAN5, 5), (MEAN15, 15)):  # utils.Rolling(stats.Mean, k): the oldest reverted first
            count, mean = r[at], r[at + 1]
            if n >= k:
                count -= 1.0
                mean = 0.0 if count == 0 else mean - (1.0 / count) * (values[-k] - mean)
            count += 1.0
            r[at], r[at + 1] = count, mean + (1.0 / count) * (y - mean)
        for i, f in enumerate(EW):
            r[EWMEANS + i] = y if t == 0 else f * y + (1 - f) * r[EWMEANS + i]
        # stats.RollingMode: a value still in its window once the oldest left keeps the step its count started at
        if n == span:
            values, steps = values[1:], steps[1:]
        kept = self.modal - 1
        try:
            started = steps[len(values) - min(len(values), kept) + values[-kept:].index(y)] if kept else float(t)
        except ValueError:
            started = float(t)
        values.append(y)
        steps.append(started)
        n = len(values)
        r[self.values_end - n:self.values_end] = values
        r[self.steps_end - n:self.steps_end] = steps
        t += 1
        r[T] = float(t)
        self._make_forecasts(r, t, values, steps)
        wide = self.wide
        arr[:] = array("d", r[:wide])
        narrow[:] = array("f", r[wide:])
        return self._forecast(r) if forecast else None

    def _add_error(self, r: list[float], first: int, total: int, made: int, error: float) -> None:
        """``_Horizon.add_error``: the errors oldest first from ``first``, their absolute sum at ``total`` kept running
        and made again once per ``residuals`` errors (``made``: the errors before this one)."""
        residuals = self.residuals
        if made >= residuals:
            r[total] -= abs(r[first])
            r[first:first + residuals - 1] = r[first + 1:first + residuals]
            r[first + residuals - 1] = error
        else:
            r[first + made] = error
        if (made + 1) % residuals == 0:
            kept = min(made + 1, residuals)
            r[total] = in_order_sum(abs(e) for e in r[first:first + kept])
        else:
            r[total] += abs(error)

    def _make_forecasts(self, r: list[float], t: int, values: list[float], steps: list[float]) -> None:
        """Each horizon's forecast from this step: the experts' weighted median."""
        context = 0
        for bound in RUN_BUCKETS:
            context += r[RUN] >= bound
        last = values[-1]
        slope = (last - values[-10]) / 9 if len(values) >= 10 else 0.0  # stats.Shift(9)
        base = [last]
        for k in (5, 15, self.window, self.modal):
            base.append(rolling_quantile(sorted(values[-k:]), 0.5, k))
        base += (r[MEAN5 + 1], r[MEAN15 + 1], *r[EWMEANS:EWMEANS + len(EW)],
                 self._mode(values[-self.modal:], steps[-self.modal:]))
        at = self.pending + (t - 1) % self.depth * STEP
        r[at:at + STEP] = base[1:]
        lower, upper = r[LOWER], r[UPPER]
        for h, (loss_at, seen_at, _, chosen_at, _, made_at) in zip(self.horizons, self.parts, strict=True):
            experts = [*base, last + 0.5 * slope * h]
            chosen = self._combine(r, loss_at, seen_at, experts, context)
            r[chosen_at] = float(chosen)
            x = experts[chosen]
            if x < lower:  # (a NaN bound, none, compares False)
                x = lower
            elif x > upper:
                x = upper
            r[made_at + (t - 1) % h] = x

    def _made(self, r: list[float], values: list[float], step: int, h: int) -> tuple[list[float], int]:
        """The experts of the forecast made at ``step``, ``h`` steps before the newest value in ``values``, and its
        context: the last value, the trend's slope and the run are what ``_make_forecasts`` read then, from values
        still kept (``span`` covers them)."""
        i = len(values) - h  # that step's value
        last = values[i]
        slope = (last - values[i - 9]) / 9 if step >= 9 else 0.0
        run = 0
        while run < RUN_MAX and run < i and values[i - run - 1] == values[i - run]:
            run += 1
        context = 0
        for bound in RUN_BUCKETS:
            context += run >= bound
        at = self.pending + step % self.depth * STEP
        return [last, *r[at:at + STEP], last + 0.5 * slope * h], context

    @staticmethod
    def _mode(values: list[float], steps: list[float]) -> float:
        counts = Counter(values)
        most = max(counts.values())
        tied = [v for v, c in counts.items() if c == most]
        if len(tied) == 1:
            return tied[0]
        started = dict(zip(values, steps, strict=True))
        return min(tied, key=started.__getitem__)

    def _combine(self, r: list[float], loss_at: int, seen_at: int, experts: list[float], context: int) -> int:
        """``SeriesForecaster._combine``: the index of the experts' weighted median."""
        if not r[seen_at + context]:
            seen = [c for c in range(N_CONTEXTS) if r[seen_at + c]]
            if not seen:
                return 0  # no loss yet anywhere: the last value
            context = seen[-1]
        at = loss_at + context * N_EXPERTS
        losses = [loss * w for loss, w in zip(r[at:at + N_EXPERTS], self.weight, strict=True)]
        best = min(losses)
        scale = -self.eta / (best + 1e-12 * (abs(experts[0]) + 1.0))
        weights = [math.exp(scale * (loss - best)) for loss in losses]
        half = in_order_sum(weights) / 2
        acc = 0.0
        for i in sorted(range(N_EXPERTS), key=experts.__getitem__):
            acc += weights[i]
            if acc >= half:
                return i
        return 0  # unreachable: the weights sum to more than half

    # ------------------------------------------------------------------ reading

    def forecast(self, slot: int) -> dict[int, Forecast]:
        """``SeriesForecaster.forecast``: per horizon, the value that many steps after the last learned one."""
        return self._forecast(self._list(slot))

    def _forecast(self, r: list[float]) -> dict[int, Forecast]:
        t = int(r[T])
        if not t:
            raise ValueError("forecast() before any learn_one()")
        n = min(t, self.window)
        recent = r[self.values_end - n:self.values_end]
        spread = max(recent) - min(recent)  # stats.RollingPeakToPeak(window)
        lower, upper = r[LOWER], r[UPPER]
        out = {}
        for h, (_, _, first, chosen_at, _, made_at) in zip(self.horizons, self.parts, strict=True):
            mean = r[made_at + (t - 1) % h]
            kept = min(max(t - h, 0), self.residuals)
            if kept >= MIN_ERRORS:
                errors = sorted(r[first + kept - min(kept, self.interval_window):first + kept])
                lo_q = min(rolling_quantile(errors, self.alpha, self.interval_window), 0.0)
                hi_q = max(rolling_quantile(errors, 1 - self.alpha, self.interval_window), 0.0)
            else:  # too few errors yet: a wide interval from the series' own spread
                lo_q = -(spread or abs(mean) * 0.1 + 1.0)
                hi_q = -lo_q
            out[h] = Forecast(mean, _clamp(mean + lo_q, lower, upper), _clamp(mean + hi_q, lower, upper),
                              EXPERTS[int(r[chosen_at])])
        return out

    def values(self, slot: int, n: int) -> list[float]:
        """The last ``n`` values learned (at most ``span``), oldest first."""
        r = self._rows(slot)[0]
        n = min(n, int(r[T]), self.span)
        return r[self.values_end - n:self.values_end].tolist() if n else []

    def errors(self, slot: int, horizon: int) -> list[float]:
        """The horizon's kept signed errors, oldest first."""
        wide, narrow = self._rows(slot)
        first = self.parts[self.horizons.index(horizon)][2] - self.wide
        return narrow[first:first + min(max(int(wide[T]) - horizon, 0), self.residuals)].tolist()

    def abs_errors(self, slot: int) -> dict[int, float]:
        """Per horizon with errors, the mean absolute value of its kept errors (``_Horizon.abs_error``)."""
        r = self._rows(slot)[0]
        t = int(r[T])
        out = {}
        for h, part in zip(self.horizons, self.parts, strict=True):
            kept = min(t - h, self.residuals)
            if kept > 0:
                out[h] = float(r[part[4]]) / kept
        return out

    def losses(self, slot: int, horizon: int) -> list[list[float]]:
        """The horizon's experts' decayed losses per context (0 where a context was never seen)."""
        at = self.parts[self.horizons.index(horizon)][0] - self.wide
        return self._rows(slot)[1][at:at + LOSSES].reshape(N_CONTEXTS, N_EXPERTS).tolist()


def _clamp(x: float, lower: float, upper: float) -> float:
    if x < lower:
        return lower
    if x > upper:
        return upper
    return x


class ColumnForecaster:
    """One series' row in ``columns``, with ``SeriesForecaster``'s ``learn_one`` and ``forecast``; the row is freed
    with this object."""

    __slots__ = ("columns", "slot")

    def __init__(self, columns: ForecastColumns, lower_bound: float | None = 0.0, upper_bound: float | None = None):
        self.columns = columns
        self.slot = columns.new(lower_bound, upper_bound)

    def learn_one(self, y: float) -> None:
        self.columns.learn(self.slot, y)

    def learn_forecast(self, y: float) -> dict[int, Forecast]:
        """``learn_one`` then ``forecast``, at the cost of one."""
        return self.columns.learn(self.slot, y, forecast=True)  # type: ignore[return-value]

    def forecast(self) -> dict[int, Forecast]:
        return self.columns.forecast(self.slot)

    def abs_errors(self) -> dict[int, float]:
        return self.columns.abs_errors(self.slot)

    def values(self, n: int) -> list[float]:
        return self.columns.values(self.slot, n)

    def __del__(self) -> None:
        self.columns.release(self.slot)
