"""Forecast headroom, and thermal spreading."""

from __future__ import annotations

from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_forecast_headroom_and_thermal_spreading():
    from gpuaware.scheduler.core.plugins.forecast_headroom import ForecastHeadroom
    from gpuaware.scheduler.core.plugins.thermal import ThermalSpread

    c = cluster(2)
    c.forecast_util[0, 0] = 80.0
    w = Workload("w", 0, 0, 1, 300)  # expects ~30% of a GPU
    d = Scheduler(Profile("t", [ForecastHeadroom()], [(ForecastHeadroom(), 1.0)])).schedule(c, w)
    assert d.allocation.gpus == [1]
    c = cluster(2)
    c.temp[0] = [83.0, 55.0]
    assert scheduler_with(ThermalSpread()).schedule(c, Workload("x", 0, 0, 1, 1000)).allocation.gpus == [1]
