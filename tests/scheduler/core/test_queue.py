"""The fair queue order."""

from __future__ import annotations

from gpuaware.scheduler.core.queue import Tenant, TenantLedger, fair_order
from gpuaware.scheduler.core.workload import Workload


def test_fair_order_is_priority_then_dominant_share_then_arrival():
    ledger = TenantLedger({"a": Tenant("a", 1.0), "b": Tenant("b", 1.0)}, 10_000, 100_000)
    ledger.charge(Workload("x", 0, 0, 4, 1000, tenant="a"))
    pending = [Workload("a1", num_gpu=1, tenant="a", submit_s=1), Workload("b1", num_gpu=1, tenant="b", submit_s=2),
               Workload("a0", num_gpu=1, tenant="a", priority=2, submit_s=3)]
    assert [w.id for w in fair_order(pending, ledger)] == ["a0", "b1", "a1"]
    assert [w.id for w in fair_order(pending, None)] == ["a0", "a1", "b1"]


def test_las_orders_by_attained_gpu_service_and_predicted_by_predicted_remaining_service():
    import math

    from gpuaware.scheduler.core.queue import queue_order
    from gpuaware.scheduler.core.runtime import RuntimeEstimate

    long = Workload("long", num_gpu=1, submit_s=0, runtime=RuntimeEstimate(math.log(7200.0), 0.5))
    short = Workload("short", num_gpu=1, submit_s=10, runtime=RuntimeEstimate(math.log(600.0), 0.5))
    wide = Workload("wide", num_gpu=8, submit_s=20, runtime=RuntimeEstimate(math.log(600.0), 0.5))
    pending = [long, short, wide]
    assert [w.id for w in queue_order(pending, "fifo", None, 100.0)] == ["long", "short", "wide"]
    assert [w.id for w in queue_order(pending, "las", None, 100.0, {"long": 500.0})] == ["short", "wide", "long"]
    # GPU service: 8 GPUs x 600 s is less than 1 x 7200 s; less than 1 x 600 s it is not.
    assert [w.id for w in queue_order(pending, "predicted", None, 100.0, aging_gpus=0.0)] == ["short", "wide", "long"]
    # Aging: a long job that has waited long enough goes before short work that has just come.
    fresh = Workload("fresh", num_gpu=1, submit_s=99_990, runtime=RuntimeEstimate(math.log(600.0), 0.5))
    assert queue_order([long, fresh], "predicted", None, 100_000.0, aging_gpus=1.0)[0].id == "long"
    assert queue_order([long, fresh], "predicted", None, 100_000.0, aging_gpus=0.0)[0].id == "fresh"
    # Priority always comes first.
    urgent = Workload("urgent", num_gpu=1, priority=2, submit_s=50, runtime=RuntimeEstimate(math.log(1e5), 0.5))
    assert queue_order([*pending, urgent], "predicted", None, 100.0)[0].id == "urgent"


def test_an_unknown_queue_order_is_refused_naming_the_known_ones():
    import pytest

    from gpuaware.scheduler.core.cycle import QueuePolicy
    from gpuaware.scheduler.core.queue import queue_order

    with pytest.raises(ValueError, match="fifo, las, predicted"):
        queue_order([], "sjf", None, 0.0)
    with pytest.raises(ValueError, match="order"):
        QueuePolicy(order="sjf")
