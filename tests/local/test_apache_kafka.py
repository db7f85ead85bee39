"""A real Apache Kafka 4.x (``gpuaware.local.apache_kafka``): SCRAM, ACLs and compaction as on a cluster.

Runs on the session's broker (``apache_kafka`` in tests/conftest.py), which needs the jars
``realparts/build.sh`` puts in the cache, and Java 17+. Without them the tests
skip, naming the reason; under ``CI=true`` they fail with it instead, so CI cannot pass by
silently testing nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from aiokafka.structs import TopicPartition

from gpuaware.contract import events
from gpuaware.contract import topics as contract
from gpuaware.local.apache_kafka import ApacheKafka, Credentials
from gpuaware.plumbing.kafka_admin import TopicUnavailable, check_topics
from gpuaware.plumbing.kafka_settings import KafkaSettings

pytestmark = pytest.mark.broker

TOPIC_AUTHORIZATION_FAILED = 29  # Kafka protocol error code


@pytest.fixture(scope="module")
def kafka(apache_kafka: ApacheKafka) -> ApacheKafka:
    """The session's Apache Kafka (tests/conftest.py: skipped without it, failed under CI)."""
    return apache_kafka


@pytest.fixture(scope="module")
def topics(kafka: ApacheKafka) -> dict[str, str]:
    """t1 and t2, created by the admin; names unique to this run."""
    suffix = uuid.uuid4().hex[:8]
    names = {"t1": f"t1-{suffix}", "t2": f"t2-{suffix}"}

    async def create() -> None:
        admin = AIOKafkaAdminClient(**kafka.kafka_settings().admin_kwargs())
        await admin.start()
        try:
            response = await admin.create_topics([NewTopic(n, 1, 1) for n in names.values()])
            assert all(error == 0 for _, error, *_ in response.topic_errors), response
        finally:
            await admin.close()

    asyncio.run(create())
    return names


@pytest.fixture(scope="module")
def probe(kafka: ApacheKafka, topics: dict[str, str]) -> Credentials:
    """A user whose only grant is Write on t1."""
    credentials = kafka.create_user("probe", "probe-" + uuid.uuid4().hex)
    kafka.apply_acls("User:probe", [
        {"resource": {"type": "topic", "name": topics["t1"], "patternType": "literal"}, "operations": ["Write"]},
    ])
    return credentials


def _producer(settings: KafkaSettings) -> AIOKafkaProducer:
    return AIOKafkaProducer(**{**settings.common_kwargs(), "acks": "all", "enable_idempotence": True})


async def _read_all(settings: KafkaSettings, topic: str) -> list[tuple[bytes, bytes]]:
    """Every record of partition 0 from the log start to the end offset, without a group."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None))
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        await consumer.seek_to_beginning(tp)
        records: list[tuple[bytes, bytes]] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            records += [(r.key, r.value) for r in batch.get(tp, [])]
        return records
    finally:
        await consumer.stop()


async def test_the_broker_is_apache_kafka_4_with_a_bounded_heap(kafka):
    assert kafka.version.startswith("apache-4.")
    assert kafka.startup_s is not None and kafka.startup_s < kafka.ready_timeout_s
    cmdline = Path(f"/proc/{kafka.pid}/cmdline").read_bytes().split(b"\0")
    assert b"-Xmx512m" in cmdline and b"kafka.Kafka" in cmdline
    admin = AIOKafkaAdminClient(**kafka.kafka_settings().admin_kwargs())
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    assert [b["host"] for b in cluster["brokers"]] == ["127.0.0.1"]


async def test_the_admin_creates_topics_and_a_user_without_acls_cannot(kafka, probe):
    name = f"made-by-admin-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**kafka.kafka_settings().admin_kwargs())
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, 2, 1, topic_configs={"cleanup.policy": "compact"})])
        assert [(t, e) for t, e, *_ in response.topic_errors] == [(name, 0)]
        # CreateTopics answers once the controller has the topic; the broker lists it a moment later.
        deadline = time.monotonic() + 30
        while name not in await admin.list_topics() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        described = await admin.describe_topics([name])
        assert len(described[0]["partitions"]) == 2
    finally:
        await admin.close()

    other = f"made-by-probe-{uuid.uuid4().hex[:8]}"
    client = AIOKafkaAdminClient(**kafka.kafka_settings(probe).admin_kwargs())
    await client.start()
    try:
        response = await client.create_topics([NewTopic(other, 1, 1)])
    finally:
        await client.close()
    assert [(t, e) for t, e, *_ in response.topic_errors] == [(other, TOPIC_AUTHORIZATION_FAILED)]


async def test_a_user_writes_only_where_its_acls_allow_and_reads_nothing(kafka, topics, probe):
    settings = kafka.kafka_settings(probe)
    producer = _producer(settings)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics["t1"], b"allowed", key=b"k")
        assert meta.topic == topics["t1"] and meta.offset >= 0
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(topics["t2"], b"refused", key=b"k")
    finally:
        await producer.stop()

    # Without a group: the Fetch itself is refused (no Read on t1).
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None))
    await consumer.start()
    try:
        tp = TopicPartition(topics["t1"], 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        with pytest.raises(TopicAuthorizationFailedError):
            async with asyncio.timeout(30):
                await consumer.getone()
    finally:
        await consumer.stop()

    # With a group: refused before any fetch, while joining (no Read on the group).
    grouped = AIOKafkaConsumer(topics["t1"], **settings.consumer_kwargs(f"probe-{uuid.uuid4().hex[:8]}"))
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            async with asyncio.timeout(30):
                await grouped.start()
                await grouped.getone()
    finally:
        await grouped.stop()

    # What probe wrote did land: the admin reads it back.
    assert (b"k", b"allowed") in await _read_all(kafka.kafka_settings(), topics["t1"])


# Segments that roll within a test, a cleaner that acts at once: the only settings a compaction
# test changes. Kafka 4 refuses segment.bytes under 1 MiB (KIP-1030), so segments roll on time.
FAST_COMPACTION = {
    "segment.ms": "100",
    "segment.bytes": str(1024 * 1024),
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "0",
    "min.compaction.lag.ms": "0",
}


async def _compacts_to_the_newest_per_key(settings: KafkaSettings, name: str, configs: dict[str, str],
                                          rounds: list[dict[bytes, bytes]]) -> None:
    """Create ``name`` (one partition) with ``configs``, write ``rounds`` of key -> value in order,
    and wait until the log holds exactly the last value of each key."""
    admin = AIOKafkaAdminClient(**settings.admin_kwargs())
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, 1, 1, topic_configs=configs)])
        assert [(t, e) for t, e, *_ in response.topic_errors] == [(name, 0)]
    finally:
        await admin.close()
    newest = {key: value for round_ in rounds for key, value in round_.items()}
    tick = b"~tick"
    producer = _producer(settings)
    await producer.start()
    try:
        for round_ in rounds:
            for key, value in round_.items():
                await producer.send_and_wait(name, value, key=key)
        # Only closed segments are compacted, and a segment closes when a record arrives after
        # segment.ms: a tick record each poll rolls the segment holding the last round, so the
        # cleaner can then drop every older value. Ticks are the driver, not the subject.
        deadline = time.monotonic() + 120
        seen: list[tuple[bytes, bytes]] = []
        while time.monotonic() < deadline:
            await producer.send_and_wait(name, b"", key=tick)
            seen = [(k, v) for k, v in await _read_all(settings, name) if k != tick]
            if sorted(seen) == sorted(newest.items()):
                break
            await asyncio.sleep(0.5)
    finally:
        await producer.stop()
    assert sorted(seen) == sorted(newest.items()), (
        f"after 120 s the log still holds {len(seen)} records for {len(newest)} keys: {seen}"
    )


async def test_log_compaction_keeps_only_the_newest_record_per_key(kafka):
    name = f"compacted-{uuid.uuid4().hex[:8]}"
    keys = [f"gpu-{i}".encode() for i in range(4)]
    rounds = [{key: f"{key.decode()}@{r}".encode() for key in keys} for r in range(5)]
    await _compacts_to_the_newest_per_key(kafka.kafka_settings(), name, {"cleanup.policy": "compact",
                                                                          **FAST_COMPACTION}, rounds)


@pytest.mark.parametrize("spec", [t for t in contract.CONTRACT_TOPICS if t.cleanup_policy == "compact"],
                         ids=lambda t: t.name)
async def test_each_compacted_topic_of_the_contract_keeps_the_newest_record_per_key(kafka, spec):
    """The contract's own configs (cleanup policy, retention, extras) on a copy of the topic, with
    only the segment and cleaner timings of FAST_COMPACTION over them (gpu.state.v1's 60 s
    min.compaction.lag.ms among them: it only delays compaction), and real records of the topic."""
    configs = {**spec.configs(), **FAST_COMPACTION}
    assert configs["cleanup.policy"] == "compact"
    name = f"{spec.name}.compaction-{uuid.uuid4().hex[:8]}"
    rounds = []
    for r in range(4):
        records = [_record_of(spec.name, key, r) for key in ("a", "b", "c")]
        rounds.append({record.key(): events.encode(record) for record in records})
    await _compacts_to_the_newest_per_key(kafka.kafka_settings(), name, configs, rounds)


def _record_of(topic: str, key: str, r: int) -> events.Record:
    """A valid record of ``topic`` whose key is derived from ``key``; ``r`` makes each round's value differ."""
    ts = 1_700_000_000_000 + r
    if topic == contract.GPU_STATE:
        return events.GpuState(f"GPU-{key}", "n", "NVIDIA H100 80GB HBM3", ts, ts, float(r), 0.0, 0.0, 81920, 0.0,
                               40.0, 1.0, events.HealthBand.HEALTHY)
    if topic == contract.NODE_STATE:
        return events.NodeState(f"node-{key}", ts, None, None, [], 1000 * r, 0)
    if topic == contract.CLUSTER_FORECAST:
        return events.ClusterForecast(f"cluster-{key}", ts, [])
    if topic == contract.JOB_RUNTIME:
        return events.JobRuntime(f"owner:t/{key}", ts, r + 1, float(r), 0.0)
    if topic == contract.CONTROL:
        return events.AgentControl(f"cmd-{key}-{r}", ts, f"node-{key}", events.ControlKind.POWER_CAP,
                                   power_cap_w=200 + r)
    raise AssertionError(f"no record for {topic}")


async def test_a_missing_topic_is_an_error_naming_it_and_who_creates_topics(kafka):
    """On Kafka a Metadata request does not create the topic (Tansu's does, with 4 partitions)."""
    name = f"never-created-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TopicUnavailable) as caught:
        await check_topics(kafka.kafka_settings(), [contract.TopicSpec(name, 1, "delete", None, "k", "test")])
    assert caught.value.topics == [name]
    assert "do not exist" in str(caught.value) and "KafkaTopics" in str(caught.value)
