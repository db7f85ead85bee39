"""The scheduler's Prometheus metrics: counters kept by the loop, families yielded on scrape.

Names (``gpuaware_scheduler_*``) are what the scheduler dashboard and the alert rules query.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuaware.plumbing.metrics import Histogram, histogram_family
from gpuaware.scheduler.catchup import CatchUp
from gpuaware.scheduler.core.workload import PriorityLevel
from gpuaware.scheduler.forecast_quality import ForecastQuality
from gpuaware.scheduler.runtimes import RuntimeTable

PRIORITY_NAMES = {level: level.label for level in reversed(PriorityLevel)}
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)
# Mean time between interventions on a node (hours to a week) and to repair a GPU (minutes to a day).
MTBI_BUCKETS = (600, 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 3.5 * 86400, 7 * 86400)
MTTR_BUCKETS = (60, 300, 600, 1800, 3600, 2 * 3600, 4 * 3600, 12 * 3600, 86400)
POD_DECISIONS_KEPT = 500  # pods whose last decision is exported (the most recent), one series each


@dataclass
class SchedulerStats:
    decisions: Counter = field(default_factory=Counter)  # (action, reason)
    pass_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    decision_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    bind_latency: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue_wait: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # (tenant, priority)
    api_errors: Counter = field(default_factory=Counter)  # (verb, code)
    events_waiting: int = 0  # Events queued, not yet taken by a writer (gpuaware.scheduler.kube.calls)
    events_dropped: Counter = field(default_factory=Counter)  # reason -> Events not written: lane full, or not leading
    extender_requests: Counter = field(default_factory=Counter)  # (verb, HTTP status) answered to kube-scheduler
    leader: bool = False
    feed_records: int = 0
    feed_dead_lettered: int = 0
    feed_skew_rejected: int = 0
    feed_errors: int = 0  # state feed errors after catch-up, each retried
    feed_silent_s: float = 0.0  # since the feed delivered its last record
    feed_outage: bool = False  # silent past stale_after_s: placing on last known health (gpuaware.scheduler.feed)
    feed_failed: bool = False  # the feed task ended: the scheduler stops
    feed_catch_up: CatchUp | None = None  # the state feed's catch-up (StateFeed.progress), read on scrape
    decision_latencies: deque = field(default_factory=lambda: deque(maxlen=100_000))  # raw, for benchmarks
    steered: Counter = field(default_factory=Counter)  # stream signal -> placements it changed
    steered_placements: int = 0  # placements some stream signal changed
    mtbi: Histogram = field(default_factory=lambda: Histogram(MTBI_BUCKETS))  # gaps between a node's remediations
    mttr: Histogram = field(default_factory=lambda: Histogram(MTTR_BUCKETS))  # cordon to back in service
    lemon_nodes: set[str] = field(default_factory=set)  # >= 5 remediations in 7 days (gpuaware.scheduler.core.breaker)
    remediation_gpus: Counter = field(default_factory=Counter)  # chain step -> GPUs in it
    # "namespace/name" -> (action, first reason, node, unix time) of each recent pod's last decision, oldest first
    pod_decisions: OrderedDict = field(default_factory=OrderedDict)

    def pod_decided(self, key: str, action: str, reason: str, node: str | None, at_s: float) -> None:
        """A pod's latest decision, for the dashboards' per-pod view (bounded: the latest POD_DECISIONS_KEPT pods)."""
        self.pod_decisions.pop(key, None)
        self.pod_decisions[key] = (action, reason[:80], node or "", at_s)
        while len(self.pod_decisions) > POD_DECISIONS_KEPT:
            self.pod_decisions.popitem(last=False)
    forecasts: ForecastQuality = field(default_factory=ForecastQuality)  # completions against their estimates
    runtimes: RuntimeTable | None = None  # job.runtime.v1 as the feed keeps it (none without Kafka)

    def stream_steered(self, signals: list[str]) -> None:
        """A placement that, without these stream signals' scores, would have gone elsewhere."""
        if signals:
            self.steered_placements += 1
            self.steered.update(signals)

    def by_action(self) -> Counter:
        """Decisions per action, over every reason."""
        out: Counter = Counter()
        for (action, _), n in self.decisions.items():
            out[action] += n
        return out

    def waited(self, tenant: str, priority: int, seconds: float) -> None:
        key = (tenant, PRIORITY_NAMES.get(priority, str(priority)))
        self.queue_wait.setdefault(key, Histogram(WAIT_BUCKETS)).observe(max(0.0, seconds))


@dataclass
class QueueSnapshot:
    """What the loop last saw, for gauges: pending per (tenant, priority), quota use, fairness."""

    pending: dict[tuple[str, str], int] = field(default_factory=dict)
    oldest_wait_s: dict[tuple[str, str], float] = field(default_factory=dict)
    gpus_used: dict[str, float] = field(default_factory=dict)  # tenant -> GPUs (milli / 1000)
    gpus_quota: dict[str, float] = field(default_factory=dict)
    gpus_borrowed: dict[str, float] = field(default_factory=dict)
    jain: float | None = None
    running: int = 0
    stale_gpus: int = 0
    cordoned_gpus: int = 0
    allocated_gpu_share: float = 0.0
    allocated_busy_ratio: float | None = None  # live utilisation of allocated GPUs, weighted by allocated share


class SchedulerCollector(Collector):
    def __init__(self, stats: SchedulerStats, snapshot: Callable[[], QueueSnapshot]):
        self.stats, self.snapshot = stats, snapshot

    @staticmethod
    def _queue_families(snap: QueueSnapshot) -> Iterator:
        """The loop's view of queues, quotas and GPUs. Only the leader exports it: every replica keeps the same
        view from its own watches, and both exporting it doubled each sum on the scheduler dashboard."""
        pending = GaugeMetricFamily("gpuaware_scheduler_pending_pods", "Pods waiting for placement",
                                    labels=["tenant", "priority"])
        oldest = GaugeMetricFamily("gpuaware_scheduler_oldest_pending_seconds", "Age of the oldest waiting pod",
                                   labels=["tenant", "priority"])
        for key, n in sorted(snap.pending.items()):
            pending.add_metric(list(key), n)
            oldest.add_metric(list(key), snap.oldest_wait_s.get(key, 0.0))
        yield pending
        yield oldest
        for name, doc, values in (
            ("gpuaware_scheduler_tenant_gpus", "GPUs allocated to the tenant's pods", snap.gpus_used),
            ("gpuaware_scheduler_tenant_quota_gpus", "The tenant's guaranteed GPUs (GPUQueue quota)", snap.gpus_quota),
            ("gpuaware_scheduler_tenant_borrowed_gpus", "GPUs the tenant uses beyond its quota", snap.gpus_borrowed),
        ):
            fam = GaugeMetricFamily(name, doc, labels=["tenant"])
            for tenant, v in sorted(values.items()):
                fam.add_metric([tenant], v)
            yield fam
        if snap.allocated_busy_ratio is not None:
            yield GaugeMetricFamily("gpuaware_scheduler_allocated_busy_ratio",
                                    "GPU busy time as a share of allocated time (live utilisation of allocated GPUs)",
                                    value=snap.allocated_busy_ratio)
        if snap.jain is not None:
            yield GaugeMetricFamily("gpuaware_scheduler_jain_fairness",
                                    "Jain's index over tenants' weighted GPU shares (1 = fair)", value=snap.jain)
        for name, doc, v in (
            ("gpuaware_scheduler_running_pods", "Pods holding GPUs or CPU in the scheduler's model", snap.running),
            ("gpuaware_scheduler_stale_gpus", "GPUs whose live state is older than the staleness bound",
             snap.stale_gpus),
            ("gpuaware_scheduler_cordoned_gpus", "GPUs that take no new work", snap.cordoned_gpus),
            ("gpuaware_scheduler_allocated_gpu_ratio", "Allocated share of the cluster's GPU capacity",
             snap.allocated_gpu_share),
        ):
            yield GaugeMetricFamily(name, doc, value=v)

    @staticmethod
    def _pod_decisions(s: SchedulerStats) -> GaugeMetricFamily:
        """Each recent pod's last decision (leader only: it is the one deciding), the target of the dashboards'
        per-pod data links; its history in Prometheus is the pod's sequence of decisions."""
        fam = GaugeMetricFamily("gpuaware_scheduler_pod_decision_timestamp_seconds",
                                "Unix time of the pod's last scheduling decision, with its action, first reason "
                                f"and node (the latest {POD_DECISIONS_KEPT} pods)",
                                labels=["namespace", "pod", "action", "reason", "node"])
        for key, (action, reason, node, at_s) in list(s.pod_decisions.items()):
            namespace, _, name = key.rpartition("/")
            fam.add_metric([namespace, name, action, reason, node], at_s)
        return fam

    @staticmethod
    def _runtime_families(s: SchedulerStats, now: float) -> Iterator:
        """Job runtimes: completions published, the runtime table, and the placed estimates against the runtimes
        completed (``gpuaware.scheduler.forecast_quality``; the leader's: only it places and publishes)."""
        q = s.forecasts.summary()
        yield CounterMetricFamily("gpuaware_scheduler_completions_published",
                                  "Job completions published on job.completions.v1", value=q["published"])
        yield CounterMetricFamily("gpuaware_scheduler_completions_unscored",
                                  "Completions of pods placed with no runtime estimate", value=q["unscored"])
        if s.runtimes is not None:
            yield GaugeMetricFamily("gpuaware_scheduler_runtime_keys",
                                    "Signature keys in the job runtime table (job.runtime.v1)",
                                    value=len(s.runtimes.stats))
            if s.runtimes.newest_ms:
                yield GaugeMetricFamily("gpuaware_scheduler_runtime_newest_age_seconds",
                                        "Age of the newest job runtime record (the end of the newest completion "
                                        "learned)", value=max(0.0, now - s.runtimes.newest_ms / 1000))
        yield GaugeMetricFamily("gpuaware_scheduler_forecast_window_completions",
                                "Completions scored in the forecast quality window (last 500)",
                                value=q["completions"])
        yield GaugeMetricFamily("gpuaware_scheduler_forecast_judged_completions",
                                "Completions in the window placed with a learned estimate (forecast or calibrated): "
                                "what the rank correlation and p90 coverage are over",
                                value=q["judged"])
        if q["spearman"] is not None:
            yield GaugeMetricFamily("gpuaware_scheduler_forecast_spearman",
                                    "Rank correlation of predicted p50 and actual runtime over the window's "
                                    "learned estimates",
                                    value=q["spearman"])
        if q["p90_coverage"] is not None:
            yield GaugeMetricFamily("gpuaware_scheduler_forecast_p90_coverage",
                                    "Share of the window's runtimes placed with a learned estimate at or below "
                                    "their predicted p90 (0.9: calibrated)",
                                    value=q["p90_coverage"])
        mae = GaugeMetricFamily("gpuaware_scheduler_forecast_mae_log",
                                "Mean absolute error of log runtime against the predicted p50, by signature level",
                                labels=["level"])
        for lvl, v in q["mae_log"].items():
            mae.add_metric([lvl], v)
        yield mae

    def collect(self) -> Iterator:
        s = self.stats
        yield from self._runtime_families(s, time.time())
        dec = CounterMetricFamily("gpuaware_scheduler_decisions", "Scheduling decisions by action and reason",
                                  labels=["action", "reason"])
        for (action, reason), n in sorted(s.decisions.items()):
            dec.add_metric([action, reason], n)
        yield dec
        yield histogram_family("gpuaware_scheduler_decision_latency_seconds",
                               "Time of one scheduling cycle (filter, score, reserve)", {(): s.decision_latency})
        yield histogram_family("gpuaware_scheduler_pass_latency_seconds", "Time of one pass over the queue",
                               {(): s.pass_latency})
        yield histogram_family("gpuaware_scheduler_bind_latency_seconds",
                               "Annotate + Binding + Event API calls of one placement", {(): s.bind_latency})
        yield histogram_family("gpuaware_scheduler_queue_wait_seconds",
                               "Pod creation to placement, per tenant and priority", s.queue_wait,
                               labels=["tenant", "priority"])
        yield histogram_family("gpuaware_scheduler_remediation_mtbi_seconds",
                               "Time between two GPU remediations on the same node (MTBI)", {(): s.mtbi})
        yield histogram_family("gpuaware_scheduler_remediation_mttr_seconds",
                               "A GPU's time out of service for its health, cordon to validated return (MTTR)",
                               {(): s.mttr})
        lemon = GaugeMetricFamily("gpuaware_scheduler_lemon_node",
                                  "1 for a node with 5 or more GPU remediations in 7 days", labels=["node"])
        for node in sorted(s.lemon_nodes):
            lemon.add_metric([node], 1)
        yield lemon
        chain = GaugeMetricFamily("gpuaware_scheduler_remediation_gpus",
                                  "GPUs out of service for their health, by remediation step", labels=["step"])
        for step in ("draining", "requested", "validating"):
            chain.add_metric([step], s.remediation_gpus.get(step, 0))
        yield chain
        yield GaugeMetricFamily("gpuaware_scheduler_leader", "1 while this replica holds the scheduling lease",
                                value=int(s.leader))
        if s.leader:
            yield from self._queue_families(self.snapshot())
            yield self._pod_decisions(s)
        errors = CounterMetricFamily("gpuaware_scheduler_api_errors", "Failed Kubernetes API calls",
                                     labels=["verb", "code"])
        for (verb, code), n in sorted(s.api_errors.items()):
            errors.add_metric([verb, str(code)], n)
        yield errors
        yield GaugeMetricFamily("gpuaware_scheduler_events_waiting",
                                "Events queued and not yet being written (event_qps, event_queue)",
                                value=s.events_waiting)
        dropped = CounterMetricFamily("gpuaware_scheduler_events_dropped",
                                      "Events not written, by reason: event_queue of their kind already waited, or "
                                      "the replica stopped leading; the decisions stay on scheduler.decisions.v1",
                                      labels=["reason"])
        for reason, n in sorted(s.events_dropped.items()):
            dropped.add_metric([reason], n)
        yield dropped
        ext = CounterMetricFamily("gpuaware_scheduler_extender_requests",
                                  "Extender requests answered, by verb and HTTP status", labels=["verb", "code"])
        for (verb, code), n in sorted(s.extender_requests.items()):
            ext.add_metric([verb, str(code)], n)
        yield ext
        yield CounterMetricFamily("gpuaware_scheduler_feed_records", "State records read from Kafka",
                                  value=s.feed_records)
        yield CounterMetricFamily("gpuaware_scheduler_feed_dead_lettered",
                                  "State records sent to a DLQ (undecodable)", value=s.feed_dead_lettered)
        yield CounterMetricFamily("gpuaware_scheduler_feed_clock_skew_rejected",
                                  "State records ignored for a timestamp too far ahead of the scheduler's clock",
                                  value=s.feed_skew_rejected)
        yield CounterMetricFamily("gpuaware_scheduler_feed_errors",
                                  "State feed errors after catch-up (each retried)", value=s.feed_errors)
        yield GaugeMetricFamily("gpuaware_scheduler_feed_silent_seconds",
                                "Seconds since the state feed delivered its last record", value=s.feed_silent_s)
        yield GaugeMetricFamily("gpuaware_scheduler_feed_outage",
                                "1 while the state feed is silent past stale_after_s: placement uses the last known "
                                "health with every GPU assumed busy", value=int(s.feed_outage))
        if s.feed_catch_up is not None:
            c = s.feed_catch_up
            for name, doc, v in (
                ("gpuaware_scheduler_feed_catch_up_ratio",
                 "Share of the state topics read on (re)start, up to the log ends seen then (1 = caught up)", c.ratio),
                ("gpuaware_scheduler_feed_catch_up_remaining_records",
                 "Offsets of the state topics still to read before the scheduler is ready", c.remaining),
                ("gpuaware_scheduler_feed_catch_up_records_per_second",
                 "Rate of the state feed's catch-up since it started", c.rate),
            ):
                yield GaugeMetricFamily(name, doc, value=v)
