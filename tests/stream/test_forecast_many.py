"""Many forecaster rows learned at once (``gpuaware.stream.forecast_many.learn_many``) against the same rows learned one
at a time (``ForecastColumns.learn``): bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from gpuaware.stream.forecast_columns import CHUNK, UPPER, ForecastColumns
from gpuaware.stream.forecast_many import learn_many
from tests.support import forecast_series


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
    series = [s[:steps] for k in range(6) for s in forecast_series(seed * 10 + k, 420)]
    uppers = [rng.choice([None, 100.0, 40.0, 81920.0]) for _ in series]
    slots = []
    for upper in uppers:
        assert one.new(0.0, upper) == many.new(0.0, upper)
        slots.append(many.used - 1)
    for _ in range(CHUNK - len(slots) + 3):  # the last rows in a second chunk
        one.new(), many.new()
    slots += [CHUNK + 1, CHUNK + 2]
    series += [forecast_series(seed, steps)[0], forecast_series(seed, steps)[2]]
    for slot in slots[-2:]:
        for columns in (one, many):
            columns._rows(slot)[0][UPPER] = 100.0
    learned = [0] * len(slots)
    while min(learned) < steps:
        # most rows at one age, some ahead by a few steps: groups of many and of a few
        picked = [i for i in range(len(slots))
                  if learned[i] < steps and (rng.random() < 0.9 or learned[i] == min(learned))]
        ys = [series[i][learned[i]] for i in picked]
        got = learn_many(many, [slots[i] for i in picked], ys)
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
        learn_many(columns, [slot, slot], [1.0, 2.0])
