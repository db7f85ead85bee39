"""The processor's checks on records that decode: invalid ones are rejected and change nothing, and no
decodable record crashes it (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.events import EventKind, GpuEvent, GpuInfo, GpuSample, Severity, TelemetryBatch
from stream.processor import InvalidRecord, StreamProcessor
from tests.support import telemetry_batch


def test_a_batch_naming_a_missing_gpu_slot_is_invalid() -> None:
    bad = telemetry_batch("n", 1, 0)
    bad.samples[0].gpu = 3
    with pytest.raises(InvalidRecord, match="GPU slots \\[3\\]"):
        StreamProcessor({}).on_telemetry(bad, 0, 0)


def test_non_physical_values_are_invalid_and_change_nothing() -> None:
    proc = StreamProcessor({})
    bad = telemetry_batch("n", 1, 0)
    bad.samples[0].util_gpu = 250
    with pytest.raises(InvalidRecord, match="out of physical range"):
        proc.on_telemetry(bad, 0, 0)
    ev = GpuEvent("e", 0, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.INFO, "health_score", float("nan"))
    with pytest.raises(InvalidRecord, match="value is nan"):
        proc.on_event(ev, 0, 0)
    assert proc.trackers == {} and proc.snapshots == {}


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
