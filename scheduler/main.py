"""Run the scheduler process: state feed, custom scheduler, extender, leader election, metrics.

Startup order is what makes a restart safe: the informers list the cluster (bound pods carry
their GPUs) and the state feed reads the compacted topics to their ends before the first pass;
``/readyz`` answers 200 only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid

from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, start_http_server

from contract import topics
from contract.events import AgentControl, SchedulerDecision, encode
from plumbing import observability
from plumbing.kafka_admin import wait_ready
from plumbing.kafka_settings import KafkaSettings
from plumbing.kube.api import KubeApi, connect
from scheduler.feed import StateFeed, StateView
from scheduler.kube.extender import Extender
from scheduler.kube.extender_access import server_context
from scheduler.kube.leader import LeaderElector, LeadershipLost
from scheduler.kube.live import LiveScheduler
from scheduler.metrics import SchedulerCollector, SchedulerStats
from scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


def identity() -> str:
    """This replica's name in the Lease: the pod name when it has one, else host + a random suffix."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


async def serve(kafka: KafkaSettings | None, settings: SchedulerSettings, metrics_host: str, metrics_port: int,
                stop: asyncio.Event) -> LiveScheduler:
    api = KubeApi(connect(settings.api_server, pool_size=max(32, settings.bind_workers * 2)))
    stats = SchedulerStats()
    view = StateView(stale_after_ms=int(settings.stale_after_s * 1000))
    live = LiveScheduler(api, settings, view if kafka is not None else None, stats)
    feed: StateFeed | None = None
    producer: AIOKafkaProducer | None = None
    caught_up = asyncio.Event()
    extender = Extender.from_settings(live.cache, live.core, lambda: caught_up.is_set(), settings, stats)
    runner: web.AppRunner | None = None
    if metrics_port:
        registry = CollectorRegistry()
        registry.register(SchedulerCollector(stats, lambda: live.snapshot))
        start_http_server(metrics_port, addr=metrics_host, registry=registry)
        log.info("serving /metrics on %s:%d", metrics_host, metrics_port)
    if settings.extender_port:
        runner = web.AppRunner(extender.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", settings.extender_port, ssl_context=server_context(settings)).start()
        log.info("extender and /healthz on :%d", settings.extender_port)
    tasks: list[asyncio.Task] = []
    elector: LeaderElector | None = None
    try:
        if kafka is not None:
            await wait_ready(kafka)
            feed = StateFeed(kafka, view)
            await feed.start()
            producer = AIOKafkaProducer(**kafka.producer_kwargs())
            await producer.start()

            async def publish(record: SchedulerDecision) -> None:
                assert producer is not None
                # Inside an action's span (a cordon continuing the agent's trace) the record carries it on.
                await producer.send(topics.DECISIONS, encode(record), key=record.key(),
                                    headers=observability.inject_headers())

            async def control(record: AgentControl) -> None:
                assert producer is not None
                await producer.send(topics.CONTROL, encode(record), key=record.key())

            live.sink.publish = publish
            live.control_publish = control
        await live.start()
        if feed is not None:
            await feed.catch_up()
        caught_up.set()
        log.info("cluster listed (%d nodes, %d pods) and state caught up: ready", len(live.cache.nodes),
                 len(live.cache.pods))
        if settings.leader_elect:
            # Losing the Lease stops scheduling at once and ends the process (below): it restarts as a follower.
            elector = LeaderElector(api, settings.lease_namespace, settings.lease_name, identity(),
                                    settings.lease_duration_s, settings.renew_deadline_s, settings.renew_every_s,
                                    on_started_leading=live.leading.set,
                                    on_stopped_leading=lambda: (live.leading.clear(), stop.set()))
            tasks.append(asyncio.create_task(elector.run(stop), name="leader-election"))
        else:
            live.leading.set()
        if feed is not None:
            tasks.append(asyncio.create_task(_feed_stats(feed, stats, stop), name="feed-stats"))
        await live.run(stop)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await live.stop()
        if feed is not None:
            await feed.stop()
        if producer is not None:
            await producer.stop()
        if runner is not None:
            await runner.cleanup()
    if elector is not None and elector.lost:  # kube-scheduler: klog.Fatalf("leaderelection lost")
        raise LeadershipLost(f"leaderelection lost: {elector.identity} no longer holds the Lease")
    return live


async def _feed_stats(feed: StateFeed, stats: SchedulerStats, stop: asyncio.Event) -> None:
    while not stop.is_set():
        stats.feed_records, stats.feed_dead_lettered = feed.records, feed.dead_lettered
        await asyncio.sleep(1.0)


def run_scheduler(kafka: KafkaSettings | None, settings: SchedulerSettings, metrics_host: str,
                  metrics_port: int) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(kafka, settings, metrics_host, metrics_port, stop)

    asyncio.run(main())
