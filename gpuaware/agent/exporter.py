"""Prometheus ``/metrics`` for the agent: dcgm-exporter-compatible GPU metrics plus gpuaware's own.

A custom Collector builds metric families from the agent's last readings at scrape time; the
sampling loop never formats text. The DCGM families (:mod:`gpuaware.agent.dcgm`) keep dcgm-exporter's
names, labels and ``# TYPE`` (counters where its CSV says counter, written without ``_total`` as
dcgm-exporter writes them, which prometheus_client's own text encoder cannot do: hence
:func:`render` and :func:`serve`). The node label of every family follows the schema
(``Hostname`` legacy, ``hostname`` 4.9 and 4.10).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from gpuaware.agent.core import AgentCore
from gpuaware.agent.dcgm import DcgmCounter, DcgmFamilies
from gpuaware.agent.podresources import PodAttribution
from gpuaware.agent.verdict_metrics import verdict_families
from gpuaware.contract.dcgm import LEGACY, Schema


@dataclass
class AgentStats:
    """The agent's own cost and delivery counters (filled by the publisher)."""

    bytes_sent: int = 0
    records_sent: int = 0
    publish_errors: int = 0
    publish_auth_errors: int = 0  # of publish_errors: credentials or ACLs refused
    spool_depth: Callable[[], int] = lambda: 0
    spool_bytes: Callable[[], int] = lambda: 0
    dropped: Callable[[], int] = lambda: 0
    spool_corrupt: Callable[[], int] = lambda: 0
    spool_write_errors: Callable[[], int] = lambda: 0
    spool_held: Callable[[], int] = lambda: 0
    policy_errors: int = 0
    policy_reloads: int = 0
    control_commands: dict[str, int] = field(default_factory=dict)
    control_rejected: dict[str, int] = field(default_factory=dict)  # reason -> control records skipped
    cordon_read_errors: int = 0
    task_restarts: dict[str, int] = field(default_factory=dict)  # task -> restarts after an unexpected error


class AgentCollector(Collector):
    def __init__(self, cores: Iterable[AgentCore], stats: AgentStats, pods: PodAttribution | None = None,
                 schema: Schema = LEGACY, prefixed: bool = False, label_budget: int = 30,
                 pod_labels: Sequence[str] = ()):
        self.cores = list(cores)
        self.stats = stats
        self.dcgm = DcgmFamilies(schema, prefixed, pods, label_budget, pod_labels)

    def collect(self) -> Iterator[Metric]:
        yield from self.dcgm.collect(self.cores)
        node = self.dcgm.node_label
        rows = [(core, t) for core in self.cores for t in core.tracks]
        glabels = ["gpu", "UUID", node, "modelName"]
        health = GaugeMetricFamily("gpuaware_gpu_health_score", "GPU health score, 0 (failed) to 100.",
                                   labels=glabels)
        band = GaugeMetricFamily("gpuaware_gpu_health_band",
                                 "1 for the GPU's current health band (healthy, degraded, critical).",
                                 labels=[*glabels, "band"])
        comp = GaugeMetricFamily("gpuaware_gpu_health_component",
                                 "Health of one component, 100 = no penalty.", labels=[*glabels, "component"])
        anomaly = GaugeMetricFamily("gpuaware_gpu_anomaly_score", "Latest score of each edge detector.",
                                    labels=[*glabels, "detector"])
        interval = GaugeMetricFamily("gpuaware_agent_sampling_interval_seconds",
                                     "Current full-sample interval of the GPU.", labels=glabels)
        events = CounterMetricFamily("gpuaware_agent_events", "Edge events raised, by kind.",
                                     labels=[*glabels, "kind"])
        xids = CounterMetricFamily("gpuaware_agent_xid_errors", "XID errors the driver reported, by code.",
                                   labels=[*glabels, "xid"])
        lost = GaugeMetricFamily("gpuaware_gpu_lost", "1 when the GPU stopped answering.", labels=glabels)
        cordoned = GaugeMetricFamily("gpuaware_gpu_cordoned",
                                     "1 while the node's gpuaware.io/cordoned-gpus annotation names the GPU.",
                                     labels=glabels)
        for core, track in rows:
            gl = [str(track.device.index), track.device.uuid, core.node, track.device.model]
            health.add_metric(gl, track.health.score)
            band.add_metric([*gl, track.health.band.value.lower()], 1.0)
            for c, v in track.health.components().items():
                comp.add_metric([*gl, c], v)
            for det, v in track.detectors.scores().items():
                anomaly.add_metric([*gl, det], v)
            interval.add_metric(gl, track.sampler.interval)
            for kind, n in track.events.items():
                events.add_metric([*gl, str(kind).lower()], n)
            for code, n in sorted(track.xids.items()):
                xids.add_metric([*gl, str(code)], n)
            lost.add_metric(gl, 1.0 if track.lost else 0.0)
            cordoned.add_metric(gl, 1.0 if track.cordoned else 0.0)
        yield from (health, band, comp, anomaly, interval, events, xids, lost, cordoned)
        yield from verdict_families(self.cores, node)

        nl = [node]
        samples = CounterMetricFamily("gpuaware_agent_samples", "Full GPU samples taken.", labels=nl)
        watch = CounterMetricFamily("gpuaware_agent_watch_reads", "Cheap watch reads taken.", labels=nl)
        for core in self.cores:
            samples.add_metric([core.node], core.samples_taken)
            watch.add_metric([core.node], core.watch_reads)
        yield samples
        yield watch
        s = self.stats
        yield CounterMetricFamily("gpuaware_agent_bytes_sent", "Bytes of record values and keys delivered to Kafka.",
                                  value=s.bytes_sent)
        yield CounterMetricFamily("gpuaware_agent_records_sent", "Records delivered to Kafka.", value=s.records_sent)
        yield CounterMetricFamily("gpuaware_agent_cordon_read_errors",
                                  "Failed reads of the node's cordoned-GPU annotation (the last known cordons stand).",
                                  value=s.cordon_read_errors)
        yield CounterMetricFamily("gpuaware_agent_publish_errors", "Failed delivery attempts (retried from the spool).",
                                  value=s.publish_errors)
        yield CounterMetricFamily("gpuaware_agent_publish_auth_errors",
                                  "Delivery attempts refused for credentials or ACLs (retried with a long back-off).",
                                  value=s.publish_auth_errors)
        restarts = CounterMetricFamily("gpuaware_agent_task_restarts",
                                       "Agent tasks restarted after an unexpected error, by task.", labels=["task"])
        for task, n in sorted(s.task_restarts.items()):
            restarts.add_metric([task], n)
        yield restarts
        yield GaugeMetricFamily("gpuaware_agent_spool_depth", "Records waiting in the disk spool.",
                                value=s.spool_depth())
        yield GaugeMetricFamily("gpuaware_agent_spool_bytes", "Bytes in the disk spool.", value=s.spool_bytes())
        yield CounterMetricFamily("gpuaware_agent_spool_dropped",
                                  "Records dropped from the spool (oldest first, only past its bound).",
                                  value=s.dropped())
        yield CounterMetricFamily("gpuaware_agent_spool_corrupt",
                                  "Torn or corrupt spool records skipped and quarantined.", value=s.spool_corrupt())
        yield CounterMetricFamily("gpuaware_agent_spool_write_errors",
                                  "Spool writes the disk refused (full or failing); the records are held in memory.",
                                  value=s.spool_write_errors())
        yield GaugeMetricFamily("gpuaware_agent_spool_held",
                                "Records held in memory until the disk takes spool writes again.", value=s.spool_held())
        yield CounterMetricFamily("gpuaware_agent_policy_errors", "Sampling policies rejected.",
                                  value=s.policy_errors)
        yield CounterMetricFamily("gpuaware_agent_policy_reloads", "Sampling policies applied.",
                                  value=s.policy_reloads)
        rejected = CounterMetricFamily("gpuaware_agent_control_rejected",
                                       "Control records skipped (undecodable, or an error applying them), by reason.",
                                       labels=["reason"])
        for reason, n in sorted(s.control_rejected.items()):
            rejected.add_metric([reason], n)
        yield rejected


def render(registry: Collector) -> bytes:
    """The text exposition, with DCGM counters typed ``counter`` under their own names."""
    counters: list[str] = []

    class AsGauges:
        def collect(self) -> Iterator[Metric]:
            for m in registry.collect():
                if isinstance(m, DcgmCounter):
                    counters.append(m.name)
                    g = Metric(m.name, m.documentation, "gauge")
                    g.samples = m.samples
                    m = g
                yield m

    text = generate_latest(AsGauges()).decode()  # type: ignore[arg-type]
    for name in counters:
        text = text.replace(f"# TYPE {name} gauge\n", f"# TYPE {name} counter\n", 1)
    return text.encode()


def serve(registry: Collector, host: str, port: int) -> threading.Thread:
    """``/metrics`` over HTTP in a daemon thread (prometheus_client's threaded WSGI server)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer

    def app(environ, start_response):
        body = render(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))])
        return [body]

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return thread
