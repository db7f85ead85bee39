"""The scheduler's state feed across a broker outage (issue 17, item 4): the broker stopped for longer than
``stale_after`` and restarted. While it is down the view reports an outage and keeps the last known health
(every GPU assumed busy) instead of degrading every GPU; the feed task survives; after the restart it reads
on and the outage ends. ``stale_after`` is 4 s here instead of the shipped 90 s, so the test waits seconds."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer

from gpuaware.contract import topics
from gpuaware.contract.events import Forecast, GpuState, HealthBand, encode
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.plumbing import kafka_admin
from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.feed import StateFeed, StateView
from tests.support import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.durable, pytest.mark.timeout(300)]


def _state(uuid: str, band: HealthBand, sample_ms: int) -> GpuState:
    return GpuState(uuid, "n", "NVIDIA A100-SXM4-80GB", sample_ms, sample_ms, 30.0, 20.0, 1000.0, 81920, 250.0, 60.0,
                    90.0, band, {}, [Forecast("util_gpu", 300, 40.0, 30.0, 50.0)], "inference-steady", 0.8, 10)


async def _send(settings, *states: GpuState) -> None:
    producer = AIOKafkaProducer(**settings.producer_kwargs())
    await producer.start()
    try:
        for s in states:
            await producer.send_and_wait(topics.GPU_STATE, encode(s), key=s.key())
    finally:
        await producer.stop()


def test_a_broker_outage_longer_than_stale_after_degrades_gracefully_and_the_feed_recovers(tmp_path, seaweedfs):
    with LocalBroker(BrokerSettings(port=0, storage="s3"), run_dir=tmp_path / "broker") as broker:
        settings = broker.kafka_settings()
        asyncio.run(kafka_admin.ensure_topics(settings))

        async def scenario() -> None:
            view = StateView(stale_after_ms=4000)
            feed = StateFeed(settings, view, retry_s=0.2, max_retry_s=1.0)
            now = int(time.time() * 1000)
            await _send(settings, _state("ok", HealthBand.HEALTHY, now), _state("bad", HealthBand.CRITICAL, now),
                        _state("silent", HealthBand.HEALTHY, now - 60_000))
            await feed.start()
            try:
                await feed.catch_up()
                await asyncio.to_thread(broker.child.stop)  # the broker goes away
                await wait_for(lambda: view.outage(int(time.time() * 1000)), timeout=30, what="the outage seen")
                cluster = ClusterState([NodeSpec("n", 64_000, 256_000, 4, "A100", 81920)])
                view.apply(cluster, {"ok": (0, 0), "bad": (0, 1), "silent": (0, 2)}.get, int(time.time() * 1000))
                assert cluster.band[0, :3].tolist() == [0, 2, 1]  # healthy still placeable; critical; stale before
                assert cluster.forecast_util[0, 0] == 100.0
                assert feed.failed is None
                await asyncio.to_thread(broker.restart)
                await _send(settings, _state("ok", HealthBand.HEALTHY, int(time.time() * 1000)))
                await wait_for(lambda: not view.outage(int(time.time() * 1000)), timeout=60, what="the feed back")
                assert feed.failed is None
            finally:
                await feed.stop()

        asyncio.run(scenario())
