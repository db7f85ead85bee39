"""Broker administration every component shares: readiness, topic checks and creation, true end offsets.

Components only *check* the contract's topics (``check_topics``): creating them is the platform's
job (Strimzi ``KafkaTopic`` resources from deploy/, or ``gpuaware up`` / an admin running
``ensure_topics``), so no component needs a Create grant on them. A missing topic or a missing
grant is an error that names the topic and what to do, raised at start, not a hang later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    KafkaError,
)
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.plumbing.kafka_settings import KafkaSettings

log = logging.getLogger(__name__)

UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
TOPIC_ALREADY_EXISTS = 36
GRANTS = "gpuaware/deploy/manifests.py USER_GRANTS"


class TopicMismatch(RuntimeError):
    """A topic exists with a partition count other than the contract's."""


class TopicUnavailable(RuntimeError):
    """Topics a component needs are missing, or its Kafka user has no grant on them; ``topics`` names them."""

    def __init__(self, message: str, topics: list[str]):
        super().__init__(message)
        self.topics = topics


def _user(settings: KafkaSettings) -> str:
    return f"Kafka user {settings.sasl_username!r}" if settings.sasl_username else "this Kafka client"


async def check_topics(settings: KafkaSettings, specs: Iterable[topics.TopicSpec]) -> dict[str, int]:
    """Check that every topic exists with the contract's partition count and that this user may
    see it (Describe, which every grant of ours carries); return partitions per topic.

    Kafka answers TOPIC_AUTHORIZATION_FAILED for a topic the user has no grant on whether or not
    it exists, so that error names the grant, and UNKNOWN_TOPIC_OR_PARTITION names who creates it.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        described = {d["topic"]: d for d in await admin.describe_topics([s.name for s in specs])}
    finally:
        await admin.close()
    refused, missing, wrong = [], [], []
    partitions: dict[str, int] = {}
    for s in specs:
        d = described.get(s.name)
        code = d["error_code"] if d is not None else UNKNOWN_TOPIC_OR_PARTITION
        if code == TOPIC_AUTHORIZATION_FAILED:
            refused.append(s.name)
        elif code == UNKNOWN_TOPIC_OR_PARTITION:
            missing.append(s.name)
        elif code != 0:
            raise TopicUnavailable(f"topic {s.name}: metadata error {code}", [s.name])
        elif len(d["partitions"]) != s.partitions:
            wrong.append(f"{s.name} has {len(d['partitions'])} partitions, the contract says {s.partitions}")
        else:
            partitions[s.name] = s.partitions
    if refused:
        raise TopicUnavailable(
            f"TOPIC_AUTHORIZATION_FAILED: {_user(settings)} has no grant on topic(s) {', '.join(refused)}; "
            f"add the component's grants ({GRANTS}, applied as Strimzi KafkaUsers)", refused)
    if missing:
        raise TopicUnavailable(
            f"topic(s) {', '.join(missing)} do not exist: topics are created by the platform (Strimzi KafkaTopics "
            f"from deploy/, or `gpuaware up` / an admin running gpuaware.plumbing.kafka_admin.ensure_topics), "
            f"not by components", missing)
    if wrong:
        raise TopicMismatch("; ".join(wrong))
    return partitions


async def topic_partitions(settings: KafkaSettings, topic: str) -> list[TopicPartition]:
    """Every partition of ``topic`` (checked as ``check_topics`` does), for a consumer that assigns them.

    A consumer without a subscription has no metadata for a topic until it asks: on real Kafka its
    ``partitions_for_topic`` answers None after start (Tansu happened to answer with every topic).
    """
    spec = topics.BY_NAME.get(topic)
    if spec is not None:
        counts = await check_topics(settings, [spec])
        return [TopicPartition(topic, p) for p in range(counts[topic])]
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        (d,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if d["error_code"]:
        raise TopicUnavailable(f"topic {topic}: metadata error {d['error_code']} for {_user(settings)}", [topic])
    return [TopicPartition(topic, p["partition"]) for p in sorted(d["partitions"], key=lambda p: p["partition"])]


async def check_group(settings: KafkaSettings, group: str, timeout_s: float = 30.0) -> None:
    """Raise, naming the group and the grant, when this user may not use consumer group ``group``.

    A fresh cluster creates its offsets topic on the first FindCoordinator and answers
    COORDINATOR_NOT_AVAILABLE meanwhile, so that is waited out, up to ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        while True:
            try:
                (response,) = await admin.describe_consumer_groups([group])
                code = response.groups[0][0]
            except GroupAuthorizationFailedError:
                code = GROUP_AUTHORIZATION_FAILED
            except (GroupCoordinatorNotAvailableError, CoordinatorLoadInProgressError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            break
    finally:
        await admin.close()
    if code == GROUP_AUTHORIZATION_FAILED:
        raise PermissionError(f"GROUP_AUTHORIZATION_FAILED: {_user(settings)} has no grant on consumer group "
                              f"{group!r}; add the component's grants ({GRANTS})")


async def default_replication_factor(settings: KafkaSettings) -> int:
    """The cluster's ``default.replication.factor``; without DescribeConfigs on the cluster (a
    component's user has none), the number of brokers, at most 3."""
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        brokers = [b["node_id"] for b in cluster["brokers"]]
        try:
            (response,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, str(brokers[0]), {"default.replication.factor": None})])
            for code, _, _, _, entries in response.resources:
                if code == 0:
                    for name, value, *_ in entries:
                        if name == "default.replication.factor" and value:
                            return int(value)
        except KafkaError as exc:
            log.debug("default.replication.factor not readable (%s); using the broker count", exc)
        return min(3, len(brokers))
    finally:
        await admin.close()


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


async def ensure_topics(settings: KafkaSettings, specs: Iterable[topics.TopicSpec] = topics.ALL_TOPICS,
                        replication_factor: int = 1, timeout_s: float = 30.0) -> list[str]:
    """Create missing topics with the contract's partitions and configs; return the names created.

    The platform's (or an admin's) job, and the stream worker's for its own internal topics.
    Topics must exist before any producer starts: Tansu auto-creates unknown topics with 4
    partitions, which breaks Faust (PartitionsMismatch). Existing topics are checked, not changed.
    """
    specs = list(specs)
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, replication_factor, topic_configs=s.configs()) for s in specs]
        )
        created, failed = [], []
        for name, code, message in response.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TOPIC_ALREADY_EXISTS:
                failed.append(f"{name}: error {code} {message or ''}".strip())
        if failed:
            raise RuntimeError("could not create topics: " + "; ".join(failed))
        # Kafka (KRaft) answers CreateTopics once the controller has committed the topics; the broker
        # serves them in Metadata a moment later, with no partitions until then. Wait for that.
        deadline = time.monotonic() + timeout_s
        while True:
            described = await admin.describe_topics([s.name for s in specs])
            partitions = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}
            if all(partitions.get(name) for name in created) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
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
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None, fetch_max_wait_ms=50), max_poll_records=1)
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
