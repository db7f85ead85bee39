"""A histogram for custom Collectors: the hot path bumps a bucket count, the scrape builds the family.

prometheus_client's own ``Histogram`` registers itself and locks on every observation; components that
yield their families from a ``Collector`` keep plain counts instead and turn them into a
``HistogramMetricFamily`` on scrape. Buckets are upper bounds (``le``), as Prometheus has them; a
bound's label is ``str(bound)`` ("1" for 1, "0.5" for 0.5): what dashboards and alert rules query.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from prometheus_client.core import HistogramMetricFamily


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]):
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be increasing: {bounds}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bound >= value: le semantics
        self.sum += value
        self.count += 1

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs, +Inf last, as ``HistogramMetricFamily`` takes them."""
        out, running = [], 0
        for label, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((label, running))
        return out


def histogram_family(name: str, doc: str, series: dict[tuple[str, ...], Histogram],
                     labels: Sequence[str] = ()) -> HistogramMetricFamily:
    """One family of one histogram per label-value tuple (``{(): h}`` for an unlabelled one)."""
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, h in sorted(series.items()):
        family.add_metric(list(values), h.buckets(), h.sum)
    return family
