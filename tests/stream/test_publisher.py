"""GPU states as record batches: the partition of each GPU's states, their order, and what a failure does."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.contract.events import GpuState, decode
from gpuaware.plumbing.kafka_admin import end_offsets
from gpuaware.plumbing.kafka_batches import BatchSender
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.publisher import StatePublisher
from tests.plumbing.test_kafka_batches import HeldClient
from tests.support import telemetry_batch

pytestmark = pytest.mark.timeout(120)
T0 = 1_700_000_000_000


def _states(prefix: str, nodes: int, gpus: int = 4) -> list[GpuState]:
    proc = StreamProcessor({})
    batches = [telemetry_batch(f"{prefix}-{n}", 1, T0, gpus=gpus) for n in range(nodes)]
    return [s for b in batches for s in proc.on_telemetry(b, 0, T0)]


def _later(states: list[GpuState], ms: int) -> list[GpuState]:
    return [dataclasses.replace(s, published_ms=s.published_ms + ms) for s in states]


async def _read(kafka: KafkaSettings, topic: str, since: dict[TopicPartition, int], keys: set[bytes]) -> list:
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(None))
    await consumer.start()
    got = []
    try:
        consumer.assign(list(since))
        for tp, offset in since.items():
            consumer.seek(tp, offset)
        ends = await end_offsets(kafka, list(since))
        async with asyncio.timeout(60):
            while [tp for tp in since if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(r for r in records if r.key in keys)
    finally:
        await consumer.stop()
    return got


def test_states_land_where_the_client_puts_their_keys_and_in_the_order_of_the_calls(kafka_settings, unique) -> None:
    async def go() -> None:
        producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
        await producer.start()
        stats = StreamStats()

        async def started() -> AIOKafkaProducer:
            return producer

        publisher = StatePublisher(topics.GPU_STATE, BatchSender(started), stats)
        first = _states(f"pub-{unique}", 30)
        second = _later(first, 1000)
        keys = {s.key() for s in first}
        try:
            tps = [TopicPartition(topics.GPU_STATE, p) for p in sorted(await producer.partitions_for(topics.GPU_STATE))]
            since = await end_offsets(kafka_settings, tps)
            # Two calls in flight at once (a take's and the heartbeat's): each GPU's second state must come second.
            await asyncio.gather(publisher.publish(first, [("traceparent", b"00-x")]), publisher.publish(second))
            # Where aiokafka's own send puts each key (the partition earlier versions wrote a GPU's states to).
            want = {s.key(): producer._partition(topics.GPU_STATE, None, None, None, s.key(), None) for s in first}
            got = await _read(kafka_settings, topics.GPU_STATE, since, keys)
        finally:
            await producer.stop()
        assert stats.published[topics.GPU_STATE] == 2 * len(first) and stats.publish_failed == 0
        assert len(got) == 2 * len(first)
        for record in got:
            assert record.partition == want[record.key]
        by_key: dict[bytes, list[int]] = {}
        for record in sorted(got, key=lambda r: (r.partition, r.offset)):
            by_key.setdefault(record.key, []).append(decode(record.value, GpuState).published_ms)
        assert all(times == sorted(times) and len(times) == 2 for times in by_key.values())
        assert {r.key for r in got if dict(r.headers).get("traceparent") == b"00-x"} == keys

    asyncio.run(go())


def test_a_client_that_cannot_take_the_states_counts_them_and_the_worker_goes_on(kafka_settings) -> None:
    async def go() -> StreamStats:
        producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
        await producer.start()
        await producer.partitions_for(topics.GPU_STATE)
        await producer.stop()  # a stopped client refuses batches (ProducerClosed)
        stats = StreamStats()

        async def stopped() -> AIOKafkaProducer:
            return producer

        await StatePublisher(topics.GPU_STATE, BatchSender(stopped), stats).publish(_states("closed", 3))
        return stats

    stats = asyncio.run(go())
    assert stats.publish_failed == 12 and stats.published[topics.GPU_STATE] == 0


def test_a_failed_delivery_is_counted_per_state() -> None:
    async def go() -> StreamStats:
        client = HeldClient(fail_delivery=True)

        async def held() -> HeldClient:
            return client

        stats = StreamStats()
        await StatePublisher(topics.GPU_STATE, BatchSender(held), stats).publish(_states("lost", 5))
        await asyncio.sleep(0)  # delivery callbacks
        return stats

    stats = asyncio.run(go())
    assert stats.publish_failed == 20 and stats.published[topics.GPU_STATE] == 0


class _SlowMetadataClient(HeldClient):
    """The first look at the topic's partitions takes a while (metadata fetched), later ones none."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    async def partitions_for(self, topic: str) -> set[int]:
        self.looks += 1
        if self.looks == 1:
            await asyncio.sleep(0.05)
        return set(range(8))


def test_a_later_call_waits_for_an_earlier_one_that_is_still_fetching_the_topics_partitions() -> None:
    async def go() -> list[tuple[int, list[tuple[bytes, bytes | None]]]]:
        client = _SlowMetadataClient()

        async def slow() -> _SlowMetadataClient:
            return client

        publisher = StatePublisher(topics.GPU_STATE, BatchSender(slow), StreamStats())
        first = _states("meta", 10)
        await asyncio.gather(publisher.publish(first), publisher.publish(_later(first, 1000)))
        return client.sent

    order: dict[bytes, list[int]] = {}
    for _, records in asyncio.run(go()):
        for key, value in records:
            order.setdefault(key, []).append(decode(bytes(value), GpuState).published_ms)
    assert len(order) == 40 and all(times == [T0, T0 + 1000] for times in order.values())


def test_states_with_kept_forecasts_are_the_bytes_encoding_each_state_gives() -> None:
    """A GPU's forecasts are encoded once per list and spliced into its states: across minutes closing (new lists),
    a list with other values, and GPUs forgotten, every record is what encoding the state on its own gives."""
    from gpuaware.contract.events import Forecast, encode

    proc = StreamProcessor({})
    publisher = StatePublisher(topics.GPU_STATE, BatchSender(HeldClient), StreamStats())
    checked = 0
    for minute in range(4):
        for second in range(0, 60, 7):
            now = T0 + minute * 60_000 + second * 1000
            for state in proc.on_telemetry(telemetry_batch("fc", minute * 60 + second, now, util=10 + 20 * minute,
                                                           gpus=2), 0, now):
                key = state.key()
                assert publisher.encode(state, key) == encode(state)
                other = dataclasses.replace(state, forecasts=[Forecast("util_gpu", 60, 1.0, 0.0, 2.0)])
                assert publisher.encode(other, key) == encode(other)  # another list: encoded again
                assert publisher.encode(state, key) == encode(state)
                checked += bool(state.forecasts)
        publisher.forget([b"GPU-fc-0"])
    assert checked > 10  # states with forecasts among them


def test_a_node_rollup_keeps_its_gpu_list_encoded_until_the_list_changes() -> None:
    """The rollup's GPUs are spliced in from the last encoding while they stay equal (a new list each rollup), and
    encoded again when a GPU changes; every value is the contract's own encoding."""
    from unittest import mock

    from gpuaware.contract.events import HealthBand, NodeGpu, NodeState, encode
    from gpuaware.stream import publisher as stream_publisher
    from gpuaware.stream.publisher import node_gpus

    def rollup(free: int, band: HealthBand = HealthBand.HEALTHY) -> NodeState:
        return NodeState("n", 1_000 + free, None, None, [NodeGpu(f"GPU-{i}", i, "H100", 81559, 0, band)
                                                         for i in range(8)], free, 8 * 81559)

    kept = node_gpus()
    encoded = []
    real = stream_publisher.encode_field
    with mock.patch.object(stream_publisher, "encode_field", lambda *a: encoded.append(a) or real(*a)):
        for record in (rollup(3000), rollup(2750), rollup(2750, HealthBand.CRITICAL),
                       rollup(1000, HealthBand.CRITICAL)):
            assert kept.encode(record, b"n") == encode(record)
    assert len(encoded) == 2  # the first list, and the one with a GPU's band changed


def test_states_rendered_by_the_publisher_go_out_as_the_records_would() -> None:
    """The worker's processor renders its states with the publisher (``encoded_state``: key and bytes, straight from
    the trackers); published beside records, each goes to its key's partition with the bytes the record's encoding
    gives."""
    from gpuaware.contract.events import encode

    async def go() -> tuple[list, list, StreamStats]:
        client = HeldClient()

        async def held() -> HeldClient:
            return client

        stats = StreamStats()
        publisher = StatePublisher(topics.GPU_STATE, BatchSender(held), stats)
        proc, records = StreamProcessor({}), StreamProcessor({})
        proc.render = publisher.encoded_state
        batches = [telemetry_batch(f"rendered-{n}", 1, T0, gpus=3) for n in range(4)]
        rendered = [s for b in batches for s in proc.on_telemetry(b, 0, T0)]
        states = [s for b in batches for s in records.on_telemetry(b, 0, T0)]
        await publisher.publish([*rendered[:6], *states[6:]])
        alone = HeldClient()  # the same states as records

        async def held_alone() -> HeldClient:
            return alone

        await StatePublisher(topics.GPU_STATE, BatchSender(held_alone), StreamStats()).publish(states)
        return client.sent, alone.sent, states, stats

    sent, sent_alone, states, stats = asyncio.run(go())
    got = {key: value for _, records in sent for key, value in records}
    assert got == {s.key(): encode(s) for s in states} and stats.published[topics.GPU_STATE] == 12
    assert sent == sent_alone  # each in its key's partition, in order
