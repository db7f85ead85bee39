"""Per-GPU stream state: duplicates applied once, forecasts rebuilt after a restart, publishing on change and
rate-bounded, health events; and skewed clocks: a batch stamped in the future must not freeze a GPU."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest

from gpuaware.contract.events import (
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuSample,
    HealthBand,
    Severity,
    TelemetryBatch,
    WatchPoint,
)
from gpuaware.stream.gpu_state import GpuTracker, TrackerSettings
from gpuaware.stream.metrics import StreamCollector
from gpuaware.stream.processor import StreamProcessor
from tests.support import KINDS_SCENARIO, replay_scenario, telemetry_batch

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
    proc = StreamProcessor({"GPU-n-0": json.dumps(frozen.to_dict()).encode()})
    proc.on_telemetry(_batch(3, T0), 0, T0)
    t = proc.trackers["GPU-n-0"]
    assert t.samples == 2 and t.sample_ts_ms == T0 and proc.stats.duplicates == 0


def test_skew_rejections_are_exported() -> None:
    proc = StreamProcessor({})
    proc.on_telemetry(_batch(1, T0 + HOUR), 0, T0)
    registry = CollectorRegistry()
    registry.register(StreamCollector(proc.stats, lambda: proc.trackers.values(), dict))
    assert "gpuaware_stream_clock_skew_rejected_total 1.0" in generate_latest(registry).decode()


def test_duplicates_apply_once_and_a_restarted_agent_is_accepted() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    for seq in range(1, 11):
        proc.on_telemetry(telemetry_batch("n", seq, t0 + seq * 1000), 0, t0 + seq * 1000)
    for seq in range(5, 11):  # a spool replay after an outage
        proc.on_telemetry(telemetry_batch("n", seq, t0 + seq * 1000), 0, t0 + 20_000)
    t = proc.trackers["GPU-n-0"]
    assert (t.samples, t.duplicates, proc.stats.duplicates) == (10, 6, 6)
    proc.on_telemetry(telemetry_batch("n", 1, t0 + 30_000), 0, t0 + 30_000)  # agent restarted: seq from 1, newer time
    assert t.samples == 11


def test_forecasts_are_bounded_and_rebuilt_from_history_after_a_restart() -> None:
    proc, _ = replay_scenario({**KINDS_SCENARIO, "workloads": ["trace"], "seed": 9}, 45 * 60)
    for key, t in proc.trackers.items():
        assert len(t.history) >= 40
        assert {(f.metric, f.horizon_s) for f in t.forecasts} == {
            (m, h * 60) for m in ("util_gpu", "fb_used_mib") for h in (1, 5, 15)}
        for f in t.forecasts:
            hi = 100.0 if f.metric == "util_gpu" else t.fb_total_mib
            assert 0.0 <= f.lower <= f.mean <= f.upper <= hi
        # What the changelog stores is JSON; the restored tracker forecasts like the original.
        restored = GpuTracker.from_dict(json.loads(json.dumps(proc.snapshot(key))))
        assert restored.samples == t.samples and restored.last_seq == t.last_seq
        # While the history covers the GPU's life (45 of 60 minutes here), replaying it rebuilds the
        # forecasters' River statistics, losses and errors exactly: the same forecasts and intervals.
        assert restored.forecasts == t.forecasts
        assert restored.forecast_abs_errors() == t.forecast_abs_errors()


def test_the_minute_history_is_the_last_hour_of_minutes_and_the_forecasters_values() -> None:
    """The history is kept as its minutes and the forecasters' last values (docs/stream.md, "Memory"): past an hour
    it holds the last 60 minutes' means, and a tracker restored from its snapshot holds the same history."""
    proc = StreamProcessor({})
    utils = [(7 * m) % 101 for m in range(75)]
    for m, util in enumerate(utils):
        proc.on_telemetry(_batch(m + 1, T0 + m * 60_000, util=util), 0, T0 + m * 60_000)
    t = proc.trackers["GPU-n-0"]
    first = T0 // 60_000
    assert t.history == [(first + m, float(utils[m]), 1000.0) for m in range(74 - 60, 74)]  # the 75th is still open
    restored = GpuTracker.from_dict(json.loads(json.dumps(t.to_dict())))
    assert restored.history == t.history and restored.history_changes == 0
    assert len(restored.forecasts) == 6
    # A node entry's ``closed`` minutes: the history's last ones, made alone, also for more than it holds.
    short = StreamProcessor({})
    for m in range(4):
        short.on_telemetry(_batch(m + 1, T0 + m * 60_000, util=utils[m]), 0, T0 + m * 60_000)
    for tracker in (t, short.trackers["GPU-n-0"], GpuTracker(uuid="GPU-new")):
        for n in (0, 1, 2, 3, 4, 59, 60, 61):
            assert tracker.last_minutes(n) == (tracker.history[-n:] if n else [])
    assert len(short.trackers["GPU-n-0"].history) == 3


def test_publishing_is_on_change_and_rate_bounded() -> None:
    proc = StreamProcessor({}, TrackerSettings(min_interval_ms=1000, max_interval_ms=10_000, every_sample=False))
    t0 = 1_700_000_000_000
    assert len(proc.on_telemetry(telemetry_batch("n", 1, t0), 0, t0)) == 1  # first state
    assert proc.on_telemetry(telemetry_batch("n", 2, t0 + 1500), 0, t0 + 1500) == []  # unchanged
    assert proc.heartbeats(t0 + 5000, None) == []
    (beat,) = proc.heartbeats(t0 + 10_300, None)  # nothing changed for max_interval: republished
    assert beat.sample_ts_ms == t0 + 1500 and beat.published_ms == t0 + 10_300
    assert proc.on_telemetry(telemetry_batch("n", 3, t0 + 10_400, util=95), 0, t0 + 10_400) == []  # changed, too soon
    (changed,) = proc.on_telemetry(telemetry_batch("n", 4, t0 + 11_400, util=95), 0, t0 + 11_400)
    assert changed.util_gpu > 60


def test_every_new_sample_is_published_rate_bounded_and_not_while_catching_up() -> None:
    """The default: a sample that moves nothing past the steps still reaches the scheduler with the next state, not
    with the refresh (``gpuaware.bench.publish_latency``: p99 sample-to-state 24 s -> the agents' 5 s batching)."""
    proc = StreamProcessor({}, TrackerSettings(min_interval_ms=1000, max_interval_ms=30_000))
    assert len(proc.on_telemetry(telemetry_batch("n", 1, T0), 0, T0)) == 1
    assert proc.on_telemetry(telemetry_batch("n", 2, T0 + 500), 0, T0 + 500) == []  # within min_interval_ms
    (held,) = proc.heartbeats(T0 + 1000, None)  # ... so the heartbeat takes it
    assert held.sample_ts_ms == T0 + 500
    (same,) = proc.on_telemetry(telemetry_batch("n", 3, T0 + 2500), 0, T0 + 2500)  # unchanged values, new sample
    assert same.sample_ts_ms == T0 + 2500
    assert proc.heartbeats(T0 + 4000, None) == []  # nothing new: nothing until the refresh
    # A watch point moves utilisation but is no new sample: below the steps it waits for the refresh as before.
    points = telemetry_batch("n", 4, T0 + 5000)
    points.samples, points.points = [], [WatchPoint(0, 0, 51, 2500)]
    assert proc.on_telemetry(points, 0, T0 + 5000) == []
    # Behind (records of the GPU follow in the log): new samples wait for the heartbeat's rate.
    assert proc.on_telemetry(telemetry_batch("n", 5, T0 + 6000), 0, T0 + 6000, behind=True) == []


def test_a_worker_catching_up_publishes_health_changes_at_once_and_the_rest_as_heartbeats() -> None:
    proc = StreamProcessor({}, TrackerSettings(min_interval_ms=1000, max_interval_ms=10_000))
    t0 = 1_700_000_000_000
    assert len(proc.on_telemetry(telemetry_batch("n", 1, t0), 0, t0, behind=True)) == 1  # the first state
    # Changed, past the minimum interval, but newer records follow in the log: not published ...
    assert proc.on_telemetry(telemetry_batch("n", 2, t0 + 2000, util=95), 0, t0 + 2000, behind=True) == []
    assert proc.heartbeats(t0 + 3000, None) == []  # nor by the heartbeat timer
    ev = GpuEvent("e1", t0 + 2100, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 22.0,
                  None, "x", {"new_band": "CRITICAL"})
    assert len(proc.on_event(ev, 0, t0 + 2100)) == 1  # ... a health change is, at once
    assert proc.on_telemetry(telemetry_batch("n", 3, t0 + 4000, util=10), 0, t0 + 4000, behind=True) == []
    (beat,) = proc.on_telemetry(telemetry_batch("n", 4, t0 + 12_200, util=95), 0, t0 + 12_200, behind=True)
    assert beat.samples == 4  # the heartbeat's rate still holds while behind
    # Caught up: a change goes out again on the next record.
    assert proc.on_telemetry(telemetry_batch("n", 5, t0 + 13_300, util=10), 0, t0 + 13_300) != []


def test_health_events_set_score_band_and_components() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(telemetry_batch("n", 1, t0), 0, t0)
    ev = GpuEvent("e1", t0 + 10, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 22.0,
                  None, "health healthy -> critical", {"old_band": "HEALTHY", "new_band": "CRITICAL",
                                                        "component.ecc": "40.0", "component.xid": "30.0"})
    (state,) = proc.on_event(ev, 0, t0 + 20)  # a band change is published at once, not rate-limited
    assert state.health_band == HealthBand.CRITICAL and state.health_score == 22.0
    assert state.health_components == {"ecc": 40.0, "xid": 30.0}
    assert proc.snapshot("GPU-n-0")["recent_events"][-1][1] == "HEALTH_CHANGE"


def test_light_watch_points_move_utilisation_between_full_samples_once() -> None:
    from gpuaware.contract.events import WatchPoint

    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(telemetry_batch("n", 1, t0, util=10), 0, t0)
    batch = telemetry_batch("n", 2, t0 + 1000, util=10)
    batch.samples = []
    batch.points = [WatchPoint(0, 0, 90, 3000), WatchPoint(0, 1000, 95, 3100)]
    proc.on_telemetry(batch, 0, t0 + 2500)
    snap = proc.snapshot("GPU-n-0")
    assert snap["smoothed"]["util_gpu"] > 40 and proc.stats.points == 2
    proc.on_telemetry(batch, 0, t0 + 3000)  # replayed: applied once
    assert proc.stats.points == 2 and proc.snapshot("GPU-n-0")["smoothed"] == snap["smoothed"]


def test_snapshot_fingerprint_is_what_asdict_gives():
    # to_dict copies the fingerprint's fields itself (hot path); the snapshot must not change shape.
    import dataclasses

    from gpuaware.contract.events import GpuInfo, GpuSample

    t = GpuTracker(uuid="GPU-x")
    info = GpuInfo("GPU-x", 0, "H100", 81559)
    for i in range(15):
        t.learn_sample("n", info, GpuSample(0, i, 0, 40 + i, 10, 1000 + i, 3000, 50), 1_000 * i, 1_000 * i)
    snap = t.to_dict()
    assert snap["fingerprint"] == dataclasses.asdict(t.fingerprint)
    assert list(snap["fingerprint"]) == list(dataclasses.asdict(t.fingerprint))  # in the same order: the same JSON
    assert GpuTracker.from_dict(snap).fingerprint == t.fingerprint


def test_the_heartbeat_passes_over_gpus_with_nothing_new_without_building_their_signature(monkeypatch) -> None:
    """At fleet size the heartbeat built every GPU's signature every second (docs/performance.md); only a GPU
    that learnt something since its last state is looked at again, and what it learnt still goes out."""
    proc = StreamProcessor({}, TrackerSettings(min_interval_ms=1000, max_interval_ms=10_000, every_sample=False))
    assert len(proc.on_telemetry(telemetry_batch("n", 1, T0), 0, T0)) == 1
    built = []
    real = GpuTracker._signature
    monkeypatch.setattr(GpuTracker, "_signature", lambda self: built.append(self.uuid) or real(self))
    for s in range(2, 6):
        assert proc.heartbeats(T0 + s * 1000, None) == []
    assert built == []  # nothing new: no signature built
    proc.on_telemetry(telemetry_batch("n", 2, T0 + 6000), 0, T0 + 6000)  # the same values: below every step
    assert len(built) == 1 and proc.heartbeats(T0 + 7000, None) == [] and len(built) == 1
    (changed,) = proc.on_telemetry(telemetry_batch("n", 3, T0 + 8000, util=95), 0, T0 + 8000)
    assert changed.samples == 3
    (tracker,) = proc.trackers.values()
    tracker.fleet_reasons, tracker.fleet_strikes = ["fleet peers: hot"], {"temperature": 3}
    tracker.mark_changed()  # as gpuaware.stream.fleet_peers does
    (flagged,) = proc.heartbeats(T0 + 9500, None)  # a fleet verdict moves the signature: it goes out
    assert flagged.samples == 3


def test_a_gpu_is_forecasting_from_its_first_closed_minute_and_after_a_restore() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000
    proc.on_telemetry(telemetry_batch("n", 1, t0 + 1000), 0, t0 + 1000)
    proc.on_telemetry(telemetry_batch("n", 2, t0 + 30_000), 0, t0 + 30_000)
    assert not proc.trackers["GPU-n-0"].forecasting  # met, its minute still open
    proc.on_telemetry(telemetry_batch("n", 3, t0 + 61_000), 0, t0 + 61_000)
    assert proc.trackers["GPU-n-0"].forecasting
    restored = StreamProcessor(proc.snapshots)
    restored.on_telemetry(telemetry_batch("n", 4, t0 + 62_000), 0, t0 + 62_000)
    assert restored.trackers["GPU-n-0"].forecasting  # rebuilt from the history on load
