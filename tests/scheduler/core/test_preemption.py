"""Victim selection: lower priority only, least work lost, and reclaim of borrowed quota."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.preemption import Running, select_victims
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster


def _running(wid: str, node: int, gpu: int, prio: int, lost_s: float, now: float = 1000.0, **kw) -> Running:
    w = Workload(wid, 1000, 1024, 1, 1000, priority=prio, **kw)
    return Running(w, Allocation(wid, node, [gpu], [1000], 1000, 1024), now - lost_s, 0.0, None)


def test_preemption_evicts_the_cheapest_lower_priority_victims_only():
    c = cluster(2, 2)
    running = {}
    for r in (_running("low-young", 0, 0, 0, 10), _running("low-old", 0, 1, 0, 900),
              _running("high", 1, 0, 2, 5), _running("low-b", 1, 1, 0, 500)):
        c.allocate(r.allocation)
        running[r.workload.id] = r
    urgent = Workload("urgent", 1000, 1024, 1, 1000, priority=2)
    node, victims = select_victims(c, urgent, running, now=1000.0)
    assert [v.workload.id for v in victims] == ["low-young"]  # least work lost
    assert node == 0
    peer = Workload("peer", 1000, 1024, 1, 1000, priority=0)
    assert select_victims(c, peer, running, now=1000.0) is None  # never equal or higher priority


def test_borrowed_work_is_reclaimed_for_a_tenant_within_quota():
    c = cluster(1)
    r = _running("borrowed", 0, 0, 1, 100, tenant="team-b")
    r.borrowed = True
    c.allocate(r.allocation)
    owner = Workload("owner", 1000, 1024, 1, 1000, priority=1, tenant="team-a")
    assert select_victims(c, owner, {"borrowed": r}, 1000.0) is None
    _, victims = select_victims(c, owner, {"borrowed": r}, 1000.0, reclaimable=lambda v: v.borrowed)
    assert [v.workload.id for v in victims] == ["borrowed"]
