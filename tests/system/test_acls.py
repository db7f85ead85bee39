"""Least privilege, proven on Apache Kafka: spans agent, stream and scheduler publishing with their Kafka users.

Each component runs as the Kafka user deploy/ ships: the SCRAM users of ``USER_GRANTS``
(gpuaware/deploy/manifests.py, the table the Strimzi KafkaUsers are generated from) with exactly those
ACLs, on a broker where nothing is allowed without an ACL. With its grants each one works: the
agent publishes telemetry and events and reads control; the stream worker starts, consumes and
publishes state; the scheduler's feed reads state and it publishes decisions and control. With
one grant removed each one stops at start with an authorization error naming the topic or group,
not a hang or an endless retry. An identity cannot write a topic it has no grant on.

Requires Apache Kafka (``apache_kafka`` in tests/conftest.py): skipped with the reason outside
CI when the realparts cache or Java is missing, failed under CI=true.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import events, topics
from gpuaware.contract.events import (
    AgentControl,
    ControlKind,
    DecisionAction,
    EventKind,
    GpuEvent,
    GpuState,
    HealthBand,
    SchedulerDecision,
    TelemetryBatch,
)
from gpuaware.deploy.manifests import STREAM_APP_ID, USER_GRANTS, Grant
from gpuaware.local.apache_kafka import ApacheKafka
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing import kafka_admin
from gpuaware.plumbing.kafka_admin import TopicUnavailable
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.feed import StateFeed, StateView
from gpuaware.scheduler.wiring import KafkaPublishers
from tests.support import fleet_batch, produce, watch

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

AGENT, STREAM, SCHEDULER = "gpuaware-agent", "gpuaware-stream", "gpuaware-scheduler"


def _wait_granted(settings: KafkaSettings, grants: list[Grant], timeout_s: float = 30.0) -> None:
    """Until the broker applies the new ACLs (a moment after AclCommand returns), the user sees nothing."""
    specs = [topics.spec(g.name) for g in grants
             if g.resource == "topic" and g.pattern == "literal" and g.name in topics.BY_NAME]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            asyncio.run(kafka_admin.check_topics(settings, specs))
            return
        except TopicUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _user(kafka: ApacheKafka, name: str, grants: list[Grant]) -> KafkaSettings:
    credentials = kafka.create_user(name, f"{name}-{uuid.uuid4().hex}")
    kafka.apply_acls(f"User:{name}", [g.acl() for g in grants])
    settings = kafka.kafka_settings(credentials)
    _wait_granted(settings, grants)
    return settings


def _without(component: str, resource: str, name: str) -> list[Grant]:
    kept = [g for g in USER_GRANTS[component] if (g.resource, g.name) != (resource, name)]
    assert len(kept) == len(USER_GRANTS[component]) - 1, f"{component} has no single {resource} grant on {name}"
    return kept


@pytest.fixture(scope="module")
def admin(apache_kafka: ApacheKafka) -> KafkaSettings:
    """The platform's side: the super user creates the contract's topics (as Strimzi KafkaTopics would)."""
    settings = apache_kafka.kafka_settings()
    asyncio.run(kafka_admin.ensure_topics(settings))
    return settings


@pytest.fixture(scope="module")
def users(apache_kafka: ApacheKafka, admin: KafkaSettings) -> dict[str, KafkaSettings]:
    """Client settings of each component's user, with exactly the grants deploy/ ships."""
    return {name: _user(apache_kafka, name, USER_GRANTS[name]) for name in (AGENT, STREAM, SCHEDULER)}


def _agent(settings: KafkaSettings, prefix: str, tmp_path: Path, faults: list[dict] | None = None) -> AgentRuntime:
    scenario = Scenario(name=prefix, seed=11, duration_s=3600, nodes=1, gpus_per_node=2, models=["H100"],
                        node_prefix=prefix, faults=faults or [])
    return AgentRuntime(SimCluster(scenario).collectors(), settings, SamplingPolicy(flush_s=0.5), tmp_path / "spool")


async def _records(settings: KafkaSettings, topic: str, keep, done=bool, timeout_s: float = 90.0) -> list:
    """Decoded records of ``topic`` that ``keep`` accepts, once ``done`` says so; other tests' records
    on the shared topics (some deliberately undecodable) are stepped over."""

    def decoded(message) -> object | None:
        try:
            return events.decode(message.value)
        except events.DecodeError:
            return None

    seen = await watch(settings, topic, lambda raw: done([decoded(m) for m in raw]),
                       lambda m: (r := decoded(m)) is not None and keep(r), timeout_s=timeout_s, raw=True)
    return [decoded(m) for m in seen]


def _of_node(node: str):
    return lambda record: getattr(record, "node", None) == node


# ----------------------------------------------------------------------------- with their grants


async def test_the_agent_publishes_telemetry_and_events_and_reads_control(users, admin, tmp_path):
    prefix = f"acl-{uuid.uuid4().hex[:6]}"
    runtime = _agent(users[AGENT], prefix, tmp_path, [{"kind": "xid", "node": 0, "gpu": 1, "at_s": 1, "xid": 79}])
    node = runtime.cores[0].node
    # The scheduler's user writes the command the agent's user must be able to read.
    policy = AgentControl(f"acl-{prefix}", int(time.time() * 1000), node, ControlKind.SAMPLING_POLICY,
                          sampling_policy_yaml=yaml.safe_dump({"floor_s": 2.0, "ceiling_s": 20.0}))
    await produce(users[SCHEDULER], [(topics.CONTROL, policy.key(), events.encode(policy))])
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop))
    try:
        batches = await _records(admin, topics.TELEMETRY, _of_node(node), timeout_s=60)
        evs = await _records(admin, topics.EVENTS, _of_node(node), timeout_s=60)
        deadline = time.monotonic() + 30
        while runtime.cores[0].policy.floor_s != 2.0 and time.monotonic() < deadline and not task.done():
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task
    assert isinstance(batches[0], TelemetryBatch)
    assert any(isinstance(e, GpuEvent) and e.kind is EventKind.XID for e in evs)
    assert runtime.cores[0].policy.floor_s == 2.0
    assert runtime.stats.publish_auth_errors == 0 and runtime.spool.depth == 0


def test_the_stream_worker_starts_consumes_and_publishes_state(users, admin, tmp_path):
    node = f"acl-{uuid.uuid4().hex[:6]}"
    worker = StreamWorkerProcess(users[STREAM], f"{STREAM_APP_ID}-{uuid.uuid4().hex[:6]}", tmp_path, "worker",
                                 node_identity="off")
    worker.start()
    try:
        now = int(time.time() * 1000)
        batches = [fleet_batch(node, seq, now - (20 - seq) * 1000) for seq in range(1, 21)]
        asyncio.run(produce(users[AGENT], [(topics.TELEMETRY, node.encode(), events.encode(b)) for b in batches]))
        states = asyncio.run(_records(admin, topics.GPU_STATE, _of_node(node),
                                      lambda seen: len({s.gpu_uuid for s in seen}) == 2, timeout_s=120))
        assert worker.running(), worker.log_tail()
    finally:
        worker.stop()
    assert {s.gpu_uuid for s in states} == {f"GPU-{node}-0", f"GPU-{node}-1"}


async def test_the_scheduler_reads_state_and_publishes_decisions_and_control(users, admin):
    gpu = f"GPU-acl-{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    state = GpuState(gpu, "acl-node", "NVIDIA H100 80GB HBM3", now, now, 10.0, 5.0, 1024.0, 81920, 100.0, 40.0, 1.0,
                     HealthBand.HEALTHY)
    await produce(users[STREAM], [(topics.GPU_STATE, state.key(), events.encode(state))])
    feed = StateFeed(users[SCHEDULER], StateView())
    await feed.start()
    try:
        await feed.catch_up()
        assert gpu in feed.view.gpus
    finally:
        await feed.stop()
    publishers = KafkaPublishers(users[SCHEDULER])
    await publishers.start()
    decision = SchedulerDecision(f"d-{gpu}", now, f"w-{gpu}", DecisionAction.PLACE, node="acl-node")
    cap = AgentControl(f"c-{gpu}", now, "acl-node", ControlKind.POWER_CAP, gpu_uuid=gpu, power_cap_w=200)
    try:
        await publishers.decision(decision)
        await publishers.control(cap)
    finally:
        await publishers.stop()
    assert await _records(admin, topics.DECISIONS, lambda d: d.decision_id == decision.decision_id)
    assert await _records(admin, topics.CONTROL, lambda c: c.command_id == cap.command_id)


# ----------------------------------------------------------------------------- without them


def _user_without(kafka: ApacheKafka, component: str, resource: str, name: str) -> KafkaSettings:
    return _user(kafka, f"{component}-minus-{uuid.uuid4().hex[:6]}", _without(component, resource, name))


def _refused(exc: BaseException, topic: str) -> None:
    assert isinstance(exc, TopicUnavailable) and exc.topics == [topic], exc
    assert "TOPIC_AUTHORIZATION_FAILED" in str(exc) and topic in str(exc) and "USER_GRANTS" in str(exc)


def test_the_agent_without_its_telemetry_grant_stops_at_start_naming_the_topic(apache_kafka, admin, tmp_path):
    settings = _user_without(apache_kafka, AGENT, "topic", topics.TELEMETRY)
    runtime = _agent(settings, f"acl-{uuid.uuid4().hex[:6]}", tmp_path)
    with pytest.raises(TopicUnavailable) as caught:
        asyncio.run(asyncio.wait_for(runtime.run(asyncio.Event()), 30))
    _refused(caught.value, topics.TELEMETRY)
    assert runtime.samples_published == 0  # refused before sampling started


@pytest.mark.parametrize(("resource", "name", "message"), [
    ("topic", topics.GPU_STATE, f"TOPIC_AUTHORIZATION_FAILED: Kafka user '{STREAM}-minus-"),
    ("group", STREAM_APP_ID, "GROUP_AUTHORIZATION_FAILED"),
])
def test_the_stream_worker_without_a_grant_exits_at_start_naming_it(apache_kafka, admin, tmp_path, resource, name,
                                                                    message):
    settings = _user_without(apache_kafka, STREAM, resource, name)
    app_id = f"{STREAM_APP_ID}-{uuid.uuid4().hex[:6]}"
    worker = StreamWorkerProcess(settings, app_id, tmp_path, "worker", node_identity="off")
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while worker.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not worker.running(), f"still running after 60 s:\n{worker.log_tail()}"
        assert worker.proc is not None and worker.proc.returncode == 2
    finally:
        worker.stop()
    log = worker.log_tail()
    assert message in log and (name if resource == "topic" else app_id) in log, log
    assert "Traceback" not in log


def test_the_scheduler_feed_without_its_state_grant_stops_at_start_naming_the_topic(apache_kafka, admin):
    feed = StateFeed(_user_without(apache_kafka, SCHEDULER, "topic", topics.GPU_STATE), StateView())
    with pytest.raises(TopicUnavailable) as caught:
        asyncio.run(asyncio.wait_for(feed.start(), 30))
    _refused(caught.value, topics.GPU_STATE)


def test_the_scheduler_without_its_decisions_grant_stops_at_start_naming_the_topic(apache_kafka, admin):
    publishers = KafkaPublishers(_user_without(apache_kafka, SCHEDULER, "topic", topics.DECISIONS))
    with pytest.raises(TopicUnavailable) as caught:
        asyncio.run(asyncio.wait_for(publishers.start(), 30))
    _refused(caught.value, topics.DECISIONS)
    assert publishers.producer is None


async def test_an_identity_cannot_write_a_topic_it_has_no_grant_on(users, admin):
    """The agent's user writing gpu.state.v1 (the stream's output): refused, and nothing lands."""
    key = f"GPU-forged-{uuid.uuid4().hex[:6]}"
    with pytest.raises(TopicUnavailable) as caught:
        await kafka_admin.check_topics(users[AGENT], [topics.spec(topics.GPU_STATE)])
    _refused(caught.value, topics.GPU_STATE)
    producer = AIOKafkaProducer(**users[AGENT].producer_kwargs())
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(producer.send_and_wait(topics.GPU_STATE, b"forged", key=key.encode()), 30)
    finally:
        await producer.stop()
    # A valid state, by the stream's user, after the refused one: once it is read, the forged one
    # would have been read too had it landed.
    now = int(time.time() * 1000)
    marker = GpuState(key, "acl-node", "NVIDIA H100 80GB HBM3", now, now, 0.0, 0.0, 0.0, 81920, 0.0, 30.0, 1.0,
                      HealthBand.HEALTHY)
    await produce(users[STREAM], [(topics.GPU_STATE, marker.key(), events.encode(marker))])
    seen = await watch(admin, topics.GPU_STATE, bool, lambda m: m.key == key.encode(), raw=True)
    assert [m.value for m in seen] == [events.encode(marker)]


async def test_the_agent_can_neither_read_other_nodes_tokens_nor_bypass_the_stream_check(users, admin):
    """docs/security.md: node tokens travel on gpu.telemetry.v1 and gpu.events.v1, which no agent may read
    (so no agent can replay another node's token); the stream trusts its internal re-keyed events topic
    without a token (it checked them before re-keying), which no agent may write."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    rekeyed = f"{STREAM_APP_ID}-events-by-node"
    producer = AIOKafkaProducer(**users[AGENT].producer_kwargs())
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(producer.send_and_wait(rekeyed, b"forged", key=b"node-b"), 30)
    finally:
        await producer.stop()
    for topic in (topics.TELEMETRY, topics.EVENTS):
        consumer = AIOKafkaConsumer(**users[AGENT].consumer_kwargs(None))
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek(TopicPartition(topic, 0), 0)
            with pytest.raises(TopicAuthorizationFailedError):
                await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 30)
        finally:
            await consumer.stop()
