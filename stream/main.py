"""Start one stream worker: topics checked, /metrics served, the Faust worker run until a signal."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, start_http_server

from contract import topics
from plumbing.kafka_admin import ensure_topics, wait_ready
from plumbing.kafka_settings import KafkaSettings
from stream.app import create_app, internal_topics
from stream.metrics import StreamCollector, StreamStats
from stream.settings import StreamSettings

log = logging.getLogger(__name__)


def run_worker(kafka: KafkaSettings, settings: StreamSettings, cluster: str, metrics_host: str, metrics_port: int,
               log_level: str = "info") -> None:
    import faust

    async def prepare() -> None:
        await wait_ready(kafka)
        await ensure_topics(kafka, [*topics.ALL_TOPICS, *internal_topics(settings)])

    asyncio.run(prepare())
    stats = StreamStats()
    app, processor = create_app(kafka, settings, cluster, stats)
    if metrics_port:
        registry = CollectorRegistry()
        registry.register(StreamCollector(stats, lambda: list(processor.trackers.values()), app.gpuaware_lag))
        start_http_server(metrics_port, addr=metrics_host, registry=registry)
        log.info("serving /metrics on %s:%d", metrics_host, metrics_port)
    # The Faust worker owns the event loop and stops cleanly on SIGINT/SIGTERM.
    worker = faust.Worker(app, loglevel=log_level.upper(), quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
