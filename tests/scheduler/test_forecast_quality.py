"""Forecast quality: each completion against the estimate its pod was placed with, over a bounded window, and the
scheduler's metrics for it."""

from __future__ import annotations

import math

from gpuaware.scheduler.core.runtime import RuntimeEstimate
from gpuaware.scheduler.forecast_quality import ForecastQuality, ranks, spearman
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats
from gpuaware.scheduler.runtimes import RuntimeTable


def test_spearman_with_ties_and_too_few_pairs():
    assert ranks([3.0, 1.0, 3.0]) == [2.5, 1.0, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == -1.0
    assert abs(spearman([1, 1, 2, 2], [1, 2, 3, 4]) - 0.894) < 0.001
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_completions_are_scored_against_the_estimate_placed_in_a_bounded_window():
    q = ForecastQuality(window=4)
    for i in range(6):
        q.placed(f"ns/p{i}", RuntimeEstimate(math.log(100 * (i + 1)), 0.5, source="forecast", level="owner"))
    q.placed("ns/d", RuntimeEstimate.exact(300, source="declared"))
    q.placed("ns/none", None)
    for i in range(6):
        q.completed(f"ns/p{i}", 100 * (i + 1) * (3.0 if i == 5 else 1.0))  # the last runs past its p90
    q.completed("ns/d", 600)
    q.completed("ns/none", 50)  # placed with no estimate
    s = q.summary()
    assert s["completions"] == 4 and s["unscored"] == 1  # the window keeps the last four
    assert s["judged"] == 3  # the declared duration, exact, is not judged
    assert s["p90_coverage"] == 2 / 3  # p3, p4 within; p5 (3x) past
    assert s["spearman"] == 1.0  # ranks by p50 (1, 2, 3) against by runtime (1, 2, 3)
    assert set(s["mae_log"]) == {"owner", "declared"} and abs(s["mae_log"]["declared"] - math.log(2)) < 1e-9
    assert [r["pod"] for r in s["recent"]][-2:] == ["ns/p5", "ns/d"] and s["recent"][-1]["actual_s"] == 600


def test_generous_exact_declarations_neither_cover_nor_rank_but_calibrated_ones_are_judged():
    q = ForecastQuality()
    for i in range(60):  # each declared 10x what it runs, in no order of length
        q.placed(f"ns/d{i}", RuntimeEstimate.exact(1000.0 * ((i * 7) % 11 + 1), source="declared"))
        q.completed(f"ns/d{i}", 100.0 * ((i * 3) % 5 + 1))
    s = q.summary()
    assert s["completions"] == 60 and s["judged"] == 0 and s["p90_coverage"] is None and s["spearman"] is None
    for i in range(4):
        q.placed(f"ns/c{i}", RuntimeEstimate(math.log(200.0 * (i + 1)), 0.3, source="calibrated"))
        q.completed(f"ns/c{i}", 200.0 * (i + 1) * (2.0 if i == 0 else 1.0))
    s = q.summary()
    assert s["judged"] == 4 and s["p90_coverage"] == 0.75 and s["spearman"] is not None


def test_the_scheduler_exports_completions_the_runtime_table_and_forecast_quality():
    stats = SchedulerStats(runtimes=RuntimeTable())
    for i in range(5):
        stats.forecasts.placed(f"ns/p{i}", RuntimeEstimate(math.log(60 * (i + 1)), 0.4, level="shape"))
        stats.forecasts.completed(f"ns/p{i}", 60 * (i + 1))
    stats.forecasts.published = 5
    fams = {f.name: f for f in SchedulerCollector(stats, QueueSnapshot).collect()}
    value = {name: f.samples[0].value for name, f in fams.items() if f.samples and len(f.samples) == 1}
    assert value["gpuaware_scheduler_completions_published"] == 5
    assert value["gpuaware_scheduler_runtime_keys"] == 0
    assert "gpuaware_scheduler_runtime_newest_age_seconds" not in value  # no record yet
    assert value["gpuaware_scheduler_forecast_window_completions"] == 5
    assert value["gpuaware_scheduler_forecast_judged_completions"] == 5
    assert value["gpuaware_scheduler_forecast_spearman"] == 1.0
    assert value["gpuaware_scheduler_forecast_p90_coverage"] == 1.0
    assert [s.labels["level"] for s in fams["gpuaware_scheduler_forecast_mae_log"].samples] == ["shape"]
