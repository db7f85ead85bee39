"""The stream's per-GPU logic without a broker: trackers, fingerprints, rollups, the processor."""

from __future__ import annotations

import json
import time

import pytest

from agent.collectors.sim import load_scenario
from agent.replay import simulate
from contract.events import EventKind, GpuEvent, GpuInfo, GpuSample, HealthBand, Severity, TelemetryBatch
from stream import fingerprint as fp
from stream.gpu_state import GpuTracker, TrackerSettings
from stream.processor import InvalidRecord, StreamProcessor
from stream.rollup import merge_demand, model_demand, node_state

KINDS_SCENARIO = {
    "name": "kinds", "seed": 5, "nodes": 2, "gpus_per_node": 4, "models": ["H100", "A100"],
    "workloads": ["training-compute", "training-memory", "inference-bursty", "idle-holding"],
}
EXPECTED = {
    "training-compute": fp.TRAINING_COMPUTE, "training-memory": fp.TRAINING_MEMORY,
    "inference-bursty": fp.INFERENCE_BURSTY, "idle-holding": fp.IDLE_HOLDING,
}


def _replay(scenario: dict, seconds: int) -> tuple[StreamProcessor, dict]:
    from agent.collectors.sim import Scenario

    sc = Scenario.model_validate(scenario)
    proc = StreamProcessor({})
    now = time.time()
    for tick in simulate(sc, seconds, now - seconds):
        for batch in tick.batches:
            proc.on_telemetry(batch, 0, int(tick.second * 1000))
        for ev in tick.events:
            proc.on_event(ev, 0, int(tick.second * 1000))
    return proc, {g.uuid: g.workload for row in _cluster(sc) for g in row}


def _cluster(sc):
    from agent.collectors.sim import SimCluster

    return SimCluster(sc, clock=lambda: 0.0, epoch=0.0).gpus


def test_fingerprints_separate_the_simulators_workload_kinds() -> None:
    proc, kind_of = _replay(KINDS_SCENARIO, 600)
    assert len(proc.trackers) == 8
    for t in proc.trackers.values():
        cls, confidence = t.fingerprint.predict_one()
        assert cls == EXPECTED[kind_of[t.uuid]], (kind_of[t.uuid], cls, t.fingerprint.features())
        assert confidence > 0.5


def test_an_unknown_workload_starts_conservative_and_converges() -> None:
    f = fp.WorkloadFingerprint()
    seen = []
    for i in range(60):
        f.learn_one(i * 1000, 95.0, 25.0, 50_000, 80_000, 600.0)
        seen.append(f.predict_one())
    assert seen[0] == (fp.UNKNOWN, 0.0)
    assert seen[5][0] == fp.UNKNOWN
    assert seen[-1][0] == fp.TRAINING_COMPUTE
    confidences = [c for _, c in seen[fp.WorkloadFingerprint().min_samples:]]
    assert confidences == sorted(confidences) and confidences[-1] > 0.6


def _batch(node: str, seq: int, ts_ms: int, util: int = 50, fb: int = 1000, gpus: int = 1) -> TelemetryBatch:
    return TelemetryBatch(
        node, seq, ts_ms, [GpuInfo(f"GPU-{node}-{i}", i, "NVIDIA A100-SXM4-80GB", 81920) for i in range(gpus)],
        [GpuSample(i, seq, 0, util, util // 2, fb, 2500, 60) for i in range(gpus)],
    )


def test_duplicates_apply_once_and_a_restarted_agent_is_accepted() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    for seq in range(1, 11):
        proc.on_telemetry(_batch("n", seq, t0 + seq * 1000), 0, t0 + seq * 1000)
    for seq in range(5, 11):  # a spool replay after an outage
        proc.on_telemetry(_batch("n", seq, t0 + seq * 1000), 0, t0 + 20_000)
    t = proc.trackers["GPU-n-0"]
    assert (t.samples, t.duplicates, proc.stats.duplicates) == (10, 6, 6)
    proc.on_telemetry(_batch("n", 1, t0 + 30_000), 0, t0 + 30_000)  # agent restarted: seq from 1, newer time
    assert t.samples == 11


def test_forecasts_are_bounded_and_rebuilt_from_history_after_a_restart() -> None:
    proc, _ = _replay({**KINDS_SCENARIO, "workloads": ["trace"], "seed": 9}, 45 * 60)
    for key, t in proc.trackers.items():
        assert len(t.history) >= 40
        assert {(f.metric, f.horizon_s) for f in t.forecasts} == {
            (m, h * 60) for m in ("util_gpu", "fb_used_mib") for h in (1, 5, 15)}
        for f in t.forecasts:
            hi = 100.0 if f.metric == "util_gpu" else t.fb_total_mib
            assert 0.0 <= f.lower <= f.mean <= f.upper <= hi
        # What the changelog stores is JSON; the restored tracker forecasts like the original.
        restored = GpuTracker.from_dict(json.loads(json.dumps(proc.snapshots[key])))
        assert restored.samples == t.samples and restored.last_seq == t.last_seq
        before = {(f.metric, f.horizon_s): f.mean for f in t.forecasts}
        after = {(f.metric, f.horizon_s): f.mean for f in restored.forecasts}
        for k, mean in before.items():
            scale = 100.0 if k[0] == "util_gpu" else t.fb_total_mib
            assert abs(after[k] - mean) <= 0.05 * scale, (k, mean, after[k])


def test_publishing_is_on_change_and_rate_bounded() -> None:
    proc = StreamProcessor({}, TrackerSettings(min_interval_ms=1000, max_interval_ms=10_000))
    t0 = 1_700_000_000_000
    assert len(proc.on_telemetry(_batch("n", 1, t0), 0, t0)) == 1  # first state
    assert proc.on_telemetry(_batch("n", 2, t0 + 1500), 0, t0 + 1500) == []  # unchanged
    assert proc.heartbeats(t0 + 5000, None) == []
    (beat,) = proc.heartbeats(t0 + 10_300, None)  # nothing changed for max_interval: republished
    assert beat.sample_ts_ms == t0 + 1500 and beat.published_ms == t0 + 10_300
    assert proc.on_telemetry(_batch("n", 3, t0 + 10_400, util=95), 0, t0 + 10_400) == []  # changed, too soon
    (changed,) = proc.on_telemetry(_batch("n", 4, t0 + 11_400, util=95), 0, t0 + 11_400)
    assert changed.util_gpu > 60


def test_health_events_set_score_band_and_components() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(_batch("n", 1, t0), 0, t0)
    ev = GpuEvent("e1", t0 + 10, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 22.0,
                  None, "health healthy -> critical", {"old_band": "HEALTHY", "new_band": "CRITICAL",
                                                        "component.ecc": "40.0", "component.xid": "30.0"})
    (state,) = proc.on_event(ev, 0, t0 + 20)  # a band change is published at once, not rate-limited
    assert state.health_band == HealthBand.CRITICAL and state.health_score == 22.0
    assert state.health_components == {"ecc": 40.0, "xid": 30.0}
    assert proc.snapshots["GPU-n-0"]["recent_events"][-1][1] == "HEALTH_CHANGE"


def test_a_batch_naming_a_missing_gpu_slot_is_invalid() -> None:
    bad = _batch("n", 1, 0)
    bad.samples[0].gpu = 3
    with pytest.raises(InvalidRecord, match="GPU slots \\[3\\]"):
        StreamProcessor({}).on_telemetry(bad, 0, 0)


def test_non_physical_values_are_invalid_and_change_nothing() -> None:
    proc = StreamProcessor({})
    bad = _batch("n", 1, 0)
    bad.samples[0].util_gpu = 250
    with pytest.raises(InvalidRecord, match="out of physical range"):
        proc.on_telemetry(bad, 0, 0)
    ev = GpuEvent("e", 0, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.INFO, "health_score", float("nan"))
    with pytest.raises(InvalidRecord, match="value is nan"):
        proc.on_event(ev, 0, 0)
    assert proc.trackers == {} and proc.snapshots == {}


def test_rollups_exclude_critical_gpus_from_capacity() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(_batch("n", 1, t0, util=40, fb=1000, gpus=2), 0, t0)
    healthy, sick = proc.trackers["GPU-n-0"], proc.trackers["GPU-n-1"]
    sick.health_band = HealthBand.CRITICAL.value
    state = node_state("n", [healthy, sick], t0)
    assert state.free_gpu_milli == 600 and state.free_fb_mib == 81920 - 1000
    assert [g.health_band for g in state.gpus] == [HealthBand.HEALTHY, HealthBand.CRITICAL]
    for t in (healthy, sick):
        t._models()
        t._learn_minute(40.0, 1000.0)
    partial = model_demand([healthy, sick])
    (line, *_) = [d for d in merge_demand({"0": partial, "1": partial}) if d.horizon_s == 60]
    assert line.capacity_gpus == 2.0  # one usable GPU in each of two partials
    assert line.demand_gpus == pytest.approx(4 * 0.4, abs=0.01)


def test_scenario_workloads_are_validated() -> None:
    from pydantic import ValidationError

    from agent.collectors.sim import Scenario

    with pytest.raises(ValidationError, match="workloads"):
        Scenario.model_validate({**KINDS_SCENARIO, "workloads": ["mining"]})
    assert load_scenario("baseline").workloads == ["trace"]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_int = st.integers(-(2**31), 2**31 - 1)


@st.composite
def _batches(draw) -> TelemetryBatch:
    n = draw(st.integers(0, 3))
    gpus = [GpuInfo(draw(st.sampled_from(["GPU-a", "GPU-b", ""])), i, draw(st.text(max_size=5)),
                    draw(_int)) for i in range(n)]
    samples = [GpuSample(draw(st.integers(-1, 4)), draw(_int), draw(_int), draw(_int), draw(_int), draw(_int),
                         draw(_int), draw(_int)) for _ in range(draw(st.integers(0, 6)))]
    return TelemetryBatch(draw(st.sampled_from(["n", ""])), draw(_int), draw(_int), gpus, samples)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_batches(), st.builds(
    GpuEvent, st.text(max_size=4), _int, st.text(max_size=4), st.sampled_from(["GPU-a", "GPU-b"]),
    st.sampled_from(list(EventKind)), st.sampled_from(list(Severity)), st.none() | st.text(max_size=4),
    st.none() | st.floats(allow_nan=True), st.none() | st.floats(), st.text(max_size=8),
    st.dictionaries(st.sampled_from(["new_band", "component.ecc", "old_band", "x"]), st.text(max_size=8)))),
    max_size=12))
def test_any_decodable_record_is_applied_or_rejected_as_invalid_never_crashes(records) -> None:
    proc = StreamProcessor({})
    now = 1_700_000_000_000
    for r in records:
        try:
            if isinstance(r, TelemetryBatch):
                proc.on_telemetry(r, 0, now)
            else:
                proc.on_event(r, 0, now)
        except InvalidRecord:
            continue
        now += 1000
    for t in proc.trackers.values():
        state = t.state(now)  # every tracker can still render a valid, encodable record
        from contract.events import decode, encode

        assert decode(encode(state)) == state
    proc.heartbeats(now + 60_000, None)
    proc.node_states(now, None)
