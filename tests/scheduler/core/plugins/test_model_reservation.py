"""Reserving a scarce model's GPUs for the work only it can serve."""

from __future__ import annotations

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.plugins.model_reservation import ModelReservation
from gpuaware.scheduler.core.workload import Workload
from tests.support import scheduler_with


def test_model_reservation_keeps_a_scarce_models_gpus_for_the_work_only_it_can_serve():
    c = ClusterState([NodeSpec("t4", 32000, 65536, 2, "T4"), NodeSpec("g2", 32000, 65536, 8, "G2")])
    reserve = ModelReservation({frozenset({"T4"}): 0.5})
    anywhere = Workload("any", 1000, 1024, 1, 1000)
    # Half the demand needs a T4 and only two of ten GPUs are T4s: work that could run anywhere goes elsewhere
    d = scheduler_with(reserve, LeastAllocated()).schedule(c, anywhere)
    assert c.names[d.allocation.node] == "g2"
    # ... while a T4-only workload is not held back by its own reservation
    ctx = CycleContext(c, Workload("t4-only", 1000, 1024, 1, 1000, models=("T4",)))
    assert not reserve.score(ctx, Candidates(np.array([0, 0]), np.array([0, 1]))).any()
    # Sharing a GPU already in use takes no whole T4 and costs nothing; the last whole T4 falls short of
    # half of the 7 whole GPUs left after it
    c.allocate(Allocation("half", 0, [0], [500], 1000, 1024))
    ctx = CycleContext(c, Workload("small", 1000, 1024, 1, 300))
    assert reserve.score(ctx, Candidates(np.array([0, 0]), np.array([0, 1]))).tolist() == [0.0, -3500.0]
    # With no constrained demand the score is flat
    flat = ModelReservation({}).score(CycleContext(c, anywhere), Candidates(np.array([0, 1]), np.array([1, 0])))
    assert not flat.any()
