"""Demand-forecast-driven queueing: deferral and borrowing by the cluster demand forecast, else as before."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState, schedule_pass
from gpuaware.scheduler.core.demand import DemandOutlook
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.queue import Tenant, TenantLedger
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from tests.support import cluster


class Hooks:
    def __init__(self, pending, ledger):
        self.pending, self.ledger, self.started, self.why = pending, ledger, [], []

    def evict(self, victim, preemptor, now):
        raise AssertionError("no eviction expected")

    def start(self, w, d, now):
        self.pending.remove(w)
        self.ledger.charge(w, 1)
        self.started.append((w.id, d.signals))
        return True

    def blocked(self, w, d, now):
        self.why.append(d.signals)


def _pass(outlook, jobs, quota=4000, busy=0):
    """One pass on 4 one-GPU nodes, ``busy`` of them held by another tenant; the peak threshold is 0.5."""
    c = cluster(1, 1, 1, 1)
    for n in range(busy):
        c.allocate(Allocation(f"held{n}", n, [0], [1000], 0, 0))
    ledger = TenantLedger({"a": Tenant("a", 1.0, quota)}, c.total_gpu_milli, int(c.mem_cap.sum()))
    pending = list(jobs)
    hooks = Hooks(pending, ledger)
    sched = Scheduler(profile("gpuaware", WorkloadMix.of(jobs)))
    stats = PassStats()
    schedule_pass(sched, c, QueueState(pending, {}, {}, ledger, demand=outlook),
                  QueuePolicy(demand_aware=True, peak_util=0.5), hooks, stats, now=0.0)
    return hooks, stats


def _low(i, deferrable=False, duration=3600.0):
    return Workload(f"j{i}", 0, 0, 1, 1000, tenant="a", priority=PriorityLevel.LOW, deferrable=deferrable,
                    duration_s=duration)


def test_at_the_peak_deferrable_work_waits_when_the_forecast_shows_the_peak_passing():
    hooks, stats = _pass(DemandOutlook(0.6, mean_share=0.4), [_low(0, deferrable=True), _low(1)], busy=2)
    assert [j for j, _ in hooks.started] == ["j1"] and stats.deferred == {"j0"} and stats.held_by_demand == 1
    assert hooks.started[0][1] == ["demand"]


def test_at_the_peak_deferrable_work_starts_when_the_forecast_holds_the_peak_through_the_horizon():
    # Regression: deferring whenever the forecast's upper end was at the peak deferred work through peaks that
    # last hours (the loaded ablation cluster): it only delayed the work, and cost mean JCT.
    hooks, stats = _pass(DemandOutlook(0.9, mean_share=0.7), [_low(0, deferrable=True), _low(1)], busy=2)
    assert [j for j, _ in hooks.started] == ["j0", "j1"] and not stats.deferred


def test_below_the_peak_the_forecast_defers_nothing_rising_or_falling():
    for outlook in (DemandOutlook(0.95, mean_share=0.9), DemandOutlook(0.3, mean_share=0.2)):
        hooks, stats = _pass(outlook, [_low(0, deferrable=True), _low(1)])
        assert [j for j, _ in hooks.started] == ["j0", "j1"] and not stats.deferred and not stats.held_by_demand


def test_a_forecast_peak_closes_borrowing_for_long_low_priority_work_only():
    jobs = [_low(0), _low(1, duration=600.0), _low(2)]  # quota 1 GPU: j1 and j2 would borrow
    hooks, stats = _pass(DemandOutlook(0.95, mean_share=0.95, horizon_s=900.0), jobs, quota=1000)
    assert [j for j, _ in hooks.started] == ["j0", "j1"] and stats.held_by_demand == 1  # j1 ends before the peak


def test_without_a_forecast_the_pass_uses_the_allocation_now():
    hooks, stats = _pass(None, [_low(0, deferrable=True), _low(1), _low(2)], quota=1000)
    assert [j for j, _ in hooks.started] == ["j0", "j1", "j2"] and not stats.deferred and not stats.held_by_demand
    assert all(signals == [] for _, signals in hooks.started)
