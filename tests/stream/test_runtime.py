"""The online runtime forecaster: learns in completion order, ranks by signature, keeps p90 calibrated."""

from __future__ import annotations

import math
import random

import pytest

from gpuaware.contract.runtime import GLOBAL
from gpuaware.stream.runtime import RuntimeForecaster


def test_a_signature_with_short_jobs_is_predicted_shorter_than_one_with_long_jobs():
    f = RuntimeForecaster()
    rng = random.Random(1)
    for _ in range(50):
        f.learn_one(["shape:short", GLOBAL], math.exp(rng.gauss(math.log(300), 0.5)))
        f.learn_one(["shape:long", GLOBAL], math.exp(rng.gauss(math.log(6000), 0.5)))
    short, long = f.predict_one(["shape:short", GLOBAL]), f.predict_one(["shape:long", GLOBAL])
    assert short.p50_s < 600 < 3000 < long.p50_s and short.level == "shape"
    # A signature never seen falls back to everything learned.
    assert f.predict_one(["shape:new", GLOBAL]).level == "global"


def test_p90_coverage_settles_near_ninety_percent_on_heavy_tails():
    f = RuntimeForecaster()
    rng = random.Random(7)
    covered = []
    for i in range(4000):
        seconds = math.exp(rng.gauss(math.log(1000), 1.0)) * (5 if rng.random() < 0.1 else 1)  # a heavier tail
        p = f.predict_one(["shape:a", GLOBAL])
        if i >= 1000:
            covered.append(seconds <= p.p90_s)
        f.learn_one(["shape:a", GLOBAL], seconds)
    assert 0.86 <= sum(covered) / len(covered) <= 0.94


def test_predicting_changes_nothing_and_restore_rebuilds_the_same_model():
    f = RuntimeForecaster()
    for s in (100.0, 250.0, 900.0):
        f.learn_one(["shape:a", GLOBAL], s)
    before = f.state()
    f.predict_one(["shape:a", GLOBAL])
    f.predict_one(["shape:b", GLOBAL])
    assert f.state() == before
    g = RuntimeForecaster()
    g.learn_one(["shape:stale", GLOBAL], 5.0)  # what it knew before is replaced
    g.restore(before.items())
    assert g.state() == before
    assert g.predict_one(["shape:a", GLOBAL]) == f.predict_one(["shape:a", GLOBAL])


def test_memory_is_bounded_by_dropping_the_least_recently_learned_keys_never_the_global_one():
    f = RuntimeForecaster(max_keys=3)
    f.learn_one([GLOBAL], 100.0)  # the global key is then the least recently used of all
    for i in range(10):
        f.learn_one([f"shape:{i}"], 100.0 + i)
    assert set(f.keys) == {GLOBAL, "shape:8", "shape:9"}
    g = RuntimeForecaster(max_keys=2)
    g.restore(f.state().items())  # a restore keeps the bound too, and the global key
    assert GLOBAL in g.keys and len(g.keys) == 2


@pytest.mark.parametrize("bad", [0.0, -5.0, math.inf, math.nan])
def test_a_runtime_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="positive number of seconds"):
        RuntimeForecaster().learn_one([GLOBAL], bad)
