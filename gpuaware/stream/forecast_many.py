"""The stream workers' forecasters learning many rows at once: the minutes a take closes (``ClosedMinutes``), learned
together when it is finished (``learn_many``: numpy operations over the rows of ``ForecastColumns``).

``ForecastColumns.learn`` branches on how many values a row has learned (``t``) only until ``mature`` (its windows,
errors and pending forecasts full); past it, ``t`` only picks places in the rows' rings, per row. So the mature rows
are learned together, and the young ones group by group of one ``t``; a group of fewer than ``MANY_MIN`` rows goes
through ``learn``. The rows end as ``learn`` leaves them, bit for bit, and so do the forecasts
(tests/stream/test_forecast_many.py): the same operations in the same order on the same doubles, sums and cumulative
sums taken in order (``in_order_sum``), and ``math.exp``, not ``np.exp``, whose last bit may differ. At 250 rows,
11.5-22.4 CPU µs a row against 60-83 one at a time (``python -m gpuaware.bench.forecast_rows``).
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gpuaware.stream.forecast import MIN_ERRORS, RUN_BUCKETS
from gpuaware.stream.forecast_columns import (
    CHUNK,
    EW,
    EWMEANS,
    LOWER,
    MEAN5,
    MEAN15,
    N_CONTEXTS,
    N_EXPERTS,
    RUN,
    RUN_MAX,
    STEP,
    UPPER,
    ForecastColumns,
    T,
)

if TYPE_CHECKING:
    from gpuaware.stream.gpu_state import GpuTracker

# Fewer rows than this at one step are learned one by one (numpy's cost per call is above theirs).
MANY_MIN = 4
METRICS = ("util_gpu", "fb_used_mib")  # a GPU's forecasters, in the order its forecasts are packed


@functools.cache
def labels(horizons_min: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    """(metric, horizon in seconds) of each forecast, in the order ``packed_forecasts`` keeps them: made once per set
    of horizons, so every GPU's forecasts share one object per horizon (``minutes * 60`` made one per forecast,
    above the small integers Python shares) and a state's forecasts take no lookups."""
    return tuple((metric, h * 60) for metric in METRICS for h in horizons_min)


@functools.cache
def label_columns(horizons_min: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``labels`` as two columns, (the metrics, the horizons in seconds): what ``GpuTracker.forecasts`` maps
    ``Forecast`` over with the numbers' columns."""
    pairs = labels(horizons_min)
    return tuple(m for m, _ in pairs), tuple(s for _, s in pairs)


def check_packed(packed: bytes, forecasts: int) -> None:
    """ValueError unless ``packed`` holds three doubles (mean, lower, upper) for each of ``forecasts``."""
    if len(packed) != 24 * forecasts:
        raise ValueError(f"{len(packed) // 8} packed forecast numbers for {forecasts} forecasts")


@functools.cache
def unpack(count: int) -> Callable[[bytes], tuple[float, ...]]:
    """Unpacks ``count`` packed doubles (one ``struct`` format per length, compiled once)."""
    return struct.Struct(f"<{count}d").unpack_from


class ClosedMinutes:
    """The minutes GPUs closed in one take, learned together (``learn``): their forecasters' rows through
    ``ForecastColumns.learn_many``, at a quarter to a fifth of the cost of a row at a time (a worker closes ~250 rows
    a take at 50,000 GPUs; ``python -m gpuaware.bench.forecast_rows``). A tracker given one (``GpuTracker.closed``)
    leaves its closed minutes there; what reads its forecasts or history learns them first (``GpuTracker.settle``),
    and the processor learns them before it writes or publishes a take, and before it drops trackers."""

    __slots__ = ("trackers",)

    def __init__(self) -> None:
        self.trackers: list[GpuTracker] = []

    def learn(self) -> None:
        """Learn every minute waiting; if that raises, the trackers not learned yet stay waiting here."""
        waiting, self.trackers = self.trackers, []
        by_columns: dict[int, list[GpuTracker]] = {}
        for t in waiting:
            by_columns.setdefault(id(t._forecasters["util_gpu"].columns), []).append(t)
        try:
            for group in by_columns.values():
                self._learn(group)
        except BaseException:
            self.trackers = [t for t in waiting if t.waiting is not None] + self.trackers
            raise

    @staticmethod
    def _learn(group: list[GpuTracker]) -> None:
        """One ``ForecastColumns``' trackers: their rows learned in one ``learn_many``, then their forecasts packed."""
        slots, ys = [], []
        for t in group:  # a GPU's rows in the order its forecasts are packed: METRICS'
            models = t._forecasters
            slots += [models[metric].slot for metric in METRICS]
            ys += t.waiting
        columns = group[0]._forecasters["util_gpu"].columns
        numbers = learn_many(columns, slots, ys).reshape(len(group), -1).tolist()
        pack = _pack(len(numbers[0]))
        for t, row in zip(group, numbers, strict=True):
            t.waiting = None
            t._packed = pack(*[round(x, 2) for x in row])


@functools.cache
def _pack(count: int) -> Callable[..., bytes]:
    return struct.Struct(f"<{count}d").pack


def learn_many(c: ForecastColumns, slots: list[int], ys: list[float]) -> np.ndarray:
    """``learn(slot, y, forecast=True)`` for each row, as numpy operations over the rows: what a worker does with
    the minutes its GPUs closed in one take (at 50,000 GPUs, ~250 rows a take, and one ``learn`` took ~80 µs,
    ~20 % of the worker's logic). ``learn`` branches on how many values a row has learned (``t``) only until
    ``mature`` (its windows, errors and pending forecasts full); past it, ``t`` only picks places in the rows'
    rings, per row. So the mature rows are learned together, and the young ones group by group of one ``t``; a
    group of fewer than ``MANY_MIN`` rows goes through ``learn``. The rows end as ``learn`` leaves them, bit for
    bit, and so do the forecasts (tests/stream/test_forecast_columns.py): the same operations in the same order on
    the same doubles, sums and cumulative sums taken in order (``in_order_sum``), and ``math.exp``, not ``np.exp``,
    whose last bit may differ. Returns each row's forecasts, an array of (rows, horizons, 3): mean, lower, upper."""
    if len(set(slots)) != len(slots):
        raise ValueError("learn_many: a row may be learned once per call (learn its values one call at a time)")
    out = np.empty((len(slots), len(c.horizons), 3))
    groups: dict[int, list[int]] = {}
    mature = c.mature
    for i, slot in enumerate(slots):
        t = int(c._rows(slot)[0][T])
        groups.setdefault(t if t < mature else mature, []).append(i)
    for t, members in groups.items():
        if len(members) < MANY_MIN:
            for i in members:
                forecasts = c.learn(slots[i], ys[i], forecast=True)
                out[i] = [(f.mean, f.lower, f.upper) for f in forecasts.values()]
            continue
        chosen = np.asarray([slots[i] for i in members])
        rows = _gather(c, chosen)
        y = np.asarray([float(ys[i]) for i in members])
        ts = rows[:, T].astype(np.int64)
        _learn_rows(c, rows, t, ts, y)
        out[members] = _forecast_rows(c, rows, t + 1, ts + 1)
        _scatter(c, chosen, rows)
    return out


def _gather(c: ForecastColumns, slots: np.ndarray) -> np.ndarray:
    """The rows as one float64 matrix laid out as ``learn``'s list: the float64 part, then the float32 part."""
    rows = np.empty((len(slots), c.wide + c.narrow))
    chunk = slots // CHUNK
    for k in np.unique(chunk).tolist():
        mine = chunk == k
        wide, narrow = c.chunks[k]
        at = slots[mine] % CHUNK
        rows[mine, :c.wide] = wide[at]
        rows[mine, c.wide:] = narrow[at]
    return rows


def _scatter(c: ForecastColumns, slots: np.ndarray, rows: np.ndarray) -> None:
    chunk = slots // CHUNK
    for k in np.unique(chunk).tolist():
        mine = chunk == k
        wide, narrow = c.chunks[k]
        at = slots[mine] % CHUNK
        wide[at] = rows[mine, :c.wide]
        narrow[at] = rows[mine, c.wide:]  # rounded to float32 as ``array("f", ...)`` rounds


def _learn_rows(c: ForecastColumns, r: np.ndarray, t: int, ts: np.ndarray, y: np.ndarray) -> None:
    """``learn`` on rows that take the same branches (``r``: ``_gather``'s matrix, changed in place): ``t`` is a
    value of ``t`` that takes them, ``ts`` each row's own, which picks its places in the rings."""
    span = c.span
    n = min(t, span)
    values = r[:, c.values_end - n:c.values_end].copy()
    steps = r[:, c.steps_end - n:c.steps_end].copy()
    every = np.arange(len(r))
    for h, (loss_at, seen_at, errors_at, _, total_at, made_at) in zip(c.horizons, c.parts, strict=True):
        if t < h:
            continue
        experts, context = _made_rows(c, r, values, t - h, ts - h, h)
        chosen = r[every, made_at + ts % h]
        loss = (loss_at + context * N_EXPERTS)[:, None] + np.arange(N_EXPERTS)
        seen = seen_at + context
        was_seen = r[every, seen] != 0
        kept = r[every[:, None], loss]
        error = np.abs(experts - y[:, None])
        r[every[:, None], loss] = np.where(was_seen[:, None], c.fading * error + c.keep * kept, error)
        r[every, seen] = 1.0
        _add_errors(c, r, errors_at, total_at, t - h, ts - h,
                         (y - chosen).astype(np.float32).astype(np.float64))
    r[:, RUN] = np.where(y == values[:, -1], r[:, RUN] + 1, 0.0) if n else 0.0
    for at, k in ((MEAN5, 5), (MEAN15, 15)):
        count, mean = r[:, at].copy(), r[:, at + 1].copy()
        if n >= k:
            count -= 1.0
            with np.errstate(divide="ignore", invalid="ignore"):
                mean = np.where(count == 0, 0.0, mean - (1.0 / count) * (values[:, -k] - mean))
        count += 1.0
        r[:, at], r[:, at + 1] = count, mean + (1.0 / count) * (y - mean)
    for i, f in enumerate(EW):
        r[:, EWMEANS + i] = y if t == 0 else f * y + (1 - f) * r[:, EWMEANS + i]
    if n == span:
        values, steps = values[:, 1:], steps[:, 1:]
    kept_n = min(values.shape[1], c.modal - 1)
    if kept_n:
        match = values[:, -kept_n:] == y[:, None]
        first = values.shape[1] - kept_n + match.argmax(axis=1)
        started = np.where(match.any(axis=1), steps[every, first], ts.astype(np.float64))
    else:
        started = ts.astype(np.float64)
    values = np.concatenate([values, y[:, None]], axis=1)
    steps = np.concatenate([steps, started[:, None]], axis=1)
    n = values.shape[1]
    r[:, c.values_end - n:c.values_end] = values
    r[:, c.steps_end - n:c.steps_end] = steps
    r[:, T] = ts + 1.0
    _make_forecast_rows(c, r, ts + 1, values, steps)


def _add_errors(c: ForecastColumns, r: np.ndarray, first: int, total: int, made: int, made_each: np.ndarray,
                error: np.ndarray) -> None:
    """``_add_error`` on rows that take the same branches as a row that has made ``made`` errors (``made_each``:
    each row's count)."""
    residuals = c.residuals
    every = np.arange(len(r))
    if made >= residuals:
        r[:, total] -= np.abs(r[:, first])
        r[:, first:first + residuals - 1] = r[:, first + 1:first + residuals].copy()
        r[:, first + residuals - 1] = error
    else:
        r[every, first + made_each] = error
    again = (made_each + 1) % residuals == 0
    r[:, total] += np.where(again, 0.0, np.abs(error))  # (x + 0.0 is x: the rows made again are overwritten)
    if again.any():
        # ``in_order_sum``: the columns one after the other (np.sum would pair them up)
        rows = np.flatnonzero(again)
        kept = np.abs(r[rows, first:first + min(made + 1, residuals)])
        acc = np.zeros(len(rows))
        for j in range(kept.shape[1]):
            acc += kept[:, j]
        r[rows, total] = acc


def _made_rows(c: ForecastColumns, r: np.ndarray, values: np.ndarray, step: int, steps: np.ndarray,
               h: int) -> tuple[np.ndarray, np.ndarray]:
    """``_made`` on rows: the experts of the forecasts made ``h`` steps before their newest value, (rows, experts),
    and their contexts (``step``: a step that takes the rows' branches, ``steps`` each row's)."""
    i = values.shape[1] - h
    last = values[:, i]
    slope = (last - values[:, i - 9]) / 9 if step >= 9 else np.zeros(len(r))
    run = np.zeros(len(r), dtype=np.int64)
    going = np.ones(len(r), dtype=bool)
    for k in range(min(RUN_MAX, i)):  # the value's run, as far as RUN_MAX
        going &= values[:, i - k - 1] == values[:, i - k]
        run += going
    context = np.zeros(len(r), dtype=np.int64)
    for bound in RUN_BUCKETS:
        context += run >= bound
    at = c.pending + steps % c.depth * STEP
    pending = r[np.arange(len(r))[:, None], at[:, None] + np.arange(STEP)]
    experts = np.concatenate([last[:, None], pending, (last + 0.5 * slope * h)[:, None]], axis=1)
    return experts, context


def _make_forecast_rows(c: ForecastColumns, r: np.ndarray, ts: np.ndarray, values: np.ndarray,
                        steps: np.ndarray) -> None:
    """``_make_forecasts`` on rows (``ts``: each row's ``t``)."""
    context = np.zeros(len(r), dtype=np.int64)
    for bound in RUN_BUCKETS:
        context += r[:, RUN] >= bound
    last = values[:, -1]
    slope = (last - values[:, -10]) / 9 if values.shape[1] >= 10 else np.zeros(len(r))
    base = [last]
    for k in (5, 15, c.window, c.modal):
        base.append(_rolling_quantile_rows(np.sort(values[:, -k:], axis=1), 0.5, k))
    base += [r[:, MEAN5 + 1], r[:, MEAN15 + 1], *(r[:, EWMEANS + i] for i in range(len(EW))),
             _mode_rows(values[:, -c.modal:], steps[:, -c.modal:])]
    base = np.stack(base, axis=1)
    every = np.arange(len(r))
    at = c.pending + (ts - 1) % c.depth * STEP
    r[every[:, None], at[:, None] + np.arange(STEP)] = base[:, 1:]
    lower, upper = r[:, LOWER], r[:, UPPER]
    for h, (loss_at, seen_at, _, chosen_at, _, made_at) in zip(c.horizons, c.parts, strict=True):
        experts = np.concatenate([base, (last + 0.5 * slope * h)[:, None]], axis=1)
        chosen = _combine_rows(c, r, loss_at, seen_at, experts, context)
        r[:, chosen_at] = chosen
        r[every, made_at + (ts - 1) % h] = _clamp_rows(experts[every, chosen], lower, upper)


def _combine_rows(c: ForecastColumns, r: np.ndarray, loss_at: int, seen_at: int, experts: np.ndarray,
                  context: np.ndarray) -> np.ndarray:
    """``_combine`` on rows: each row's index of the experts' weighted median."""
    every = np.arange(len(r))
    seen = r[:, seen_at:seen_at + N_CONTEXTS] != 0
    # a context never seen reads the last one seen; none seen: the last value (expert 0)
    context = np.where(seen[every, context], context, N_CONTEXTS - 1 - seen[:, ::-1].argmax(axis=1))
    at = (loss_at + context * N_EXPERTS)[:, None] + np.arange(N_EXPERTS)
    losses = r[every[:, None], at] * np.asarray(c.weight)
    best = losses.min(axis=1)
    scale = -c.eta / (best + 1e-12 * (np.abs(experts[:, 0]) + 1.0))
    weights = np.asarray(list(map(math.exp, (scale[:, None] * (losses - best[:, None])).ravel().tolist())))
    weights = weights.reshape(losses.shape)
    half = np.zeros(len(r))
    for j in range(N_EXPERTS):  # ``in_order_sum``
        half += weights[:, j]
    half /= 2
    order = np.argsort(experts, axis=1, kind="stable")  # ``sorted``: ties in index order
    acc = np.cumsum(weights[every[:, None], order], axis=1)
    chosen = order[every, (acc >= half[:, None]).argmax(axis=1)]
    return np.where(seen.any(axis=1), chosen, 0)


def _forecast_rows(c: ForecastColumns, r: np.ndarray, t: int, ts: np.ndarray) -> np.ndarray:
    """``_forecast`` on rows that take the branches of a row that has learned ``t`` values (``ts``: each row's
    count): (rows, horizons, 3), mean, lower, upper."""
    n = min(t, c.window)
    recent = r[:, c.values_end - n:c.values_end]
    spread = recent.max(axis=1) - recent.min(axis=1)
    lower, upper = r[:, LOWER], r[:, UPPER]
    every = np.arange(len(r))
    out = np.empty((len(r), len(c.horizons), 3))
    for j, (h, (_, _, first, _, _, made_at)) in enumerate(zip(c.horizons, c.parts, strict=True)):
        mean = r[every, made_at + (ts - 1) % h]
        kept = min(max(t - h, 0), c.residuals)
        if kept >= MIN_ERRORS:
            errors = np.sort(r[:, first + kept - min(kept, c.interval_window):first + kept], axis=1)
            lo_q = _rolling_quantile_rows(errors, c.alpha, c.interval_window)
            hi_q = _rolling_quantile_rows(errors, 1 - c.alpha, c.interval_window)
            lo_q = np.where(lo_q > 0.0, 0.0, lo_q)  # min(lo_q, 0.0), which keeps lo_q on a tie
            hi_q = np.where(hi_q < 0.0, 0.0, hi_q)
        else:
            lo_q = -np.where(spread != 0, spread, np.abs(mean) * 0.1 + 1.0)
            hi_q = -lo_q
        out[:, j, 0] = mean
        out[:, j, 1] = _clamp_rows(mean + lo_q, lower, upper)
        out[:, j, 2] = _clamp_rows(mean + hi_q, lower, upper)
    return out


def _rolling_quantile_rows(ordered: np.ndarray, q: float, window: int) -> np.ndarray:
    """``rolling_quantile`` of each row of ``ordered`` (each sorted)."""
    n = ordered.shape[1]
    idx = q * ((n if n < window else window) - 1)
    lo = int(idx)
    hi = min(lo + 1, n - 1)
    return ordered[:, lo] + (ordered[:, hi] - ordered[:, lo]) * (idx - lo)


def _mode_rows(values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``_mode`` of each row: of the values counted most, the one whose count started first (a value's step is that
    of its last place, as ``dict(zip(values, steps))`` keeps it; distinct values never share one). Each row sorted,
    stably: a value's places are one run, in their order, and its count is the run's length."""
    order = np.argsort(values, axis=1, kind="stable")
    ordered = np.take_along_axis(values, order, axis=1)
    width = ordered.shape[1]
    place = np.arange(width)
    starts = np.ones(ordered.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    ends = np.ones(ordered.shape, dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, place, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, place, width)[:, ::-1], axis=1)[:, ::-1]
    counts = last - first + 1
    started = np.take_along_axis(steps, np.take_along_axis(order, last, axis=1), axis=1)
    started = np.where(counts == counts.max(axis=1)[:, None], started, np.inf)
    # the run's first place: the value as its first place holds it (Counter's key)
    return ordered[np.arange(len(values)), first[np.arange(len(values)), started.argmin(axis=1)]]


def _clamp_rows(x: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``_clamp`` per row (a NaN bound, none, compares False)."""
    return np.where(x < lower, lower, np.where(x > upper, upper, x))


