"""Runtime estimates as the core reads them: quantiles given the time already run, expected ends, backfill."""

from __future__ import annotations

import math

import pytest

from gpuaware.scheduler.core.runtime import PredictedEnds, RuntimeEstimate, expected_duration
from gpuaware.scheduler.core.workload import Workload


def test_an_estimates_quantiles_grow_with_the_time_already_run():
    est = RuntimeEstimate(math.log(600.0), 1.0)
    assert est.p50() == pytest.approx(600.0)
    assert est.p90() == pytest.approx(600.0 * math.exp(1.2815515655446004))
    # Having run past its median, half of what is left of the distribution lies beyond a later point.
    assert est.p50(600.0) > 600.0
    assert est.p50(3000.0) > est.p50(600.0) > est.p50()
    assert est.remaining(3000.0) > 0
    assert est.p90(3000.0) > est.p50(3000.0)


def test_an_exact_runtime_is_the_truth_and_never_ends_before_now():
    est = RuntimeEstimate.exact(1000.0)
    assert est.p50() == pytest.approx(1000.0) and est.p90() == pytest.approx(1000.0)
    assert est.remaining(400.0) == pytest.approx(600.0)
    assert est.remaining(1200.0) == 0.0  # ran past its runtime: it ends now, not in the past


def test_backfill_length_is_the_p90_else_the_declared_duration_else_unknown():
    est = RuntimeEstimate(math.log(600.0), 0.5)
    assert expected_duration(est, 60.0) == pytest.approx(est.p90())
    assert expected_duration(None, 60.0) == 60.0
    assert expected_duration(None, None) == math.inf


class _Run:
    def __init__(self, runtime, elapsed):
        self.workload = Workload("w", runtime=runtime)
        self._elapsed = elapsed

    def elapsed(self, now):
        return self._elapsed


def test_predicted_ends_are_now_plus_the_p90_of_what_remains_and_unknown_work_never_ends():
    est = RuntimeEstimate(math.log(600.0), 0.5)
    ends = PredictedEnds({"a": _Run(est, 100.0), "b": _Run(None, 100.0)}, now=1000.0)
    assert ends["a"] == pytest.approx(1000.0 + est.p90(100.0) - 100.0)
    assert ends["b"] == math.inf
    assert set(ends) == {"a", "b"} and len(ends) == 2


def test_the_expected_time_left_follows_the_distribution_given_the_time_run():
    est = RuntimeEstimate(math.log(600.0), 1.0)
    assert est.mean_remaining() == pytest.approx(600.0 * math.exp(0.5))  # E[D] of a log-normal
    assert est.mean_remaining(60.0) > 0
    # A wider spread with the same median means more time expected: ordering by it prefers the surer job.
    assert RuntimeEstimate(math.log(600.0), 2.0).mean_remaining() > est.mean_remaining()
    assert RuntimeEstimate.exact(600.0).mean_remaining(200.0) == pytest.approx(400.0)
    assert RuntimeEstimate(math.log(600.0), 0.1).mean_remaining(1e9) == 0.0  # far past any end
