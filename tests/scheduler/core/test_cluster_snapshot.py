"""Plugins see a read-only snapshot of the cluster; only the framework's reserve changes the model."""

from __future__ import annotations

import numpy as np
import pytest

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState, schedule_pass
from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.plugins.clustering import Clustering
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from tests.support import cluster, scheduler_with


class _Writes:
    """A score plugin that tries to change the cluster in one way."""

    name = "writes"

    def __init__(self, how):
        self.how = how

    def score(self, ctx: CycleContext, cand: Candidates) -> np.ndarray:
        self.how(ctx.cluster)
        return np.zeros(len(cand))


def _in_place(c) -> None:
    c.gpu_free[0, 0] = 0


def _by_ufunc(c) -> None:
    np.subtract(c.cpu_free, 1000, out=c.cpu_free)


def _row(c) -> None:
    row = c.gpu_free[0]  # a basic slice: a view of the model's own array, not a copy
    row -= 100


def _fingerprint(c) -> None:
    c.fingerprint[0, 0] = "training-compute-bound"


@pytest.mark.parametrize("how", [_in_place, _by_ufunc, _row, _fingerprint])
def test_a_plugin_that_writes_the_snapshots_arrays_gets_an_error_and_the_model_is_untouched(how):
    c = cluster(2, 2)
    before = c.gpu_free.copy(), c.cpu_free.copy(), c.fingerprint.copy()
    with pytest.raises(ValueError, match="read-only"):
        scheduler_with(_Writes(how)).schedule(c, Workload("w", 1000, 1024, 1, 500))
    assert (c.gpu_free == before[0]).all() and (c.cpu_free == before[1]).all() and (c.fingerprint == before[2]).all()
    assert not c.allocations


@pytest.mark.parametrize("how", [
    lambda c: c.allocate(Allocation("sneak", 0, [0], [1000], 0, 0)),
    lambda c: c.release("anything"),
    lambda c: c.set_band(0, 0, None),
    lambda c: setattr(c, "gpu_free", np.zeros((2, 2), dtype=np.int64)),
    lambda c: c.allocations.pop("anything"),
    lambda c: c.names.append("n9"),
])
def test_the_snapshot_has_no_mutating_methods_and_its_attributes_and_containers_cannot_be_changed(how):
    c = cluster(2, 2)
    with pytest.raises((AttributeError, TypeError)):
        scheduler_with(_Writes(how)).schedule(c, Workload("w", 1000, 1024, 1, 500))
    assert not c.allocations and c.names == ["n0", "n1"]


def test_the_snapshot_shows_the_model_without_copying_and_the_reserve_is_the_frameworks():
    c = cluster(2, 2)
    seen = []
    plugin = _Writes(seen.append)
    s = scheduler_with(LeastAllocated(), plugin)
    d = s.schedule(c, Workload("a", 1000, 1024, 1, 500))
    snap = seen[0]
    assert snap is c.snapshot()  # one per cluster, brought up to date each cycle
    assert np.shares_memory(snap.gpu_free, c.gpu_free) and not snap.gpu_free.flags.writeable
    assert snap.gpu_free[d.allocation.node, d.allocation.gpus[0]] == 500  # the reserve shows through
    assert dict(snap.allocations) == {"a": d.allocation} and len(snap) == 2
    assert snap.allocated_gpu_milli == c.allocated_gpu_milli == 500


def test_reading_a_shape_nobody_runs_registers_nothing():
    c = cluster(2, 2)
    scheduler_with(Clustering()).schedule(c, Workload("big", 100000, 1024, 1, 300))  # fits nowhere: no reserve
    snap = c.snapshot()
    counts = snap.shape_count(1, 300)
    assert (counts == 0).all() and not counts.flags.writeable
    assert c._shapes == {}  # the plugin's read left the model as it was
    c.allocate(Allocation("x", 0, [0], [300], 0, 0))
    assert snap.shape_count(1, 300).tolist() == [1, 0]


def test_preemption_searches_the_snapshot_and_only_the_callers_evict_releases():
    c = cluster(1)
    low = Workload("low", 1000, 1024, 1, 1000, priority=PriorityLevel.LOW)
    c.allocate(Allocation("low", 0, [0], [1000], 1000, 1024))
    running = {"low": Running(low, c.allocations["low"], 0.0, 0.0, None)}
    evicted = []

    class Hooks:
        def evict(self, victim, preemptor, now):
            evicted.append(victim.workload.id)
            c.release(victim.workload.id)
            running.pop(victim.workload.id)

        def start(self, workload, decision, now):
            return True

        def blocked(self, workload, decision, now):
            pass

    high = Workload("high", 1000, 1024, 1, 1000, priority=PriorityLevel.HIGH)
    queue = QueueState([high], running, {}, None)
    schedule_pass(scheduler_with(LeastAllocated()), c, queue, QueuePolicy.kube(), Hooks(), PassStats(), 10.0)
    assert evicted == ["low"] and list(c.allocations) == ["high"]
    c.check_invariants()
