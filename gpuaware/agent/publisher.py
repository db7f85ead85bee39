"""Delivery to Kafka through the disk spool: write-ahead, send in order, acknowledge, retry.

Every record is appended to the spool first and removed only after Kafka acknowledged it, so
while the broker is down the agent keeps sampling and the spool grows (bounded; the oldest is
dropped and counted only past the bound). When the broker returns the backlog is replayed in
order, then new records follow. Delivery is at-least-once: a record whose acknowledgement was
lost is sent again (consumers deduplicate telemetry by node, GPU and sample ``seq``).

Errors. A transient error (broker unreachable, timeout, leader moving) is retried with a back-off
doubling from ``backoff_s`` to ``max_backoff_s``. An authentication or authorization error (bad
credentials, a missing ACL) will not go away by itself, but nor should the agent's data: the
spool is in order and everything behind the refused record waits for the same fix. So it is
logged as an error naming the fix, counted in ``publish_auth_errors``, and retried with a longer
back-off (up to ``auth_backoff_s``); meanwhile the agent keeps spooling within its bound (oldest
dropped and counted past it), and delivery resumes in order once the grant is fixed. The agent
writes only topics its shipped ACLs grant it (telemetry and events), so this is always a
deployment problem, never one bad record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

from gpuaware.agent.exporter import AgentStats
from gpuaware.agent.spool import DiskSpool, SpoolRecord
from gpuaware.plumbing.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

AUTH_ERRORS = (TopicAuthorizationFailedError, ClusterAuthorizationFailedError, SaslAuthenticationFailed,
               AuthenticationFailedError)


class Publisher:
    def __init__(self, settings: KafkaSettings, spool: DiskSpool, stats: AgentStats, batch: int = 500,
                 send_timeout_s: float = 10.0, backoff_s: float = 0.5, max_backoff_s: float = 5.0,
                 auth_backoff_s: float = 60.0, identity: Callable[[], list[tuple[str, bytes]]] | None = None):
        self.settings = settings
        self.identity = identity  # headers proving the node (gpuaware.agent.identity), added at send time
        self.spool = spool
        self.stats = stats
        self.batch = batch
        self.send_timeout_s = send_timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.auth_backoff_s = auth_backoff_s
        self.backoff = backoff_s  # the next wait after a failure
        self.producer: AIOKafkaProducer | None = None
        self._wake = asyncio.Event()
        stats.spool_depth = lambda: spool.depth
        stats.spool_bytes = lambda: spool.bytes
        stats.dropped = lambda: spool.dropped
        stats.spool_corrupt = lambda: spool.corrupt
        stats.spool_write_errors = lambda: spool.write_errors
        stats.spool_held = lambda: spool.held

    def enqueue(self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None = None):
        self.spool.push(SpoolRecord(topic, key, value, headers or []))
        self._wake.set()

    async def _producer(self) -> AIOKafkaProducer:
        if self.producer is None:
            producer = AIOKafkaProducer(**self.settings.producer_kwargs())
            try:
                await asyncio.wait_for(producer.start(), self.send_timeout_s)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), 5)
                raise
            self.producer = producer
        return self.producer

    async def _drop_producer(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5)

    async def send_pending(self) -> int:
        """Send what the spool holds, in order; return how many were acknowledged."""
        sent = 0
        while self.spool.depth:
            records = self.spool.peek(self.batch)
            if not records:
                break  # only corrupt records were left: peek stepped over them
            producer = await self._producer()
            proof = self.identity() if self.identity else []
            futures = [await producer.send(r.topic, r.value, key=r.key, headers=(list(r.headers) + proof) or None)
                       for r in records]
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), self.send_timeout_s)
            ok = 0
            for r in results:
                if isinstance(r, BaseException):
                    break
                ok += 1
            if ok:
                self.spool.ack(records[ok - 1].position)
            sent += ok
            self.stats.records_sent += ok
            self.stats.bytes_sent += sum(len(r.value) + len(r.key or b"") for r in records[:ok])
            if ok < len(records):
                raise next(r for r in results if isinstance(r, BaseException))
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        self.backoff = self.backoff_s
        while not stop.is_set():
            if not self.spool.depth:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                continue
            try:
                await self.send_pending()
                self.backoff = self.backoff_s
                continue
            except AUTH_ERRORS as exc:
                self.stats.publish_errors += 1
                self.stats.publish_auth_errors += 1
                cap = self.auth_backoff_s
                log.error("Kafka refused the agent (%s: %s): fix the gpuaware-agent credentials or ACLs. "
                          "%d records spooled (bound %d bytes, oldest dropped past it); retrying in %.1fs",
                          type(exc).__name__, exc, self.spool.depth, self.spool.max_bytes, self.backoff)
            except (KafkaError, OSError, TimeoutError) as exc:
                self.stats.publish_errors += 1
                cap = self.max_backoff_s
                log.warning("publish failed, %d records spooled, retrying in %.1fs: %s", self.spool.depth,
                            self.backoff, exc)
            await self._drop_producer()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.backoff)
            self.backoff = min(self.backoff * 2, cap)
        # A last attempt so a clean shutdown leaves nothing behind when the broker is up.
        with contextlib.suppress(KafkaError, OSError, TimeoutError):
            await asyncio.wait_for(self.send_pending(), self.send_timeout_s)
        await self._drop_producer()
