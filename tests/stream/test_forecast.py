"""The online forecaster on synthetic series."""

from __future__ import annotations

import numpy as np
import pytest

from stream.forecast import ExpertForecaster, prequential


def test_beats_persistence_on_noisy_series_and_intervals_cover_about_80_percent():
    rng = np.random.default_rng(0)
    series = {f"s{i}": 50 + 20 * np.sin(np.arange(600) / 40 + i) + rng.normal(0, 8, 600) for i in range(5)}
    result = prequential(series, horizon=5, upper=100.0)
    assert result["ratio"] < 0.9
    assert 0.7 <= result["interval_coverage_80"] <= 0.9


def test_forecasts_stay_within_physical_bounds_and_never_diverge():
    model = ExpertForecaster(horizon=5, upper_bound=100.0)
    for y in [0, 100, 0, 100, 100, 100, 95, 100, 100, 100] * 20:
        model.learn_one(y)
        f = model.forecast()
        assert 0 <= f.lower <= f.mean <= f.upper <= 100
    climbing = ExpertForecaster(horizon=5, upper_bound=None)
    for y in np.linspace(0, 1e6, 300):
        climbing.learn_one(y)
    assert 0 < climbing.forecast().mean < 2e6


def test_bad_parameters_and_early_forecasts_are_clear_errors():
    with pytest.raises(ValueError, match="horizon"):
        ExpertForecaster(horizon=0)
    with pytest.raises(ValueError, match="before any learn_one"):
        ExpertForecaster().forecast()
