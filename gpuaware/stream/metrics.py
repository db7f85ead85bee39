"""Prometheus metrics of the stream workers: a custom Collector over plain counters.

The hot path only bumps integers in ``StreamStats``; metric families are built on scrape.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuaware.plumbing.metrics import Histogram, histogram_family
from gpuaware.stream.gpu_state import GpuTracker

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# How old the per-GPU families may be: a walk of 50,000 GPUs cost the worker about an eighth of a core at a 5 s
# refresh (docs/performance.md), and they move over minutes (a forecast error comes once a minute per GPU).
FLEET_EVERY_S = 30.0


@dataclass
class StreamStats:
    records: Counter = field(default_factory=Counter)  # topic -> records read
    dlq: Counter = field(default_factory=Counter)  # source topic -> records dead-lettered
    samples: int = 0
    points: int = 0  # light watch points applied (utilisation and power between full samples)
    duplicates: int = 0
    clock_skew_rejected: int = 0  # samples stamped too far ahead of the worker's clock
    identity_rejected: int = 0  # records whose node token does not prove their node (gpuaware.stream.identity)
    identity_review_errors: int = 0  # TokenReviews the apiserver could not answer (retried)
    gpu_claimed_elsewhere: int = 0  # batches naming a GPU another node reports (gpuaware.stream.processor)
    published: Counter = field(default_factory=Counter)  # output topic -> records written
    publish_failed: int = 0  # gpu.state.v1 records not encoded (processor), not taken or not delivered (publisher)
    changelog_failed: int = 0  # table changelog records not delivered, each sent again (gpuaware.stream.changelog)
    changelog_restored: Counter = field(default_factory=Counter)  # active|standby -> changelog records applied
    latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))  # sample to state
    _demand: list = field(default_factory=list, repr=False)
    demand_at: float = float("-inf")  # when the newest cluster forecast was made here (clock's time)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # the collector's clock

    @property
    def demand(self) -> list:
        """The newest cluster forecast's ModelDemand lines; only the demand topic's owner makes them."""
        return self._demand

    @demand.setter
    def demand(self, lines: list) -> None:
        self._demand = lines
        self.demand_at = self.clock()

    def observe_latency(self, seconds: float) -> None:
        self.latency.observe(seconds)


class StreamCollector(Collector):
    """``fleet_every_s``: the per-GPU families (forecast error, workload classes) walk every GPU the worker
    holds, a call per GPU (tens of ms at 16,000 GPUs, in the scrape's thread, holding the interpreter the
    worker needs); they are recomputed at most this often, so a scrape's cost does not grow with how often
    something scrapes (`bench stream` polls every 0.25 s: 5 % of a busy worker went to it). Scrapes that come while
    a walk is under way wait for it rather than walk too: each scrape has a thread of its own, and at 50,000 GPUs a
    walk outlasted the bench's 2 s polls, so walks piled up (docs/performance.md)."""

    def __init__(self, stats: StreamStats, trackers: Callable[[], Iterable[GpuTracker]],
                 lag: Callable[[], dict[tuple[str, int], int]], fleet_every_s: float = FLEET_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, demand_max_age_s: float = 60.0):
        self.stats = stats
        # A worker whose forecast is older stopped owning the demand topic (a rebalance moved it): exporting its
        # last figures beside the new owner's would double every model's line in a sum and break joins on model.
        self.demand_max_age_s = demand_max_age_s
        self.trackers = trackers
        self.lag = lag
        self.fleet_every_s = fleet_every_s
        self.clock = clock
        self._fleet: tuple[float, dict[tuple[str, int], float], Counter, int] | None = None
        self._walking = threading.Lock()

    def _fleet_figures(self, trackers: list[GpuTracker]) -> tuple[dict[tuple[str, int], float], Counter, int]:
        """Mean forecast error per (metric, horizon), GPUs per workload class and GPUs forecasting, at most
        ``fleet_every_s`` old."""
        with self._walking:
            now = self.clock()
            if self._fleet is not None and now - self._fleet[0] < self.fleet_every_s:
                return self._fleet[1:]
            return self._walk(trackers, now)

    def _walk(self, trackers: list[GpuTracker], now: float) -> tuple[dict[tuple[str, int], float], Counter, int]:
        errors: dict[tuple[str, int], list[float]] = {}
        classes: Counter = Counter()
        forecasting = 0
        for t in trackers:
            for key, err in t.forecast_abs_errors().items():
                errors.setdefault(key, []).append(err)
            classes[t.fingerprint.predict_one()[0]] += 1
            forecasting += t.forecasting
        mae = {key: sum(values) / len(values) for key, values in errors.items()}
        self._fleet = (now, mae, classes, forecasting)
        return mae, classes, forecasting

    def collect(self) -> Iterator:
        s = self.stats
        records = CounterMetricFamily("gpuaware_stream_records", "Records read, per topic", labels=["topic"])
        for topic, n in sorted(s.records.items()):
            records.add_metric([topic], n)
        yield records
        dlq = CounterMetricFamily("gpuaware_stream_dlq", "Records sent to the dead-letter topic, per source topic",
                                  labels=["topic"])
        for topic, n in sorted(s.dlq.items()):
            dlq.add_metric([topic], n)
        yield dlq
        yield CounterMetricFamily("gpuaware_stream_samples", "GPU samples applied to per-GPU state", value=s.samples)
        yield CounterMetricFamily("gpuaware_stream_duplicate_samples",
                                  "GPU samples recognised as already applied (replays)", value=s.duplicates)
        yield CounterMetricFamily("gpuaware_stream_clock_skew_rejected",
                                  "GPU samples rejected for a timestamp too far ahead of the worker's clock",
                                  value=s.clock_skew_rejected)
        yield CounterMetricFamily("gpuaware_stream_identity_rejected",
                                  "Records dead-lettered because their node token does not prove the node they name",
                                  value=s.identity_rejected)
        yield CounterMetricFamily("gpuaware_stream_identity_review_errors",
                                  "TokenReviews the apiserver could not answer (retried)",
                                  value=s.identity_review_errors)
        yield CounterMetricFamily("gpuaware_stream_gpu_claimed_elsewhere",
                                  "Telemetry batches dead-lettered for naming a GPU another node reports",
                                  value=s.gpu_claimed_elsewhere)
        published = CounterMetricFamily("gpuaware_stream_published", "Derived records written, per topic",
                                        labels=["topic"])
        for topic, n in sorted(s.published.items()):
            published.add_metric([topic], n)
        yield published
        yield CounterMetricFamily("gpuaware_stream_publish_failed",
                                  "GPU states that could not be encoded, or that the Kafka client did not take or "
                                  "could not deliver (each GPU's next state replaces a lost one)",
                                  value=s.publish_failed)
        yield CounterMetricFamily("gpuaware_stream_changelog_failed",
                                  "Table changelog records the Kafka client did not take or could not deliver (each "
                                  "sent again with the next take unless written again since)", value=s.changelog_failed)
        restored = CounterMetricFamily("gpuaware_stream_changelog_restored",
                                       "Changelog records applied to local table state, by the partition's role "
                                       "(active: recovery before processing; standby: the warm copy)", labels=["role"])
        for role in ("active", "standby"):
            restored.add_metric([role], s.changelog_restored[role])
        yield restored
        lag = GaugeMetricFamily("gpuaware_stream_consumer_lag", "Records not yet processed (log end - position)",
                                labels=["topic", "partition"])
        for (topic, partition), n in sorted(self.lag().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        yield histogram_family("gpuaware_stream_sample_to_state_seconds",
                               "From a sample's timestamp to its GPU state being published", {(): s.latency})
        demand = GaugeMetricFamily("gpuaware_cluster_demand_gpus",
                                   "Forecast GPU demand per model and horizon, in busy GPUs (mean and 80% bounds)",
                                   labels=["model", "horizon_s", "bound"])
        capacity = GaugeMetricFamily("gpuaware_cluster_capacity_gpus", "GPUs per model that are not critical",
                                     labels=["model"])
        lines = s.demand if self.clock() - s.demand_at <= self.demand_max_age_s else []
        for d in lines:
            for bound, value in (("mean", d.demand_gpus), ("lower", d.lower), ("upper", d.upper)):
                demand.add_metric([d.model, str(d.horizon_s), bound], value)
        for model, cap in sorted({d.model: d.capacity_gpus for d in lines}.items()):
            capacity.add_metric([model], cap)
        yield demand
        yield capacity
        trackers = list(self.trackers())
        yield GaugeMetricFamily("gpuaware_stream_gpus", "GPUs whose state this worker holds", value=len(trackers))
        errors, classes, forecasting = self._fleet_figures(trackers)
        yield GaugeMetricFamily("gpuaware_stream_gpus_forecasting", "GPUs whose forecasters are built (from their "
                                "first closed minute on; recomputed at most every 30 s)", value=forecasting)
        mae = GaugeMetricFamily("gpuaware_stream_forecast_mae", "Mean absolute error of recent forecasts",
                                labels=["metric", "horizon_minutes"])
        for (metric, horizon), value in sorted(errors.items()):
            mae.add_metric([metric, str(horizon)], value)
        yield mae
        by_class = GaugeMetricFamily("gpuaware_stream_workload_class_gpus", "GPUs per fingerprinted workload class",
                                     labels=["class"])
        for cls, n in sorted(classes.items()):
            by_class.add_metric([cls], n)
        yield by_class
