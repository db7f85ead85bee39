"""Start one stream worker: topics checked, /metrics served, the Faust worker run until a signal."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, start_http_server

from gpuaware.contract import topics
from gpuaware.plumbing.gc_policy import FreezeSurvivors
from gpuaware.plumbing.kafka_admin import (
    check_group,
    check_topics,
    default_replication_factor,
    ensure_topics,
    wait_ready,
)
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.stream.app import StreamWorker, internal_topics
from gpuaware.stream.identity import NodeVerifier, kube_review
from gpuaware.stream.metrics import StreamCollector, StreamStats
from gpuaware.stream.settings import StreamSettings

log = logging.getLogger(__name__)

# The contract's topics a worker reads or writes: checked at start, never created (no Create grant).
STREAM_TOPICS = tuple(topics.spec(name) for name in (
    topics.TELEMETRY, topics.EVENTS, topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST,
    topics.JOB_COMPLETIONS, topics.JOB_RUNTIME,
    topics.dlq_name(topics.TELEMETRY), topics.dlq_name(topics.EVENTS), topics.dlq_name(topics.JOB_COMPLETIONS),
))


async def prepare(kafka: KafkaSettings, settings: StreamSettings) -> StreamSettings:
    """Check the contract's topics and the consumer group; create the worker's internal topics
    (under its app id, which its grants cover) with the replication factor resolved; return
    ``settings`` with that factor set, for Faust."""
    await wait_ready(kafka)
    await check_topics(kafka, STREAM_TOPICS)
    await check_group(kafka, settings.app_id)
    replication = settings.replication_factor or await default_replication_factor(kafka)
    await ensure_topics(kafka, internal_topics(settings), replication_factor=replication)
    return settings.model_copy(update={"replication_factor": replication})


def node_verifier(settings: StreamSettings, stats: StreamStats) -> NodeVerifier | None:
    if settings.node_identity == "off":
        log.warning("node identity is not checked (stream.node_identity: off): any agent may speak for any node")
        return None
    from kubernetes.config import ConfigException

    from gpuaware.plumbing.kube.api import KubeApi, connect

    try:
        api = connect(settings.api_server)
    except (ConfigException, OSError) as exc:
        raise RuntimeError(
            f"stream.node_identity is required and no Kubernetes API is configured to check node tokens "
            f"with ({exc}): run in the cluster, set stream.api_server or KUBECONFIG, or, on a stack without an "
            f"apiserver, set stream.node_identity: off (any agent may then speak for any node, docs/security.md)"
        ) from exc
    return NodeVerifier(kube_review(KubeApi(api)), stats, settings.node_identity_users)


def run_worker(kafka: KafkaSettings, settings: StreamSettings, cluster: str, metrics_host: str, metrics_port: int,
               log_level: str = "info") -> None:
    stats = StreamStats()
    verifier = node_verifier(settings, stats)  # before Kafka: a worker that cannot check node tokens says so at once
    settings = asyncio.run(prepare(kafka, settings))
    # The heap is mostly the GPUs' trackers, kept while the worker holds their partitions: full collections walk
    # only what came since the last one, and partitions revoked (their trackers dropped) make the next one walk
    # everything (gpuaware.plumbing.gc_policy.FreezeSurvivors).
    survivors = FreezeSurvivors().install()
    worker = StreamWorker(kafka, settings, cluster, stats, verifier, after_revoke=survivors.reclaim)
    if metrics_port:
        registry = CollectorRegistry()
        registry.register(StreamCollector(stats, lambda: list(worker.processor.trackers.values()), worker.lag,
                                          demand_max_age_s=max(60.0, 3 * settings.cluster_forecast_interval_s)))
        registry.register(survivors)
        start_http_server(metrics_port, addr=metrics_host, registry=registry)
        log.info("serving /metrics on %s:%d", metrics_host, metrics_port)
    # The Faust worker owns the event loop and stops cleanly on SIGINT/SIGTERM.
    make_worker(worker.app, log_level).execute_from_commandline()


def make_worker(app: object, log_level: str) -> object:
    """The Faust worker, logging at ``log_level``.

    Without its terminal spinner: at WARNING and above Faust sets the root logger to DEBUG so the
    spinner turns on every record, and every debug record of aiokafka and Faust (several per
    message produced) was then built and handled: ~4 % of a busy worker's time (docs/performance.md).
    """
    import faust

    worker = faust.Worker(app, loglevel=log_level.upper(), quiet=True, redirect_stdouts=False)
    worker.spinner = None
    return worker
