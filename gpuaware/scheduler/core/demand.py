"""Demand-forecast-driven queueing: deferral and borrowing sized by the cluster demand forecast.

The stream forecasts the cluster's GPU demand (``cluster.forecast.v1``, per model: demand with an
interval, and capacity). ``outlook`` is that forecast as a share of capacity over the planning horizon:
its point (``mean_share``) and its upper end (``upper_share``). With it, a pass

- sizes deferral windows by it: deferrable work waits while the cluster is at its peak threshold *and*
  the forecast shows it coming off the peak within the horizon, so the work starts in the room the peak
  leaves. While the forecast holds the peak through the horizon, deferring only delays the work: it
  starts, as non-deferrable work does. The first version deferred whenever the forecast's upper end was
  at the peak; on the loaded ablation cluster, which is at its peak for hours, that deferred more work
  for longer than deferring by the allocation now and cost mean JCT (docs/scheduling.md "The ablation");
- closes borrowing for low-priority preemptible work beyond its tenant's quota while the forecast's
  upper end is at or above the peak, unless the work ends within the forecast horizon: work started on
  borrowed quota just before a peak, and still running in it, is what gets evicted there (GFS, 2025:
  -33% evictions from this kind of forecast).

Without a forecast (``None``: no stream, or stale) the pass uses the current allocation, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuaware.scheduler.core.queue import TenantLedger
from gpuaware.scheduler.core.runtime import expected_duration
from gpuaware.scheduler.core.workload import PriorityLevel, Workload

SIGNAL = "demand"


@dataclass(frozen=True)
class DemandOutlook:
    upper_share: float  # forecast upper bound of allocated GPU / capacity over the horizon
    mean_share: float  # the point forecast, the same way
    horizon_s: float = 900.0

    def peak(self, peak_util: float) -> bool:
        return self.upper_share >= peak_util

    def defers(self, now_share: float, peak_util: float) -> bool:
        """At the peak now, and forecast to come off it within the horizon: deferrable work should wait."""
        return now_share >= peak_util > self.mean_share

    def blocks_borrowing(self, w: Workload, ledger: TenantLedger | None, peak_util: float) -> bool:
        return (self.peak(peak_util) and ledger is not None and w.preemptible and w.priority == PriorityLevel.LOW
                and expected_duration(w.runtime, w.duration_s) > self.horizon_s and not ledger.within_quota(w))
