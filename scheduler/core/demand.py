"""Demand-forecast-driven queueing: deferral and borrowing sized by the cluster demand forecast.

The stream forecasts the cluster's GPU demand (``cluster.forecast.v1``, per model: demand with an
interval, and capacity). ``outlook`` is the upper end of that forecast as a share of capacity, over the
planning horizon. With it, a pass

- defers deferrable work while the *forecast* is at or above the peak threshold (not only while the
  cluster is at it now: the peak is coming), and releases it as soon as the forecast drops below;
- closes borrowing for low-priority preemptible work beyond its tenant's quota while the forecast is
  at or above the peak, unless the work ends within the forecast horizon: work started on borrowed
  quota just before a peak, and still running in it, is what gets evicted there (GFS, 2025: -33%
  evictions from this kind of forecast).

Without a forecast (``None``: no stream, or stale) the pass uses the current allocation, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.queue import TenantLedger
from scheduler.core.workload import PriorityLevel, Workload

SIGNAL = "demand"


@dataclass(frozen=True)
class DemandOutlook:
    upper_share: float  # forecast upper bound of allocated GPU / capacity over the horizon
    horizon_s: float = 900.0

    def peak(self, peak_util: float) -> bool:
        return self.upper_share >= peak_util

    def blocks_borrowing(self, w: Workload, ledger: TenantLedger | None, peak_util: float) -> bool:
        return (self.peak(peak_util) and ledger is not None and w.preemptible and w.priority == PriorityLevel.LOW
                and (w.duration_s is None or w.duration_s > self.horizon_s) and not ledger.within_quota(w))
