"""A decision names the stream signals it read, and which of them changed the placement."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.plugins.bestfit import BestFit
from gpuaware.scheduler.core.plugins.power_headroom import PowerHeadroom
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.policy_specs import LIVE_STREAM, SIGNALS
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from tests.support import cluster


def _half_used(temps):
    c = cluster(2)
    c.allocate(Allocation("r", 0, [0], [500], 0, 0, [], "shared"))  # best fit prefers GPU 0
    c.live[:] = True
    c.temp[0] = temps
    return c


def _place(c):
    return Scheduler(Profile("t", [], [(BestFit(), 1.0), (PowerHeadroom(), 2.0)])).schedule(
        c, Workload("x", 0, 0, 1, 300))


def test_a_signal_that_moves_the_choice_is_named_in_steered_by():
    d = _place(_half_used([84.0, 40.0]))
    assert d.allocation.gpus == [1] and d.signals == ["thermal"] and d.steered_by == ["thermal"]


def test_a_signal_read_but_agreeing_with_the_other_scores_steers_nothing():
    d = _place(_half_used([40.0, 84.0]))
    assert d.allocation.gpus == [0] and d.signals == ["thermal"] and d.steered_by == []


def test_no_stream_no_signals_and_the_live_profile_keeps_the_parts_the_ablation_kept():
    d = Scheduler(profile("gpuaware", WorkloadMix())).schedule(cluster(2), Workload("x", 0, 0, 1, 500))
    assert d.allocation is not None and d.signals == [] and d.steered_by == []
    assert set(SIGNALS) >= LIVE_STREAM
    assert profile("gpuaware", WorkloadMix(), stream=frozenset()).scored_by == "fgd+cpu_for_gpus+model_reservation"
