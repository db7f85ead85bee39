"""The forecasters in numpy rows against ``SeriesForecaster`` (River's statistics), on the same series: the same
forecast means bit for bit (from the same expert, or one of equal value); the intervals, losses and errors, which the
rows keep or score in float32, within 1e-6 of the series' scale (gpuaware.stream.forecast_columns)."""

from __future__ import annotations

import gc
import random

import pytest
from river import stats

from gpuaware.stream.forecast import SeriesForecaster
from gpuaware.stream.forecast_columns import CHUNK, ColumnForecaster, ForecastColumns, rolling_quantile
from tests.support import forecast_series


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
    for values in forecast_series(seed):
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
