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
