"""Forecast-fit: shared GPUs by the forecast upper bound of utilisation and memory, with a memory margin."""

from __future__ import annotations

from scheduler.core.cluster import Allocation
from scheduler.core.framework import Profile, Scheduler
from scheduler.core.plugins.forecast_fit import ForecastFit
from scheduler.core.workload import Workload
from tests.support import cluster


def _two_half_used():
    c = cluster(2)
    for g in (0, 1):
        c.allocate(Allocation(f"r{g}", 0, [g], [500], 0, 0, [8192], "shared"))
    return c


def _place(c, w):
    return Scheduler(Profile("t", [ForecastFit()], [(ForecastFit(), 1.0)])).schedule(c, w)


def test_the_busiest_forecast_that_fits_wins_and_names_the_signal():
    c = _two_half_used()
    c.live[:] = True
    c.forecast_util[0] = [10.0, 45.0]  # both residents asked for half; GPU 1's really uses it
    c.forecast_mem[0] = [4000.0, 4000.0]
    d = _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=4000))
    assert d.allocation.gpus == [1] and d.signals == ["forecast"]


def test_the_memory_margin_keeps_a_forecast_miss_from_oom_killing_a_co_tenant():
    c = _two_half_used()
    c.live[:] = True
    c.forecast_util[0] = [10.0, 45.0]
    c.forecast_mem[0] = [4000.0, 10000.0]  # 10000 + 6000 * 1.15 > 16384: GPU 1 is out, even with compute free
    d = _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000))
    assert d.allocation.gpus == [0]


def test_without_live_state_the_score_is_flat_and_nothing_is_filtered():
    c = _two_half_used()
    c.forecast_mem[0] = [16000.0, 16000.0]  # not live: ignored
    p = ForecastFit()
    from scheduler.core.framework import Candidates, CycleContext

    ctx = CycleContext(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000))
    assert p.filter_gpus(ctx).all()
    assert (p.score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1])) == 0).all()
    assert ctx.signals == set()
    assert _place(c, Workload("w", 0, 0, 1, 300, gpu_memory_mib=6000)).signals == []
