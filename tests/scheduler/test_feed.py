"""The scheduler's state view against skewed clocks (freshness is judged on arrival too), and the feed's
catch-up on restart, bounded by progress rather than wall time (a fake consumer and clock, no broker)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from aiokafka.structs import TopicPartition

from contract import topics
from contract.events import GpuState, HealthBand, encode
from plumbing.kafka_settings import KafkaSettings
from scheduler.catchup import CatchUpStalled
from scheduler.feed import StateFeed, StateView
from scheduler.metrics import QueueSnapshot, SchedulerCollector, SchedulerStats

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
    with caplog.at_level(logging.INFO, logger="scheduler.catchup"):
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
