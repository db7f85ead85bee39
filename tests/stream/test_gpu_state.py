"""Per-GPU stream state against skewed clocks: a batch stamped in the future must not freeze a GPU."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from contract.events import GpuInfo, GpuSample, TelemetryBatch
from stream.gpu_state import GpuTracker, TrackerSettings
from stream.metrics import StreamCollector
from stream.processor import StreamProcessor

T0 = 1_700_000_000_000
HOUR = 3_600_000


def _batch(seq: int, ts_ms: int, util: int = 50) -> TelemetryBatch:
    return TelemetryBatch("n", seq, ts_ms, [GpuInfo("GPU-n-0", 0, "NVIDIA H100 80GB HBM3", 81920)],
                          [GpuSample(0, seq, 0, util, util // 2, 1000, 2500, 60)])


def test_a_future_stamped_batch_is_rejected_and_genuine_ones_after_it_are_applied() -> None:
    proc = StreamProcessor({})  # default skew: 30 s
    proc.on_telemetry(_batch(1, T0), 0, T0)
    proc.on_telemetry(_batch(2, T0 + HOUR, util=99), 0, T0 + 1000)  # the agent's clock jumped an hour ahead
    for i, seq in enumerate(range(1, 6)):  # the clock fixed, the agent restarted: seq from 1 again
        proc.on_telemetry(_batch(seq, T0 + 2000 + i * 1000, util=60), 0, T0 + 2000 + i * 1000)
    t = proc.trackers["GPU-n-0"]
    assert proc.stats.duplicates == 0 and t.samples == 6 and t.smoothed["util_gpu"] < 99
    # The samples stop: the state's timestamp says how old the data is, so the scheduler sees it go stale.
    (state,) = proc.heartbeats(T0 + 120_000, None)
    assert state.sample_ts_ms == T0 + 6000
    assert proc.stats.clock_skew_rejected == 1


def test_a_sample_within_the_skew_is_applied_but_its_freshness_is_its_arrival() -> None:
    proc = StreamProcessor({}, TrackerSettings(max_clock_skew_ms=30_000))
    (state,) = proc.on_telemetry(_batch(1, T0 + 20_000), 0, T0)  # 20 s ahead: tolerated
    assert proc.stats.clock_skew_rejected == 0
    assert state.sample_ts_ms == T0  # never fresher than when it arrived


def test_a_snapshot_frozen_in_the_future_heals_on_the_next_genuine_sample() -> None:
    frozen = GpuTracker(uuid="GPU-n-0")
    frozen.learn_sample("n", GpuInfo("GPU-n-0", 0, "H100", 81920), GpuSample(0, 50, 0, 99, 50, 1000, 2500, 60),
                        T0 + HOUR, T0 + HOUR)  # learned by a worker before this check, or one whose clock was off
    proc = StreamProcessor({"GPU-n-0": frozen.to_dict()})
    proc.on_telemetry(_batch(3, T0), 0, T0)
    t = proc.trackers["GPU-n-0"]
    assert t.samples == 2 and t.sample_ts_ms == T0 and proc.stats.duplicates == 0


def test_skew_rejections_are_exported() -> None:
    proc = StreamProcessor({})
    proc.on_telemetry(_batch(1, T0 + HOUR), 0, T0)
    registry = CollectorRegistry()
    registry.register(StreamCollector(proc.stats, lambda: proc.trackers.values(), dict))
    assert "gpuaware_stream_clock_skew_rejected_total 1.0" in generate_latest(registry).decode()
