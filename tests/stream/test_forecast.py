"""The online forecaster on synthetic series: River holds its state, intervals cover, snapshots round-trip."""

from __future__ import annotations

import copy
import hashlib
import pickle

import numpy as np
import pytest
from river import stats

from gpuaware.stream.forecast import EXPERTS, RUN_BUCKETS, ExpertForecaster, SeriesForecaster, prequential


def _noisy(seed: int = 0, n: int = 600) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"s{i}": 50 + 20 * np.sin(np.arange(n) / 40 + i) + rng.normal(0, 8, n) for i in range(5)}


def test_beats_persistence_on_noisy_series_and_intervals_cover_about_80_percent():
    result = prequential(_noisy(), horizon=5, upper=100.0)
    assert result["ratio"] < 0.9
    assert 0.7 <= result["interval_coverage_80"] <= 0.85  # 30 errors slightly under-cover independent noise


def test_intervals_cover_a_plateau_with_dips_like_gpu_memory():
    rng = np.random.default_rng(1)
    series = {}
    for i in range(4):
        v = np.full(800, 30e9 + i * 1e9)
        for start in rng.choice(790, 60, replace=False):
            v[start:start + rng.integers(1, 6)] = rng.uniform(5e9, 25e9)
        series[f"m{i}"] = v + rng.normal(0, 1e8, 800)
    result = prequential(series, horizon=5)
    assert result["ratio"] < 0.9
    assert 0.7 <= result["interval_coverage_80"] <= 0.85


def test_the_series_state_is_river_statistics():
    model = ExpertForecaster(horizon=5)
    for y in range(40):
        model.learn_one(float(y % 7))
        model.forecast()
    h = model.horizons[5]
    river_parts = [model._last, model._lag, model._spread, h.lo, h.hi, *model._stats]
    assert all(type(part).__module__.startswith("river.") for part in river_parts)
    # the forecast is one of the River statistics' current values
    f = model.forecast()
    assert f.expert in EXPERTS
    assert f.mean == pytest.approx(model._experts([5])[5][EXPERTS.index(f.expert)])


def test_the_experts_losses_are_rivers_ewmean_to_the_last_bit():
    """The losses are plain floats (SeriesForecaster's docstring says why), kept as River's EWMean keeps them."""
    model = ExpertForecaster(horizon=3, decay=0.97)
    reference = [[stats.EWMean(1 - 0.97) for _ in EXPERTS] for _ in range(len(RUN_BUCKETS) + 1)]
    waiting = []
    for y in _noisy(3, 400)["s0"].tolist() + [42.0] * 30:  # a plateau: every run-length context is visited
        while waiting and waiting[0][0] <= model.t:
            _, experts, context = waiting.pop(0)
            for loss, x in zip(reference[context], experts, strict=True):
                loss.update(abs(x - y))
        model.learn_one(y)
        model.forecast()
        step, experts, _, context = model.horizons[3].pending[-1]
        waiting.append((step, experts, context))
    assert all(model.horizons[3].seen)
    assert model.horizons[3].loss == [[loss.get() for loss in per_context] for per_context in reference]


def test_horizons_of_one_series_forecast_exactly_as_single_horizon_forecasters():
    series = _noisy(4, 300)["s2"].tolist()
    together = SeriesForecaster((1, 5, 15), upper_bound=100.0)
    alone = {h: ExpertForecaster(horizon=h, upper_bound=100.0) for h in (1, 5, 15)}
    for y in series:
        together.learn_one(y)
        forecasts = together.forecast()
        for h, model in alone.items():
            model.learn_one(y)
            assert forecasts[h] == model.forecast()
    assert all(list(together.horizons[h].errors) == list(alone[h].errors) for h in alone)
    with pytest.raises(ValueError, match="distinct horizons"):
        SeriesForecaster((5, 5))


def test_state_lives_in_the_object_and_a_snapshot_forecasts_the_same():
    series = _noisy(2, 300)
    a, b = ExpertForecaster(horizon=5, upper_bound=100.0), ExpertForecaster(horizon=5, upper_bound=100.0)
    alone = ExpertForecaster(horizon=5, upper_bound=100.0)
    for ya, yb in zip(series["s0"][:200], series["s1"][:200], strict=True):
        a.learn_one(ya)
        fa = a.forecast()
        b.learn_one(yb)
        b.forecast()
        alone.learn_one(ya)
        assert alone.forecast() == fa  # another series learned in between changes nothing
    for restored in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        original = copy.deepcopy(a)
        for y in series["s0"][200:]:
            original.learn_one(y)
            restored.learn_one(y)
            assert restored.forecast() == original.forecast()


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


def test_forecasts_are_bit_for_bit_those_of_the_forecaster_with_a_river_object_per_loss():
    """The digest of every forecast (mean, interval, expert; as float.hex) over a noisy series and a memory-like
    plateau with dips, horizons 1, 5 and 15, as commit 0752405's forecaster (an EWMean per expert loss, one
    forecaster per horizon) made them."""
    rng = np.random.default_rng(7)
    noisy = 50 + 20 * np.sin(np.arange(300) / 40) + rng.normal(0, 8, 300)
    plateau = np.full(300, 30e3)
    for start in rng.choice(290, 25, replace=False):
        plateau[start:start + rng.integers(1, 6)] = rng.uniform(5e3, 25e3)
    digest = hashlib.sha256()
    for values, upper in ((noisy.tolist(), 100.0), (plateau.tolist(), 81920.0)):
        for horizon in (1, 5, 15):
            model = ExpertForecaster(horizon=horizon, upper_bound=upper)
            for y in values:
                model.learn_one(y)
                f = model.forecast()
                digest.update(f"{f.mean.hex()} {f.lower.hex()} {f.upper.hex()} {f.expert};".encode())
    assert digest.hexdigest() == "4484f164c0a10620598117070d40362caa26dafa8769a63d85911bac4399fae8"


def test_the_kept_mean_absolute_error_is_that_of_the_errors_kept() -> None:
    """Over many more errors than a horizon keeps (its running sum loses the oldest and is made again from the
    errors now and then), ``abs_error`` stays the mean absolute value of the errors kept."""
    import random

    rng = random.Random(3)
    model = SeriesForecaster((1, 5), residuals=50)
    for step in range(1_000):
        model.learn_one(rng.choice([0.0, 1e5, rng.uniform(0, 100)]))
        model.forecast()
        for h in model.horizons.values():
            if h.errors:
                assert h.abs_error == pytest.approx(sum(abs(e) for e in h.errors) / len(h.errors), rel=1e-9, abs=1e-9)
            else:
                assert h.abs_error is None, step


@pytest.mark.parametrize("residuals", [0, 1, None])
def test_any_number_of_kept_errors_keeps_a_mean(residuals) -> None:
    model = SeriesForecaster((1,), residuals=residuals)
    for y in [1.0, 5.0, 2.0, 8.0, 3.0] * 5:
        model.learn_one(y)
        model.forecast()
    h = model.horizons[1]
    assert h.abs_error is None if not h.errors else h.abs_error == pytest.approx(
        sum(abs(e) for e in h.errors) / len(h.errors))


def test_forecast_is_a_query_asked_never_or_twice_a_step_it_forecasts_the_same():
    """Only ``learn_one`` changes the state, as in River: a forecast asked twice in a step is scored once, and a
    step nobody asked about is scored all the same."""
    series = _noisy(5, 200)["s1"].tolist()
    once = SeriesForecaster((1, 5), upper_bound=100.0)
    twice = SeriesForecaster((1, 5), upper_bound=100.0)
    never = SeriesForecaster((1, 5), upper_bound=100.0)
    for t, y in enumerate(series):
        for model in (once, twice, never):
            model.learn_one(y)
        expected = once.forecast()
        assert twice.forecast() == expected
        assert twice.forecast() == expected
        if t % 10 == 9:  # ``never`` is asked only now and then
            assert never.forecast() == expected
    for h in (1, 5):
        assert list(twice.horizons[h].errors) == list(once.horizons[h].errors) == list(never.horizons[h].errors)
        assert twice.horizons[h].loss == once.horizons[h].loss == never.horizons[h].loss
