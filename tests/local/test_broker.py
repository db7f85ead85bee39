"""The embedded broker, and Kafka client semantics, against a real Kafka-protocol broker over TCP."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.contract import events, topics
from gpuaware.local import broker as localbroker
from gpuaware.local.broker import BrokerError, BrokerSettings, LocalBroker
from gpuaware.plumbing import kafka_admin as admin
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.support import consume

pytestmark = pytest.mark.broker


async def test_round_trip_with_consumer_groups_and_committed_offsets(tansu_settings, unique):
    topic = f"test.roundtrip.{unique}"
    await admin.ensure_topics(tansu_settings, [topics.TopicSpec(topic, 2, "delete", None, "k", "test")])
    producer = AIOKafkaProducer(**tansu_settings.producer_kwargs())
    await producer.start()
    try:
        sent = []
        for i in range(20):
            record = events.GpuEvent(f"e{i}", i, "node-a", f"GPU-{i % 4}", events.EventKind.ANOMALY,
                                     events.Severity.WARNING, metric="util_gpu", value=float(i))
            await producer.send(topic, events.encode(record), key=record.key())
            sent.append(record)
        await producer.flush()
    finally:
        await producer.stop()

    group = f"g-{unique}"
    first = await consume(tansu_settings, topic, group, 20)
    assert sorted((events.decode(r.value) for r in first), key=lambda e: e.ts_ms) == sent
    # Same key, same partition: per-GPU order is kept.
    by_key: dict[bytes, list[int]] = {}
    for r in first:
        by_key.setdefault(r.key, []).append(events.decode(r.value).ts_ms)
    assert all(v == sorted(v) for v in by_key.values())

    # The group committed: a new member of the same group sees nothing old, only what comes next.
    producer = AIOKafkaProducer(**tansu_settings.producer_kwargs())
    await producer.start()
    try:
        late = events.GpuEvent("late", 99, "node-a", "GPU-0", events.EventKind.XID, events.Severity.CRITICAL)
        await producer.send_and_wait(topic, events.encode(late), key=late.key())
    finally:
        await producer.stop()
    again = await consume(tansu_settings, topic, group, 1)
    assert [events.decode(r.value).event_id for r in again] == ["late"]

    # A different group reads everything from the beginning.
    other = await consume(tansu_settings, topic, f"other-{unique}", 21)
    assert len(other) == 21

    consumer = AIOKafkaConsumer(**tansu_settings.consumer_kwargs(group))
    await consumer.start()
    try:
        committed = [await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)]
    finally:
        await consumer.stop()
    assert sum(committed) == 21


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} on 127.0.0.1 is already in use"):
            LocalBroker(BrokerSettings(port=port)).start()


def test_a_binary_that_cannot_run_is_a_clear_error(monkeypatch, tmp_path):
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'tansu: storage engine exploded' >&2\nexit 7\n")
    fake.chmod(0o755)
    monkeypatch.setattr(localbroker, "tansu_binary", lambda: fake)
    with pytest.raises(BrokerError, match=r"tansu exited with code 7 at start:\n.*storage engine exploded"):
        LocalBroker(BrokerSettings(port=0)).start()
    not_executable = tmp_path / "garbage"
    not_executable.write_bytes(b"\x00\x01")
    monkeypatch.setattr(localbroker, "tansu_binary", lambda: not_executable)
    with pytest.raises(BrokerError, match="cannot run tansu"):
        LocalBroker(BrokerSettings(port=0)).start()


def test_the_binary_comes_from_the_pinned_wheel():
    path = localbroker.tansu_binary()
    assert "calfkit" in str(path) and path.is_file()


async def _produce_values(settings: KafkaSettings, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(**settings.producer_kwargs())
    await producer.start()
    try:
        for v in values:
            await producer.send(topic, v, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.durable
def test_s3_storage_keeps_the_log_across_a_broker_restart(tmp_path, seaweedfs):
    with LocalBroker(BrokerSettings(port=0, storage="s3", data_dir=str(tmp_path / "s3")), run_dir=tmp_path) as b:
        settings = b.kafka_settings()
        values = [f"sample-{i}".encode() for i in range(50)]
        asyncio.run(_produce_values(settings, topics.TELEMETRY, values))
        b.restart()
        got = asyncio.run(consume(settings, topics.TELEMETRY, "durable-check", 50, timeout_s=30))
        assert sorted(r.value for r in got) == sorted(values)


def test_weed_mini_ports_skip_each_others_grpc_ports_and_the_reserved_defaults():
    # CI lost a run to master.port = s3.port + 10000 ("reserved for gRPC calculation").
    proposals = iter([12000, 22000, 13646, 12000, 12001, 12002, 12003, 12004, 12005, 12006])
    ports = localbroker.mini_ports("127.0.0.1", propose=lambda: next(proposals))
    chosen = list(ports.values())
    assert set(ports) == {"s3", "master", "volume", "filer"}
    assert len(set(chosen)) == 4 and 22000 not in chosen and 13646 not in chosen
    assert not {p + localbroker.MINI_GRPC_OFFSET for p in chosen} & set(chosen)
    assert all(p + localbroker.MINI_GRPC_OFFSET < 32768 for p in chosen)


def test_the_s3_store_reports_nothing_to_seaweedfs_telemetry(tmp_path):
    store = localbroker.S3Store(tmp_path, ports={"s3": 12000, "master": 12001, "volume": 12002, "filer": 12003})
    argv = store.argv(Path("weed"))
    assert "-master.telemetry=false" in argv  # weed mini reports to telemetry.seaweedfs.com by default
    assert "-s3.port=12000" in argv and "-master.port=12001" in argv


def test_weed_mini_ports_say_so_when_none_can_be_found():
    with pytest.raises(localbroker.BrokerError, match="no free ports for SeaweedFS"):
        localbroker.mini_ports("127.0.0.1", propose=lambda: 23646, tries=50)


@pytest.mark.durable
def test_weed_refuses_a_port_that_is_anothers_grpc_port_and_takes_the_chosen_ones(tmp_path, seaweedfs):
    good = localbroker.mini_ports("127.0.0.1")
    clash = dict(good, master=good["s3"] + localbroker.MINI_GRPC_OFFSET)
    refused = localbroker.S3Store(tmp_path / "clash", log_dir=tmp_path, ports=clash)
    with pytest.raises(localbroker.BrokerError, match="reserved for gRPC"):
        refused.start()
    refused.stop()
    store = localbroker.S3Store(tmp_path / "good", log_dir=tmp_path, ports=good)
    try:
        store.start()
    finally:
        store.stop()


def test_serve_broker_says_why_tansu_stopped_on_its_own_and_nothing_when_asked_to_stop():
    import os
    import signal
    import threading

    served: list[LocalBroker] = []

    def kill_tansu(local: LocalBroker) -> None:
        served.append(local)
        os.kill(local.pid, signal.SIGKILL)

    settings = BrokerSettings(port=0, create_topics=False)
    reason = localbroker.serve_broker(settings, threading.Event(), kill_tansu)
    assert reason is not None and reason.startswith("tansu exited unexpectedly:")
    assert not served[0].running() and served[0].child.proc.poll() is not None
    stop = threading.Event()
    stop.set()
    assert localbroker.serve_broker(settings, stop, served.append) is None
    assert len(served) == 2 and not served[1].running()
