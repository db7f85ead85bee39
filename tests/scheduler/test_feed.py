"""The scheduler's state view: bands, utilisation and forecasts applied to the core's cluster, stale GPUs
treated conservatively, skewed clocks (freshness is judged on arrival too); the feed's catch-up on restart,
bounded by progress rather than wall time (a fake consumer and clock), and on a real broker (compacted
topics read from the beginning, the newest state of 1,000 GPUs after a restart)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.contract.events import (
    ClusterForecast,
    Forecast,
    GpuState,
    HealthBand,
    ModelDemand,
    NodeGpu,
    NodeState,
    encode,
)
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.catchup import CatchUpStalled
from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.feed import StateFeed, StateView
from gpuaware.scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats

T0 = 1_800_000_000_000
HOUR = 3_600_000


def _state(sample_ms: int, published_ms: int, util: float = 40.0) -> GpuState:
    return GpuState("g0", "n", "NVIDIA H100 80GB HBM3", sample_ms, published_ms, util, 20.0, 1000.0, 81920, 250.0,
                    60.0, 95.0, HealthBand.HEALTHY, {}, [], None, None, 10)


def test_a_future_stamped_state_does_not_freeze_the_gpu_and_staleness_is_still_detected() -> None:
    now = int(time.time() * 1000)  # arrival is the view's own clock
    view = StateView(stale_after_ms=60_000)
    view.learn(_state(now + HOUR, now + HOUR, util=99.0))  # a stream worker's clock an hour ahead
    for s in range(1, 6):  # genuine states after it are applied
        view.learn(_state(now - 10_000 + s * 1000, now - 10_000 + s * 1000 + 100, util=40.0 + s))
    assert view.gpus["g0"].util_gpu == 45.0
    assert view.stale(now + 30_000) == []
    assert view.stale(now + 60_000) == ["g0"]  # the samples stopped (the newest is 5 s older than now)
    assert view.skew_rejected == 1


def test_arrival_times_can_be_given_explicitly() -> None:
    view = StateView(stale_after_ms=60_000)
    view.learn(_state(T0 + HOUR, T0 + HOUR), arrived_ms=T0)
    view.learn(_state(T0, T0 + 100), arrived_ms=T0 + 150)
    assert view.skew_rejected == 1 and view.stale(T0 + 60_000) == [] and view.stale(T0 + 60_200) == ["g0"]


def test_a_state_stamped_ahead_within_the_skew_goes_stale_by_arrival_time() -> None:
    now = int(time.time() * 1000)
    view = StateView(stale_after_ms=60_000)
    for s in range(3):  # 25 s ahead (tolerated), republished by the stream: same sample, newer publish time
        view.learn(_state(now + 25_000, now + 25_100 + s))
    assert view.stale(now + 30_000) == []
    assert view.stale(now + 61_000) == ["g0"]  # no new sample arrived for stale_after


# ---------------------------------------------------------------- catch-up on restart, bounded by progress

class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowConsumer:
    """An assigned consumer (no broker) whose every poll takes ``poll_s`` on ``clock`` and yields ``per_poll``
    records, until ``stall_after`` records have been delivered; after that, polls return nothing."""

    def __init__(self, clock: FakeClock, logs: dict[TopicPartition, list[bytes]], per_poll: int, poll_s: float,
                 stall_after: int | None = None, fail_after: int | None = None):
        self.clock, self.logs, self.per_poll, self.poll_s = clock, logs, per_poll, poll_s
        self.stall_after, self.fail_after = stall_after, fail_after
        self.pos = dict.fromkeys(logs, 0)
        self.delivered = 0

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        self.clock.now += self.poll_s
        await asyncio.sleep(0)
        if self.fail_after is not None and self.delivered >= self.fail_after:
            raise RuntimeError("the consumer broke")
        out: dict[TopicPartition, list] = {}
        budget = self.per_poll
        if self.stall_after is not None:
            budget = min(budget, self.stall_after - self.delivered)
        for tp, log in self.logs.items():
            while budget > 0 and self.pos[tp] < len(log):
                off = self.pos[tp]
                out.setdefault(tp, []).append(SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=off,
                                                              key=None, value=log[off], headers=[]))
                self.pos[tp] += 1
                budget -= 1
                self.delivered += 1
        return out

    async def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    async def stop(self) -> None:
        pass


def _logs(gpus: int, updates: int) -> dict[TopicPartition, list[bytes]]:
    now = int(time.time() * 1000)
    logs: dict[TopicPartition, list[bytes]] = {TopicPartition(topics.GPU_STATE, p): [] for p in range(2)}
    parts = list(logs.values())
    for u in range(updates):
        for g in range(gpus):
            state = GpuState(f"g{g}", "n", "NVIDIA H100 80GB HBM3", now - (updates - u) * 10, now - (updates - u) * 10,
                             float(u), 20.0, 1000.0, 81920, 250.0, 60.0, 95.0, HealthBand.HEALTHY, {}, [], None, None,
                             10)
            parts[g % 2].append(encode(state))
    return logs


def _feed(clock: FakeClock, consumer: SlowConsumer, **kwargs) -> StateFeed:
    feed = StateFeed(KafkaSettings(bootstrap_servers="nowhere:9092"), StateView(), clock=clock, **kwargs)
    feed.follow(consumer, {tp: len(log) for tp, log in consumer.logs.items()})
    return feed


def test_a_slow_but_steady_catch_up_runs_past_the_old_60_s_limit_and_reports_progress(caplog) -> None:
    clock = FakeClock()
    logs = _logs(gpus=100, updates=10)  # 1,000 records at 10 records/s: 100 s of catch-up

    async def run() -> StateFeed:
        feed = _feed(clock, SlowConsumer(clock, logs, per_poll=5, poll_s=0.5), stall_timeout_s=30,
                     report_every_s=5)
        try:
            await feed.catch_up()
        finally:
            await feed.stop()
        return feed

    start = clock.now
    with caplog.at_level(logging.INFO, logger="gpuaware.scheduler.catchup"):
        feed = asyncio.run(run())
    assert clock.now - start >= 99  # well past the old hard limit of 60 s
    assert len(feed.view.gpus) == 100 and all(s.util_gpu == 9.0 for s in feed.view.gpus.values())
    assert feed.progress.done and feed.progress.ratio == 1.0 and feed.progress.remaining == 0
    lines = [r.getMessage() for r in caplog.records if "catching up" in r.getMessage()]
    assert 15 <= len(lines) <= 21, lines  # one line every 5 s of a 100 s catch-up
    assert "50 of 1000 records (5%)" in lines[0] and "10 records/s" in lines[0], lines[0]


def test_a_stalled_catch_up_gives_up_after_the_stall_timeout_and_the_gauge_shows_how_far_it_got() -> None:
    clock = FakeClock()
    logs = _logs(gpus=100, updates=10)

    async def run() -> tuple[StateFeed, float]:
        feed = _feed(clock, SlowConsumer(clock, logs, per_poll=5, poll_s=0.5, stall_after=250), stall_timeout_s=30)
        try:
            with pytest.raises(CatchUpStalled, match=r"250 of 1000 records .*no progress for 30 s"):
                await feed.catch_up()
            return feed, clock.now
        finally:
            await feed.stop()

    start = clock.now
    feed, stalled_at = asyncio.run(run())
    assert 25 + 30 <= stalled_at - start < 25 + 35  # 250 records at 10/s, then 30 s without progress
    stats = SchedulerStats(feed_catch_up=feed.progress)
    samples = {s.name: s.value for fam in SchedulerCollector(stats, QueueSnapshot).collect() for s in fam.samples}
    assert samples["gpuaware_scheduler_feed_catch_up_ratio"] == 0.25
    assert samples["gpuaware_scheduler_feed_catch_up_remaining_records"] == 750


def test_a_feed_that_dies_during_catch_up_fails_it_at_once() -> None:
    clock = FakeClock()

    async def run() -> None:
        feed = _feed(clock, SlowConsumer(clock, _logs(gpus=10, updates=10), per_poll=5, poll_s=0.5, fail_after=20))
        try:
            with pytest.raises(RuntimeError, match="the consumer broke"):
                await feed.catch_up()
        finally:
            await feed.stop()

    asyncio.run(run())
    assert clock.now < 1000 + 30  # not after a stall timeout: the task's own error


def _state_of(uuid: str, node: str, band: HealthBand, sample_ms: int, util: float = 40.0) -> GpuState:
    return GpuState(uuid, node, "NVIDIA A100-SXM4-80GB", sample_ms, sample_ms + 100, util, 20.0, 1000.0, 81920,
                    250.0, 60.0, 90.0 if band == HealthBand.HEALTHY else 20.0, band, {},
                    [Forecast("util_gpu", 300, util + 10, util, util + 25)], "inference-steady", 0.8, 10)


def test_apply_writes_bands_util_and_forecasts_and_treats_stale_gpus_conservatively() -> None:
    now = 1_800_000_000_000
    view = StateView(stale_after_ms=60_000, clock=lambda: now / 1000)  # records arrive at "now"
    view.learn(_state_of("g0", "n", HealthBand.HEALTHY, now - 1000))
    view.learn(_state_of("g1", "n", HealthBand.CRITICAL, now - 1000))
    view.learn(_state_of("g2", "n", HealthBand.HEALTHY, now - 120_000))  # silent for 2 minutes
    view.learn(_state_of("g0", "n", HealthBand.HEALTHY, now - 5000, util=99.0))  # older: ignored
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
                await producer.send(topics.GPU_STATE, encode(_state_of(u, f"feed-{unique}", band, now + version)),
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
            state = _state_of(u, f"restart-{unique}", HealthBand.HEALTHY, now + version * 10, util=float(version % 50))
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


# ---------------------------------------------------------------- supervision and feed outages


class FlakyConsumer(SlowConsumer):
    """Caught up at once; then ``failures`` polls raise, as a consumer may while its broker is away."""

    def __init__(self, clock: FakeClock, logs: dict[TopicPartition, list[bytes]], failures: int):
        super().__init__(clock, logs, per_poll=10_000, poll_s=0.1)
        self.failures = failures

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if self.delivered and self.failures:
            self.failures -= 1
            await asyncio.sleep(0)
            raise ConnectionError("broker unreachable")
        return await super().getmany(timeout_ms, max_records)


def test_a_feed_error_after_catch_up_is_retried_and_the_feed_goes_on() -> None:
    """Item 4 of issue 17: the feed task died on any error after catch-up and nothing noticed."""
    clock = FakeClock()
    logs = _logs(gpus=4, updates=2)

    async def run() -> None:
        consumer = FlakyConsumer(clock, logs, failures=3)
        feed = _feed(clock, consumer, retry_s=0.001, max_retry_s=0.002)
        try:
            await feed.catch_up()
            from tests.support import wait_for

            await wait_for(lambda: feed.errors == 3, what="three errors retried")
            assert feed.failed is None
            tp = TopicPartition(topics.GPU_STATE, 0)
            now = int(time.time() * 1000)
            logs[tp].append(encode(_state_of("g-new", "n", HealthBand.HEALTHY, now)))
            await wait_for(lambda: "g-new" in feed.view.gpus, what="a record after the errors")
        finally:
            await feed.stop()

    asyncio.run(run())


def test_a_feed_task_that_ends_stops_the_scheduler() -> None:
    from gpuaware.scheduler.wiring import _feed_stats

    clock = FakeClock()

    async def run() -> None:
        consumer = SlowConsumer(clock, _logs(gpus=2, updates=1), per_poll=100, poll_s=0.1)
        feed = _feed(clock, consumer)
        await feed.catch_up()

        async def broken(*_a, **_k):
            raise SystemError("not an Exception the loop retries")  # stands in for a bug in the loop itself

        feed._task.cancel()
        feed._task = asyncio.create_task(broken())
        stats, stop = SchedulerStats(), asyncio.Event()
        await asyncio.wait_for(_feed_stats(feed, stats, stop, every_s=0.01), 5)
        assert stop.is_set() and stats.feed_failed
        await feed.stop()

    asyncio.run(run())


def test_a_feed_outage_keeps_the_last_known_health_and_assumes_every_gpu_busy() -> None:
    """After a broker outage longer than stale_after every GPU used to turn degraded, so high-priority work could
    not be placed anywhere. A GPU already stale when the feed went silent is still degraded."""
    now = [T0]
    view = StateView(stale_after_ms=90_000, clock=lambda: now[0] / 1000)
    view.learn(_state_of("ok", "n", HealthBand.HEALTHY, T0 - 1000))
    view.learn(_state_of("bad", "n", HealthBand.CRITICAL, T0 - 1000))
    view.learn(_state_of("silent", "n", HealthBand.HEALTHY, T0 - 120_000))  # its agent died before the outage
    where = {"ok": (0, 0), "bad": (0, 1), "silent": (0, 2)}.get
    cluster = ClusterState([NodeSpec("n", 64_000, 256_000, 4, "A100", 81920)])
    assert not view.outage(now[0])
    now[0] = T0 + 100_000  # nothing for 100 s: the feed is down
    assert view.outage(now[0]) and view.silent_ms(now[0]) == 100_000
    view.apply(cluster, where, now[0])
    assert cluster.band[0, :3].tolist() == [0, 2, 1]  # healthy, critical, degraded: as when the feed went silent
    assert cluster.forecast_util[0, :3].tolist() == [100.0, 100.0, 100.0]  # nobody can see utilisation: busy
    view.learn(_state_of("ok", "n", HealthBand.HEALTHY, now[0] - 500))  # the feed is back
    assert not view.outage(now[0])
    view.apply(cluster, where, now[0])
    assert cluster.band[0, :3].tolist() == [0, 2, 1] and cluster.forecast_util[0, 0] == 65.0
    # The gauge and the flag the alert reads.
    stats = SchedulerStats(feed_outage=True, feed_silent_s=100.0)
    text = "".join(str(m) for m in SchedulerCollector(stats, QueueSnapshot).collect())
    assert "gpuaware_scheduler_feed_outage" in text and "gpuaware_scheduler_feed_silent_seconds" in text
