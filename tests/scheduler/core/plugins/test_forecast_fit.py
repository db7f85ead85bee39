"""Forecast-fit: shared GPUs by the forecast upper bound of utilisation and memory, with a memory margin."""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.framework import Candidates, CycleContext, Profile, Scheduler
from gpuaware.scheduler.core.plugins.forecast_fit import ForecastFit
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster


def _two_half_used():
    c = cluster(2)
    for g in (0, 1):
        c.allocate(Allocation(f"r{g}", 0, [g], [500], 0, 0, [8192], "shared"))
    return c


def _place(c, w):
    return Scheduler(Profile("t", [ForecastFit()], [(ForecastFit(), 1.0)])).schedule(c, w)


def test_the_fullest_memory_forecast_that_fits_wins_and_names_the_signal():
    c = _two_half_used()
    c.live[:] = True
    c.forecast_util[0] = [45.0, 10.0]  # compute is not what bounds sharing: memory is
    c.forecast_mem[0] = [4000.0, 8000.0]
    d = _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=4000))
    assert d.allocation.gpus == [1] and d.signals == ["forecast"]


def test_the_memory_margin_keeps_a_forecast_miss_from_oom_killing_a_co_tenant():
    c = cluster(2)
    for g in (0, 1):  # residents without a memory request: only the forecast bounds them
        c.allocate(Allocation(f"r{g}", 0, [g], [500], 0, 0, [0], "shared"))
    c.live[:] = True
    c.forecast_mem[0] = [4000.0, 10000.0]  # 10000 * 1.15 + 6000 > 16384: GPU 1 is out, even with compute free
    d = _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000))
    assert d.allocation.gpus == [0]


def test_pairs_that_fit_by_request_are_not_turned_away_by_the_margin():
    # Regression: the margin grew the newcomer's (known) request, so two 0.47 shares of a 16 GiB GPU
    # (7700 MiB each) no longer fitted together and a loaded cluster fragmented.
    c = cluster(1)
    c.allocate(Allocation("r", 0, [0], [470], 0, 0, [7700], "shared"))
    c.live[:] = True
    c.forecast_mem[0] = [7700.0]  # not warmed up: its request
    ctx = CycleContext(c, Workload("w", 0, 0, 1, 470, gpu_memory_mib=7700))
    assert ForecastFit().filter_gpus(ctx)[0, 0]
    c.forecast_mem[0] = [9000.0]  # a forecast above the charge cannot be: the charge bounds it
    assert ForecastFit().filter_gpus(ctx)[0, 0]


def test_a_gpu_its_residents_have_left_since_the_last_reading_takes_a_newcomer():
    # Regression: the forecast is as old as the stream's last reading. A GPU whose jobs ended (or were
    # evicted) since kept their forecast memory, and with nothing charged the filter counted it in full: for
    # up to a tick the GPU was closed to shared work, and a preemption that freed it for a high-priority
    # shared job freed it for nothing (the ablation's "forecast" part: 5x the quota reclaims of none). The
    # score's best fit sent FGD's ties to it as the fullest. Its release now forgets the readings.
    c = cluster(2)
    c.allocate(Allocation("gone", 0, [0], [1000], 0, 0, [16384], "whole"))
    c.allocate(Allocation("stays", 0, [1], [500], 0, 0, [8192], "shared"))
    c.live[:] = True
    c.forecast_mem[0] = [15000.0, 4000.0]  # read while "gone" ran
    c.release("gone")
    ctx = CycleContext(c, Workload("w", 0, 0, 1, 500, gpu_memory_mib=8192))
    assert ForecastFit().filter_gpus(ctx)[0, 0]
    assert list(ForecastFit().score(ctx, Candidates(np.array([0, 0]), np.array([0, 1])))) == [0.0, 4000 / 16384]


def test_without_live_state_the_score_is_flat_and_nothing_is_filtered():
    c = _two_half_used()
    c.forecast_mem[0] = [16000.0, 16000.0]  # not live: ignored
    p = ForecastFit()

    ctx = CycleContext(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000))
    assert p.filter_gpus(ctx).all()
    assert (p.score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1])) == 0).all()
    assert ctx.signals == set()
    assert _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000)).signals == []
