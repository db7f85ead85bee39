"""The scheduler process wired once: API client, state feed, Kafka publishers, ``LiveScheduler``, extender,
metrics, leader election. ``gpuaware scheduler`` (``gpuaware.scheduler.main``), ``gpuaware up``
(``gpuaware.local.stack_scheduler``) and ``gpuaware bench scheduler`` (``gpuaware.bench.scheduler_bench``) all run it;
they differ in settings (API URL, extender port, leader election) and in whether decisions go to Kafka.

Startup order is what makes a restart safe: the informers list the cluster (bound pods carry
their GPUs) and the state feed reads the compacted topics to their ends before the first pass;
``/readyz`` answers 200 only then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, start_http_server

from gpuaware.contract import topics
from gpuaware.contract.events import AgentControl, JobCompletion, SchedulerDecision, encode
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_admin import check_topics, wait_ready
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.kube.api import KubeApi, connect
from gpuaware.scheduler.feed import StateFeed, StateView
from gpuaware.scheduler.kube.extender.access import server_context
from gpuaware.scheduler.kube.extender.server import Extender
from gpuaware.scheduler.kube.leader import LeaderElector, LeadershipLost
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.metrics import SchedulerCollector, SchedulerStats
from gpuaware.scheduler.runtimes import RuntimeTable
from gpuaware.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)


def identity() -> str:
    """This replica's name in the Lease: the pod name when it has one, else host + a random suffix."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


class KafkaPublishers:
    """Decisions (``scheduler.decisions.v1``), power caps (``agent.control.v1``) and completed jobs
    (``job.completions.v1``) through one producer."""

    def __init__(self, kafka: KafkaSettings):
        self.kafka = kafka
        self.producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        await check_topics(self.kafka, [topics.spec(t) for t in (topics.DECISIONS, topics.CONTROL,
                                                                 topics.JOB_COMPLETIONS)])
        producer = AIOKafkaProducer(**self.kafka.producer_kwargs())
        await producer.start()
        self.producer = producer

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def decision(self, record: SchedulerDecision) -> None:
        assert self.producer is not None
        # Inside an action's span (a cordon continuing the agent's trace) the record carries it on.
        await self.producer.send(topics.DECISIONS, encode(record), key=record.key(),
                                 headers=observability.inject_headers())

    async def control(self, record: AgentControl) -> None:
        assert self.producer is not None
        await self.producer.send(topics.CONTROL, encode(record), key=record.key())

    async def completion(self, record: JobCompletion) -> None:
        assert self.producer is not None
        await self.producer.send(topics.JOB_COMPLETIONS, encode(record), key=record.key())


class SchedulerRuntime:
    """``start`` (listed, caught up, ready), ``run`` until a stop event, ``stop``; see ``build_scheduler``."""

    def __init__(self, settings: SchedulerSettings, api: KubeApi, live: LiveScheduler, feed: StateFeed | None,
                 publishers: KafkaPublishers | None):
        self.settings, self.api, self.live, self.feed, self.publishers = settings, api, live, feed, publishers
        self.stats, self.view = live.stats, live.view
        self.ready = asyncio.Event()  # listed and caught up: the extender answers, /readyz says 200
        self.extender = Extender.from_settings(live.cache, live.passes.core, self.ready.is_set, settings, self.stats,
                                               live.calls)
        self._runner: web.AppRunner | None = None
        self._started: list[str] = []
        self.elector: LeaderElector | None = None

    def serve_metrics(self, host: str, port: int) -> None:
        registry = CollectorRegistry()
        registry.register(SchedulerCollector(self.stats, lambda: self.live.snapshot))
        start_http_server(port, addr=host, registry=registry)
        log.info("serving /metrics on %s:%d", host, port)

    async def start(self, sync_timeout_s: float = 60.0) -> None:
        """Extender up, state feed and publishers started, cluster listed and state caught up: ready."""
        if self.settings.extender_port:
            self._runner = web.AppRunner(self.extender.app(), access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "0.0.0.0", self.settings.extender_port,
                              ssl_context=server_context(self.settings)).start()
            log.info("extender and /healthz on :%d", self.settings.extender_port)
        if self.feed is not None:
            await wait_ready(self.feed.kafka)
            self._started.append("feed")
            await self.feed.start()
        if self.publishers is not None:
            self._started.append("publishers")
            await self.publishers.start()
        self._started.append("live")
        await self.live.start(sync_timeout_s)
        if self.feed is not None:
            await self.feed.catch_up()
        self.ready.set()
        log.info("cluster listed (%d nodes, %d pods) and state caught up: ready", len(self.live.cache.nodes),
                 len(self.live.cache.pods))

    async def run(self, stop: asyncio.Event) -> None:
        """Schedule until ``stop``: while holding the Lease when leader election is on, else at once."""
        tasks: list[asyncio.Task] = []
        elector: LeaderElector | None = None
        if self.settings.leader_elect:
            s = self.settings
            # Losing the Lease stops scheduling at once and ends the process (below): it restarts as a follower.
            elector = LeaderElector(self.api, s.lease_namespace, s.lease_name, identity(), s.lease_duration_s,
                                    s.renew_deadline_s, s.renew_every_s,
                                    on_started_leading=self.live.leading.set,
                                    on_stopped_leading=lambda: (self.live.leading.clear(), stop.set()))
            self.elector = elector
            self.live.may_act = elector.is_leader
            tasks.append(asyncio.create_task(elector.run(stop), name="leader-election"))
        else:
            self.live.leading.set()
        if self.feed is not None:
            tasks.append(asyncio.create_task(_feed_stats(self.feed, self.stats, stop), name="feed-stats"))
        try:
            await self.live.run(stop)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if elector is not None and elector.lost:  # kube-scheduler: klog.Fatalf("leaderelection lost")
            raise LeadershipLost(f"leaderelection lost: {elector.identity} no longer holds the Lease")

    async def stop(self) -> None:
        """Stops what ``start`` started, also after a failed start."""
        if "live" in self._started:
            await self.live.stop()
        if "feed" in self._started and self.feed is not None:
            await self.feed.stop()
        if "publishers" in self._started and self.publishers is not None:
            await self.publishers.stop()
        self._started.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def api_pool_size(settings: SchedulerSettings) -> int:
    """HTTP connections to the API: every bind in flight and the calls beside them (Events have their own)."""
    return max(32, settings.bind_workers * 2)


def build_scheduler(settings: SchedulerSettings, kafka: KafkaSettings | None = None, *, publish: bool = True,
                    pool_size: int | None = None) -> SchedulerRuntime:
    """The scheduler on the API at ``settings.api_server``.

    ``kafka``: read live GPU state from it (else schedule on requests alone) and, with ``publish``,
    send decisions and power caps to it. ``pool_size``: HTTP connections to the API (default:
    ``api_pool_size(settings)``).
    """
    pool = pool_size or api_pool_size(settings)
    api = KubeApi(connect(settings.api_server, pool_size=pool))
    # Events on a client of their own, as kube-scheduler's eventClient: their connections are never the Bindings'.
    events_api = KubeApi(connect(settings.api_server, pool_size=4))
    stats = SchedulerStats()
    view = (StateView(stale_after_ms=int(settings.stale_after_s * 1000),
                      runtimes=RuntimeTable(settings.runtime_stale_after_s)) if kafka is not None else None)
    publishers = KafkaPublishers(kafka) if kafka is not None and publish else None
    if publishers is not None:
        live = LiveScheduler(api, settings, view, stats, decisions=publishers.decision, control=publishers.control,
                             events_api=events_api, completions=publishers.completion)
    else:
        live = LiveScheduler(api, settings, view, stats, events_api=events_api)
    feed = (StateFeed(kafka, view, stall_timeout_s=settings.catch_up_stall_s)
            if kafka is not None and view is not None else None)
    if feed is not None:
        stats.feed_catch_up = feed.progress
    return SchedulerRuntime(settings, api, live, feed, publishers)


async def _feed_stats(feed: StateFeed, stats: SchedulerStats, stop: asyncio.Event, every_s: float = 1.0) -> None:
    """Copies the feed's counters into the stats, and watches over the feed task: it retries its own errors,
    so if it ends anyway the scheduler stops (and is restarted) rather than place on a view frozen for good."""
    was_out = False
    while not stop.is_set():
        stats.feed_records, stats.feed_dead_lettered = feed.records, feed.dead_lettered
        stats.feed_skew_rejected, stats.feed_errors = feed.view.skew_rejected, feed.errors
        now_ms = int(feed.view.clock() * 1000)
        stats.feed_silent_s = feed.view.silent_ms(now_ms) / 1000
        stats.feed_outage = feed.view.outage(now_ms)
        if stats.feed_outage != was_out:
            was_out = stats.feed_outage
            if was_out:
                log.error("no state record for %.0f s: the state feed is down (broker or stream outage); placing on "
                          "the last known health, every GPU assumed busy", stats.feed_silent_s)
            else:
                log.warning("the state feed is back")
        if feed.failed is not None:
            log.error("the state feed task ended (%r): stopping so that the scheduler restarts", feed.failed)
            stats.feed_failed = True
            stop.set()
            return
        await asyncio.sleep(every_s)
