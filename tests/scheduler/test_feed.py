"""The scheduler's state view against skewed clocks: freshness is judged on arrival too."""

from __future__ import annotations

import time

from contract.events import GpuState, HealthBand
from scheduler.feed import StateView

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
