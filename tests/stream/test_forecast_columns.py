"""The forecasters in numpy rows against ``SeriesForecaster`` (River's statistics), on the same series: the same
forecast means bit for bit (from the same expert, or one of equal value); the intervals, losses and errors, which the
rows keep or score in float32, within 1e-6 of the series' scale (gpuaware.stream.forecast_columns)."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest
from river import stats

from gpuaware.stream.forecast import SeriesForecaster
from gpuaware.stream.forecast_columns import CHUNK, UPPER, ColumnForecaster, ForecastColumns, rolling_quantile


def _series(seed: int, n: int = 500) -> list[list[float]]:
    """A noisy level, a memory-like plateau with dips and returns, and a few values repeated (modes with ties)."""
    rng = np.random.default_rng(seed)
    noisy = (50 + 20 * np.sin(np.arange(n) / 40) + rng.normal(0, 8, n)).clip(0, 100)
    plateau = np.full(n, 30e3)
    for start in rng.choice(n - 10, n // 12, replace=False):
        plateau[start:start + rng.integers(1, 6)] = rng.uniform(5e3, 25e3)
    ties = rng.choice([0.0, 10.0, 20.0, 35.5], n).astype(float)
    return [noisy.tolist(), plateau.tolist(), ties.tolist(), [7.0] * 40 + noisy[:200].tolist()]


def _same(river: SeriesForecaster, columns: ForecastColumns, slot: int, scale: float = 100.0) -> None:
    """``scale``: the series' largest magnitude. A float32 number is within 2**-24 of its float64 value relative to
    itself, so a loss, an error or a bound is held to 1e-6 of the scale."""
    near = {"rel": 1e-6, "abs": 1e-6 * scale}
    ours = columns.forecast(slot)
    theirs = river.forecast()
    # the same forecast, from the same expert or from one of equal value (the [7.0] * 40 series ties every expert)
    assert {h: f.mean.hex() for h, f in ours.items()} == {h: f.mean.hex() for h, f in theirs.items()}
    for h, f in theirs.items():
        assert (ours[h].lower, ours[h].upper) == pytest.approx((f.lower, f.upper), **near)
    for h, part in river.horizons.items():
        assert columns.errors(slot, h) == pytest.approx(list(part.errors), **near)
        for ours_loss, loss, seen in zip(columns.losses(slot, h), part.loss, part.seen, strict=True):
            assert ours_loss == (pytest.approx(loss, **near) if seen else [0.0] * len(loss))
        if part.errors:
            assert columns.abs_errors(slot)[h] == pytest.approx(part.abs_error, **near)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("horizons", "residuals", "upper"), [((1, 5, 15), 60, 100.0), ((3,), 30, None),
                                                             ((1, 5, 15), 200, 81920.0)])
def test_forecasts_losses_and_errors_are_those_of_the_river_forecaster(seed, horizons, residuals, upper) -> None:
    columns = ForecastColumns(horizons, residuals=residuals)
    for values in _series(seed):
        river = SeriesForecaster(horizons, residuals=residuals, upper_bound=upper)
        slot = columns.new(0.0, upper)
        scale = max(map(abs, values))
        for y in values:
            river.learn_one(y)
            assert columns.learn(slot, y, forecast=True) == columns.forecast(slot)
            _same(river, columns, slot, scale)


def test_rolling_quantile_interpolates_as_river() -> None:
    rng = random.Random(4)
    for q, window in ((0.5, 5), (0.5, 60), (0.1, 30), (0.9, 30), (0.25, 2)):
        river, kept = stats.RollingQuantile(q, window), []
        for _ in range(150):
            x = rng.choice([rng.uniform(-50, 50), float(rng.randint(0, 3))])
            river.update(x)
            kept = [*kept, x][-window:]
            assert rolling_quantile(sorted(kept), q, window) == river.get()


def test_the_mode_breaks_ties_as_rivers_rolling_mode() -> None:
    """River's RollingMode returns, of the values counted most, the one whose count started first (its dict's order),
    which may be a value no longer first in the window."""
    rng = random.Random(5)
    for _ in range(20):
        river, columns = SeriesForecaster((1,), window=3), ForecastColumns((1,), window=3)
        mode = stats.RollingMode(6)
        slot = columns.new()
        for _ in range(100):
            y = float(rng.randint(0, 3))
            river.learn_one(y)
            columns.learn(slot, y)
            mode.update(y)
            _same(river, columns, slot)


def test_rows_come_in_chunks_and_a_dropped_series_row_is_reused() -> None:
    columns = ForecastColumns((1, 5))
    held = [ColumnForecaster(columns) for _ in range(CHUNK + 1)]
    assert len(columns.chunks) == 2 and columns.held() == CHUNK + 1
    held[3].learn_one(5.0)
    slot = held[3].slot
    del held[3]
    gc.collect()
    assert columns.held() == CHUNK
    again = ColumnForecaster(columns, upper_bound=10.0)
    assert again.slot == slot and len(columns.chunks) == 2
    again.learn_one(20.0)  # a fresh row: nothing of the dropped series, its own bound
    assert again.forecast()[1].mean == 10.0 and columns.errors(slot, 1) == []


def test_bad_parameters_and_early_forecasts_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="interval_window"):
        ForecastColumns((1,), residuals=10, interval_window=30)
    with pytest.raises(ValueError, match="horizons"):
        ForecastColumns((0,))
    with pytest.raises(ValueError, match="before any learn_one"):
        ColumnForecaster(ForecastColumns()).forecast()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("horizons", "residuals", "window"), [((1, 5, 15), 60, 30), ((3,), 30, 30),
                                                               ((1, 5, 15), 200, 30), ((2, 7), 40, 3)])
def test_rows_learned_together_end_as_rows_learned_one_by_one(seed, horizons, residuals, window) -> None:
    """``learn_many`` against ``learn`` on a copy of the same rows: the rows and the forecasts bit for bit, over series
    of every shape (ties, runs, plateaus), rows of different ages in one call (some groups below ``MANY_MIN``), upper
    bounds and none, across chunks and past the residuals' wrap-around."""
    rng = np.random.default_rng(seed)
    one, many = ForecastColumns(horizons, residuals=residuals, window=window), \
        ForecastColumns(horizons, residuals=residuals, window=window)
    steps = 240  # the shortest of _series' series; past the residuals' wrap-around at 200
    series = [s[:steps] for k in range(6) for s in _series(seed * 10 + k, 420)]
    uppers = [rng.choice([None, 100.0, 40.0, 81920.0]) for _ in series]
    slots = []
    for upper in uppers:
        assert one.new(0.0, upper) == many.new(0.0, upper)
        slots.append(many.used - 1)
    for _ in range(CHUNK - len(slots) + 3):  # the last rows in a second chunk
        one.new(), many.new()
    slots += [CHUNK + 1, CHUNK + 2]
    series += [_series(seed, steps)[0], _series(seed, steps)[2]]
    for slot in slots[-2:]:
        for columns in (one, many):
            columns._rows(slot)[0][UPPER] = 100.0
    learned = [0] * len(slots)
    while min(learned) < steps:
        # most rows at one age, some ahead by a few steps: groups of many and of a few
        picked = [i for i in range(len(slots))
                  if learned[i] < steps and (rng.random() < 0.9 or learned[i] == min(learned))]
        ys = [series[i][learned[i]] for i in picked]
        got = many.learn_many([slots[i] for i in picked], ys)
        for j, i in enumerate(picked):
            want = one.learn(slots[i], ys[j], forecast=True)
            assert got[j].tolist() == [[f.mean, f.lower, f.upper] for f in want.values()]
            learned[i] += 1
    for slot in slots:
        for ours, theirs in zip(many._rows(slot), one._rows(slot), strict=True):
            assert ours.tobytes() == theirs.tobytes()


def test_a_row_is_learned_once_per_call() -> None:
    columns = ForecastColumns((1,))
    slot = columns.new()
    with pytest.raises(ValueError, match="once per call"):
        columns.learn_many([slot, slot], [1.0, 2.0])
