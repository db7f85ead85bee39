"""The scheduler's live-state feed: compacted topics read from the beginning, applied to the core's cluster."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from contract import topics
from contract.events import (
    ClusterForecast,
    Forecast,
    GpuState,
    HealthBand,
    ModelDemand,
    NodeGpu,
    NodeState,
    encode,
)
from plumbing.kafka_settings import KafkaSettings
from scheduler.core.cluster import ClusterState, NodeSpec
from scheduler.feed import StateFeed, StateView


def _state(uuid: str, node: str, band: HealthBand, sample_ms: int, util: float = 40.0) -> GpuState:
    return GpuState(uuid, node, "NVIDIA A100-SXM4-80GB", sample_ms, sample_ms + 100, util, 20.0, 1000.0, 81920,
                    250.0, 60.0, 90.0 if band == HealthBand.HEALTHY else 20.0, band, {},
                    [Forecast("util_gpu", 300, util + 10, util, util + 25)], "inference-steady", 0.8, 10)


def test_apply_writes_bands_util_and_forecasts_and_treats_stale_gpus_conservatively() -> None:
    now = 1_800_000_000_000
    view = StateView(stale_after_ms=60_000, clock=lambda: now / 1000)  # records arrive at "now"
    view.learn(_state("g0", "n", HealthBand.HEALTHY, now - 1000))
    view.learn(_state("g1", "n", HealthBand.CRITICAL, now - 1000))
    view.learn(_state("g2", "n", HealthBand.HEALTHY, now - 120_000))  # silent for 2 minutes
    view.learn(_state("g0", "n", HealthBand.HEALTHY, now - 5000, util=99.0))  # older: ignored
    cluster = ClusterState([NodeSpec("n", 64_000, 256_000, 4, "A100", 81920)])
    placed = view.apply(cluster, {"g0": (0, 0), "g1": (0, 1), "g2": (0, 2)}.get, now)
    assert placed == 3
    assert cluster.band[0].tolist() == [0, 2, 1, 0]
    assert cluster.util[0, 0] == 40.0 and cluster.forecast_util[0, 0] == 65.0  # the interval's upper end
    assert cluster.forecast_util[0, 2] == 100.0  # stale: assume busy
    assert view.stale(now) == ["g2"]


def test_feed_catches_up_on_everything_published_before_it_started(kafka_settings: KafkaSettings, unique) -> None:
    now = int(time.time() * 1000)
    uuids = [f"GPU-feed-{unique}-{i}" for i in range(40)]

    async def run() -> tuple[StateView, StateFeed]:
        producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
        await producer.start()
        for i, u in enumerate(uuids):
            for version in range(3):  # compacted topic, no compaction on Tansu: the newest must win
                band = HealthBand.CRITICAL if (version == 2 and i % 10 == 0) else HealthBand.HEALTHY
                await producer.send(topics.GPU_STATE, encode(_state(u, f"feed-{unique}", band, now + version)),
                                    key=u.encode())
        node = NodeState(f"feed-{unique}", now, None, None,
                         [NodeGpu(u, i, "A100", 81920, 0, HealthBand.HEALTHY) for i, u in enumerate(uuids[:8])],
                         4000, 300_000)
        await producer.send(topics.NODE_STATE, encode(node), key=node.key())
        await producer.send(topics.CLUSTER_FORECAST, b"\x00garbage", key=f"feed-{unique}".encode())
        await producer.send(topics.CLUSTER_FORECAST, encode(ClusterForecast(
            # Ahead of anything else on the shared topic, but within the clock skew the view accepts.
            f"feed-{unique}", now + 20_000, [ModelDemand("A100", 300, 3.0, 2.0, 4.0, 8.0)])), key=b"c")
        await producer.stop()
        view = StateView()
        feed = StateFeed(kafka_settings, view)
        await feed.start()
        try:
            await feed.catch_up()
        finally:
            await feed.stop()
        return view, feed

    view, feed = asyncio.run(run())
    mine = {u: s for u, s in view.gpus.items() if u in uuids}
    assert set(mine) == set(uuids)
    assert all(s.sample_ts_ms == now + 2 for s in mine.values())
    assert sorted(u for u, s in mine.items() if s.health_band == HealthBand.CRITICAL) == uuids[::10]
    assert len(view.nodes[f"feed-{unique}"].gpus) == 8
    assert view.forecast is not None and view.forecast.cluster == f"feed-{unique}"
    assert feed.dead_lettered >= 1


def test_a_restarted_feed_catches_up_to_the_newest_state_of_1000_gpus_from_100k_records(
        kafka_settings: KafkaSettings, unique) -> None:
    """A day of state for 1,000 GPUs is ~8.6M records (docs/reliability.md); 100 updates per GPU stand in for it
    here. The first feed reads them and stops; one more update per GPU is published; the restarted feed must
    end with that newest state for every GPU."""
    gpus, updates = 1000, 100
    uuids = [f"GPU-restart-{unique}-{i}" for i in range(gpus)]
    now = int(time.time() * 1000) - 60_000

    async def publish(producer: AIOKafkaProducer, version: int) -> None:
        for u in uuids:
            state = _state(u, f"restart-{unique}", HealthBand.HEALTHY, now + version * 10, util=float(version % 50))
            await producer.send(topics.GPU_STATE, encode(state), key=u.encode())

    async def read() -> tuple[StateView, StateFeed, float]:
        view = StateView()
        feed = StateFeed(kafka_settings, view)
        t0 = time.monotonic()
        await feed.start()
        try:
            await feed.catch_up()
            return view, feed, time.monotonic() - t0
        finally:
            await feed.stop()

    async def run() -> tuple[StateView, StateFeed, float]:
        producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
        await producer.start()
        try:
            for version in range(updates):
                await publish(producer, version)
            await producer.flush()
            first, _, _ = await read()
            assert all(first.gpus[u].sample_ts_ms == now + (updates - 1) * 10 for u in uuids)
            await publish(producer, updates)  # published while the scheduler is down
            await producer.flush()
        finally:
            await producer.stop()
        return await read()

    view, feed, took = asyncio.run(run())
    newest = now + updates * 10
    assert [u for u in uuids if view.gpus[u].sample_ts_ms != newest] == []
    assert feed.progress.done and feed.progress.total >= gpus * (updates + 1)
    total = feed.progress.total
    print(f"\nrestart catch-up: {total} records in {took:.1f}s with start-up = {total / took:.0f} records/s; "
          f"reading alone {feed.progress.rate:.0f} records/s")
