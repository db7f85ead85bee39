"""Broker administration every component shares: readiness, topic creation, true end offsets."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from contract import topics
from plumbing.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36


class TopicMismatch(RuntimeError):
    """A topic exists with a partition count other than the contract's."""


async def wait_ready(settings: KafkaSettings, timeout_s: float = 30.0) -> list[str]:
    """Block until the cluster answers a Metadata request; return its topic names."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(**settings.admin_kwargs(), request_timeout_ms=3000)
        try:
            await admin.start()
            return sorted(await admin.list_topics())
        except (KafkaError, OSError) as exc:
            last = exc
        finally:
            await admin.close()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no Kafka metadata from {settings.bootstrap_servers} within {timeout_s:.0f}s: {last}")


async def ensure_topics(settings: KafkaSettings, specs: Iterable[topics.TopicSpec] = topics.ALL_TOPICS) -> list[str]:
    """Create missing topics with the contract's partitions and configs; return the names created.

    Topics must exist before any producer starts: Tansu auto-creates unknown topics with 4
    partitions, which breaks Faust (PartitionsMismatch). Existing topics are checked, not changed.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, 1, topic_configs=s.configs()) for s in specs]
        )
        created, failed = [], []
        for name, code, message in response.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TOPIC_ALREADY_EXISTS:
                failed.append(f"{name}: error {code} {message or ''}".strip())
        if failed:
            raise RuntimeError("could not create topics: " + "; ".join(failed))
        described = await admin.describe_topics([s.name for s in specs])
        partitions = {d["topic"]: len(d["partitions"]) for d in described}
        wrong = [
            f"{s.name} has {partitions.get(s.name)} partitions, the contract says {s.partitions}"
            for s in specs
            if partitions.get(s.name) != s.partitions
        ]
        if wrong:
            raise TopicMismatch("; ".join(wrong))
        if created:
            log.info("created topics", extra={"topics": created})
        return created
    finally:
        await admin.close()


async def end_offsets(settings: KafkaSettings, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The log end offset of each partition.

    On real Kafka this is ListOffsets(latest). The embedded Tansu broker answers that wrongly
    (the newest batch's base offset + 1), so with ``embedded_broker_compat`` the end is taken from
    the high watermark a Fetch reports, which Tansu gets right.
    """
    partitions = list(partitions)
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None), max_poll_records=1, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        if not settings.embedded_broker_compat:
            return dict(await consumer.end_offsets(partitions))
        consumer.assign(partitions)
        # A Fetch from the newest batch we can address returns the true high watermark.
        listed = await consumer.end_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, max(0, listed[tp] - 1))
        result: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + 10
        while len(result) < len(partitions) and time.monotonic() < deadline:
            await consumer.getmany(*partitions, timeout_ms=200, max_records=1)
            for tp in partitions:
                hw = consumer.highwater(tp)
                if hw is not None:
                    result[tp] = hw
        missing = [tp for tp in partitions if tp not in result]
        if missing:
            raise TimeoutError(f"no high watermark for {missing} within 10s")
        return result
    finally:
        await consumer.stop()
