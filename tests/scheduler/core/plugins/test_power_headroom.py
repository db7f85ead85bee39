"""Power headroom: heat-limited work goes where temperature and power leave margin."""

from __future__ import annotations

from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.plugins.power_headroom import PowerHeadroom
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with


def test_the_gpu_with_the_most_temperature_and_power_headroom_wins():
    c = cluster(2)
    c.live[:] = True
    c.temp[0] = [50.0, 50.0]
    c.power[0] = [280.0, 120.0]  # same temperature, GPU 0 near its 300 W limit
    c.power_limit[0] = [300.0, 300.0]
    d = scheduler_with(PowerHeadroom()).schedule(c, Workload("x", 0, 0, 1, 1000))
    assert d.allocation.gpus == [1] and d.signals == ["thermal"]
    c.power[0] = [120.0, 120.0]
    c.temp[0] = [50.0, 82.0]
    assert scheduler_with(PowerHeadroom()).schedule(c, Workload("y", 0, 0, 1, 1000)).allocation.gpus == [0]


def test_without_live_state_the_score_is_flat():
    c = cluster(2)
    c.temp[0] = [83.0, 40.0]  # a temperature, but not from a live stream
    ctx = CycleContext(c, Workload("x", 0, 0, 1, 1000))
    s = PowerHeadroom().score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1]))
    assert (s == 0).all() and ctx.signals == set()


def test_a_gpu_without_live_state_scores_the_mean_of_the_live_ones():
    c = cluster(3)
    c.live[0] = [True, True, False]
    c.temp[0] = [40.0, 80.0, 0.0]
    ctx = CycleContext(c, Workload("x", 0, 0, 1, 1000))
    s = PowerHeadroom().score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1]))
    assert s[0] > s[2] > s[1]


def test_a_cool_cluster_scores_flat_so_packing_decides():
    # Regression: a few degrees apart, far from slowdown, used to take the whole normalised score range
    # and spread work against FGD's packing.
    c = cluster(2)
    c.live[:] = True
    c.temp[0] = [40.0, 60.0]
    c.power[0] = [100.0, 150.0]
    c.power_limit[0] = [300.0, 300.0]
    ctx = CycleContext(c, Workload("x", 0, 0, 1, 1000))
    s = PowerHeadroom().score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1]))
    assert s[0] == s[1] and ctx.signals == {"thermal"}
