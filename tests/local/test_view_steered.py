"""`gpuaware up` shows the placements the stream changed: how many, and by which signal."""

from __future__ import annotations

from gpuaware.local.view import steered
from gpuaware.scheduler.metrics import SchedulerStats


def test_the_totals_line_counts_steered_placements_by_signal():
    stats = SchedulerStats()
    assert steered(stats) == ", none steered by the stream"
    stats.stream_steered([])  # a placement the stream did not change
    stats.stream_steered(["forecast"])
    stats.stream_steered(["forecast", "thermal"])
    assert stats.steered_placements == 2
    assert steered(stats) == ", 2 steered by the stream (forecast 2, thermal 1)"
