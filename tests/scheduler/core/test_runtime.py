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


def test_an_exact_runtime_is_the_truth_and_a_job_past_it_has_an_unknown_end():
    est = RuntimeEstimate.exact(1000.0)
    assert est.p50() == pytest.approx(1000.0) and est.p90() == pytest.approx(1000.0)
    assert est.remaining(400.0) == pytest.approx(600.0)
    assert est.remaining(1000.0) == pytest.approx(0.0)
    # Ran past what it declared: not "ends now" on every pass (patient preemption would wait for it forever).
    assert est.remaining(1200.0) == math.inf and est.mean_remaining(1200.0) == math.inf


def test_past_its_p999_an_estimate_no_longer_dates_the_end():
    est = RuntimeEstimate(math.log(7200.0), 0.05)  # a key whose jobs all hit the same cap
    assert est.remaining(7300.0) < math.inf
    assert est.remaining(7200.0 * math.exp(0.05 * 3.2)) == math.inf


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
    # Given 100 s run, the p90 of the total is above the unconditional p90 less what has run.
    assert ends["a"] > 1000.0 + est.p90() - 100.0
    assert ends["b"] == math.inf
    assert ends.get("gone", 1000.0) == 1000.0  # how earliest_fit asks: a job that left has no end
    assert set(ends) == {"a", "b"} and len(ends) == 2


def test_the_expected_time_left_follows_the_distribution_given_the_time_run():
    import random

    est = RuntimeEstimate(math.log(600.0), 1.0)
    assert est.mean_remaining() == pytest.approx(600.0 * math.exp(0.5))  # E[D] of a log-normal
    # E[D - a | D > a] against a sample of the same log-normal: within 2%.
    rng = random.Random(3)
    draws = [math.exp(rng.gauss(math.log(600.0), 1.0)) for _ in range(400_000)]
    for a in (300.0, 1500.0):
        left = [d - a for d in draws if d > a]
        assert est.mean_remaining(a) == pytest.approx(sum(left) / len(left), rel=0.02)
        assert est.p50(a) == pytest.approx(sorted(d for d in draws if d > a)[len(left) // 2], rel=0.02)
    # A wider spread with the same median means more time expected: ordering by it prefers the surer job.
    assert RuntimeEstimate(math.log(600.0), 2.0).mean_remaining() > est.mean_remaining()
    assert RuntimeEstimate.exact(600.0).mean_remaining(200.0) == pytest.approx(400.0)
    assert RuntimeEstimate(math.log(600.0), 0.1).mean_remaining(1e9) == math.inf  # far past any end: unknown
