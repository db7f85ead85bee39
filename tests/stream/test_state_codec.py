"""GPU states written field by field are the bytes the contract's ``encode`` gives, for any state."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaware.contract.events import Forecast, GpuState, HealthAction, HealthBand, HealthVerdict, decode, encode
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.state_codec import GpuStateCodec, KeptForecasts
from tests.support import telemetry_batch

T0 = 1_700_000_000_000
longs = st.integers(-(1 << 63), (1 << 63) - 1)
ints = st.integers(-(1 << 31), (1 << 31) - 1)
doubles = st.floats(allow_nan=False, width=64)
text = st.text(max_size=12)
forecasts = st.lists(st.builds(Forecast, text, ints, doubles, doubles, doubles), max_size=4)
states = st.builds(
    GpuState, gpu_uuid=text, node=text, model=text, sample_ts_ms=longs, published_ms=longs, util_gpu=doubles,
    util_mem=doubles, fb_used_mib=doubles, fb_total_mib=ints, power_w=doubles, temp_c=doubles, health_score=doubles,
    health_band=st.sampled_from(HealthBand), health_components=st.dictionaries(text, doubles, max_size=5),
    forecasts=forecasts, workload_class=st.none() | text, class_confidence=st.none() | doubles, samples=longs,
    verdict=st.sampled_from(HealthVerdict), verdict_reasons=st.lists(text, max_size=3),
    recommended_action=st.sampled_from(HealthAction))


@settings(max_examples=400, deadline=None)
@given(st.lists(states, min_size=1, max_size=6), st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=6,
                                                            max_size=6))
def test_any_state_is_the_bytes_encode_gives(batch: list[GpuState], keys: list[bytes]) -> None:
    """Several states under a few keys, one codec: what it keeps per key (identity, forecasts) never leaks into another
    GPU's state or a changed one's."""
    codec = GpuStateCodec()
    for state, key in zip(batch, keys, strict=False):
        assert codec.encode(state, key) == encode(state)
        assert codec.encode(state, key) == encode(state)  # from what it kept


def test_a_worker_s_states_across_minutes_are_the_bytes_encode_gives_and_decode_back() -> None:
    """The states a processor makes (forecasts rendered anew each minute, a GPU moved to another node, GPUs forgotten
    and met again) are ``encode``'s bytes."""
    proc = StreamProcessor({})
    codec = GpuStateCodec()
    checked = 0
    for minute in range(4):
        for second in range(0, 60, 7):
            now = T0 + minute * 60_000 + second * 1000
            node = "codec-a" if minute < 2 else "codec-b"
            for state in proc.on_telemetry(telemetry_batch(node, minute * 60 + second, now, util=10 + 20 * minute,
                                                           gpus=2), 0, now):
                key = state.key()
                assert codec.encode(state, key) == encode(state)
                assert decode(codec.encode(state, key), GpuState) == state
                other = dataclasses.replace(state, forecasts=[Forecast("util_gpu", 60, 1.0, 0.0, 2.0)])
                assert codec.encode(other, key) == encode(other)
                checked += bool(state.forecasts)
        codec.forget([b"GPU-codec-a-0"])
    assert checked > 10


def test_a_value_the_contract_refuses_is_a_value_error() -> None:
    state = GpuState("GPU-x", "n", "H100", T0, T0, 1.0, 1.0, 1.0, 81559, 1.0, 1.0, 100.0, HealthBand.HEALTHY)
    codec = GpuStateCodec()
    for bad in (dataclasses.replace(state, node=None), dataclasses.replace(state, health_band="SICK"),
                dataclasses.replace(state, util_gpu="high"), dataclasses.replace(state, samples=1 << 64),
                dataclasses.replace(state, sample_ts_ms=str(T0)),  # a digit string is not a long
                dataclasses.replace(state, forecasts=[Forecast(None, 60, 1.0, 0.0, 2.0)]),
                dataclasses.replace(state, forecasts=[Forecast("util_gpu", "60", 1.0, 0.0, 2.0)]),
                dataclasses.replace(state, forecasts=[Forecast("util_gpu", 60, "high", 0.0, 2.0)])):
        with pytest.raises((ValueError, OverflowError, TypeError)):  # (fastavro's, for a long out of range, a str)
            encode(bad)
        with pytest.raises(ValueError):
            codec.encode(bad, b"GPU-x")


def test_numpy_numbers_and_a_float_for_an_integer_are_written_as_encode_writes_them() -> None:
    import numpy as np

    state = GpuState("GPU-x", "n", "H100", np.int64(T0), T0, np.float64(1.5), 1.0, 1.0, np.int32(81559), 1.0, 1.0,
                     100.0, HealthBand.HEALTHY, samples=np.int64(1 << 40))
    codec = GpuStateCodec()
    assert codec.encode(state, b"GPU-x") == encode(state)
    for ts in (1.5, -1.5, 7.0):  # fastavro truncates
        assert codec.encode(dataclasses.replace(state, sample_ts_ms=ts), b"GPU-x") == encode(
            dataclasses.replace(state, sample_ts_ms=ts))


def test_a_changed_record_stops_the_codec_until_it_is_brought_in_line(monkeypatch) -> None:
    from gpuaware.stream import state_codec

    monkeypatch.setattr(state_codec, "FIELDS", state_codec.FIELDS[:-1])
    with pytest.raises(RuntimeError, match="brought in line"):
        GpuStateCodec()


def test_a_trackers_state_with_its_kept_forecasts_is_still_a_plain_dataclass() -> None:
    # dataclasses.asdict rebuilds a list subclass from its items alone; the kept forecasts' list must allow it.
    proc = StreamProcessor({})
    now = 1_700_000_000_000
    for i in range(3):
        proc.on_telemetry(telemetry_batch("n", i + 1, now + 1000 * i, gpus=1), 0, now + 1000 * i)
    (tracker,) = proc.trackers.values()
    state = tracker.state(now + 3000)
    as_dict = dataclasses.asdict(state)
    assert as_dict["forecasts"] == [dataclasses.asdict(f) for f in state.forecasts]


def test_forecasts_given_as_dicts_are_written_as_encode_writes_them() -> None:
    """The codec writes ``Forecast`` records itself; anything else fastavro takes (a dict per forecast) goes through
    the contract's encoder, as before."""
    state = GpuState("GPU-x", "n", "H100", T0, T0, 1.0, 1.0, 1.0, 81559, 1.0, 1.0, 100.0, HealthBand.HEALTHY,
                     forecasts=[{"metric": "util_gpu", "horizon_s": 60, "mean": 1.0, "lower": 0.0, "upper": 2.0}])
    assert GpuStateCodec().encode(state, b"GPU-x") == encode(state)


def test_states_written_straight_from_the_trackers_are_the_bytes_of_their_records() -> None:
    """The worker's path (``StreamProcessor.render``: key and bytes from ``GpuTracker.state_parts``) against the
    records ``GpuTracker.state`` makes, encoded by the contract: two processors fed the same agents' records (faults
    that change health bands, verdicts and components; forecasts renewed each minute; fleet peer reasons; heartbeats),
    every state the same key and bytes, in the same order."""
    import time

    from gpuaware.agent.collectors.scenario import Fault, Scenario
    from gpuaware.agent.replay import simulate

    sc = Scenario(name="straight", seed=3, nodes=3, gpus_per_node=4, workloads=["training-compute", "inference-bursty"],
                  faults=[Fault(kind="ecc_sbe_storm", node=0, gpu=1, at_s=30),
                          Fault(kind="xid", node=1, gpu=2, at_s=90),
                          Fault(kind="thermal_runaway", node=2, gpu=0, at_s=60, rise_c_per_s=0.5),
                          Fault(kind="power_skew", node=2, gpu=3, at_s=0)])
    records, straight = StreamProcessor({}), StreamProcessor({})
    codec = GpuStateCodec()
    straight.render = lambda t, now: codec.encode_tracker(t, now)
    compared, forecasting, bands, verdicts = 0, 0, set(), set()
    for tick in simulate(sc, 240, time.time() - 240):
        now = int(tick.second * 1000)
        outs = [[], []]
        for i, proc in enumerate((records, straight)):
            for batch in tick.batches:
                outs[i] += proc.on_telemetry(batch, 0, now)
            for ev in tick.events:
                outs[i] += proc.on_event(ev, 0, now)
            outs[i] += proc.heartbeats(now, None)
            if tick.second % 5 == 0:
                proc.fleet_check(now, None)
        assert [(s.key(), encode(s)) for s in outs[0]] == outs[1]
        compared += len(outs[0])
        forecasting += sum(bool(s.forecasts) for s in outs[0])
        bands |= {s.health_band for s in outs[0]}
        verdicts |= {s.verdict for s in outs[0]}
    assert compared > 500 and forecasting > 100 and len(bands) > 1 and len(verdicts) > 1, (compared, bands, verdicts)
    # The refreshes of a silent fleet, some GPUs judged outliers by their peers (their verdict and reasons change).
    for proc in (records, straight):
        for key in sorted(proc.trackers)[::3]:
            proc.trackers[key].fleet_reasons = [f"fleet peers: {key} draws less power than its peers"]
    refreshed = 0
    for k in range(1, 4):
        now = int(tick.second * 1000) + k * 31_000
        want = [(s.key(), encode(s)) for s in records.heartbeats(now, None)]
        assert want == straight.heartbeats(now, None)
        refreshed += len(want)
    assert refreshed >= 3 * len(records.trackers)
    # One codec, both paths in turn for the same GPUs (what it keeps per GPU is shared).
    mixed = GpuStateCodec()
    for i, t in enumerate(sorted(straight.trackers.values(), key=lambda t: t.uuid) * 3):
        now = int(tick.second * 1000) + 200_000 + i
        state = t.state(now)
        assert (mixed.encode(state, state.key()) if i % 2 else mixed.encode_tracker(t, now)[1]) == encode(state)


def test_a_tracker_s_state_rounds_its_readings_as_the_contract_says() -> None:
    """Two decimals for utilisation, one for framebuffer, power and temperature, whichever path writes the state."""
    proc = StreamProcessor({})
    for i, (util, fb) in enumerate(((50, 1000), (51, 1001), (52, 1002))):
        proc.on_telemetry(telemetry_batch("r", i + 1, T0 + 1000 * i, util=util, fb=fb), 0, T0 + 1000 * i)
    (t,) = proc.trackers.values()
    state = t.state(T0 + 5000)
    assert (state.util_gpu, state.util_mem, state.fb_used_mib, state.power_w, state.temp_c) == (
        50.81, 25.3, 1000.8, 250.0, 60.0)
    assert GpuStateCodec().encode_tracker(t, T0 + 5000) == (state.key(), encode(state))


def test_a_state_rebuilt_from_its_items_is_written_with_its_own_forecasts() -> None:
    """A state's kept forecasts rebuilt from their items alone (``GpuState(**asdict(...))``) have no packed numbers:
    they are their own, not those of the last state the codec wrote for the GPU."""
    proc = StreamProcessor({})
    for i in range(130):
        now = T0 + 1000 * i
        proc.on_telemetry(telemetry_batch("k", i + 1, now, util=20 + i % 50), 0, now)
    (t,) = proc.trackers.values()
    codec = GpuStateCodec()
    empty = dataclasses.replace(t.state(T0 + 200_000), forecasts=KeptForecasts((), b""))
    assert codec.encode(empty, empty.key()) == encode(empty)
    rebuilt = GpuState(**{f.name: getattr(t.state(T0 + 201_000), f.name) for f in dataclasses.fields(GpuState)})
    rebuilt.forecasts = KeptForecasts(list(rebuilt.forecasts))
    assert rebuilt.forecasts and codec.encode(rebuilt, rebuilt.key()) == encode(rebuilt)
