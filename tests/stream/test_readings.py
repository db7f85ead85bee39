"""The GPUs' readings in columns: a tracker's row lives as long as it does, a copy has its own, and the fleet check
over the columns judges as it judged from each tracker's readings."""

from __future__ import annotations

import copy
import gc
import math
import random
from collections import defaultdict

import pytest

from gpuaware.contract.events import GpuInfo, GpuSample
from gpuaware.stream.fleet_peers import FleetPeerSettings, check, outliers
from gpuaware.stream.gpu_state import GpuTracker
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.readings import NAMES, WIDTH, Readings
from tests.support import telemetry_batch

T0 = 1_700_000_000_000
S = FleetPeerSettings()
CAP = 0x4


def sample(t: GpuTracker, model: str, seq: int, ts_ms: int, util: int, power_w: float, temp: int,
           clock: int | None = 1980, throttle: int | None = None, sbe: int | None = None) -> None:
    info = GpuInfo(t.uuid, 0, model, 81920)
    t.learn_sample("n", info, GpuSample(0, seq, 0, util, 40, 30000, int(power_w * 10), temp, clock,
                                        throttle_reasons=throttle, ecc_sbe=sbe), ts_ms, ts_ms)


def test_a_row_is_given_back_with_its_tracker_and_comes_back_empty() -> None:
    store = Readings()
    t = GpuTracker(uuid="GPU-a", readings=store)
    sample(t, "H100", 1, T0, 50, 400.0, 60)
    slot = t.slot
    assert store.held() == 1 and t.smoothed["util_gpu"] == 50.0
    del t
    gc.collect()
    assert store.held() == 0
    u = GpuTracker(uuid="GPU-b", readings=store)
    assert u.slot == slot and dict(u.smoothed) == {}  # the row reused, its readings gone
    assert all(math.isnan(v) for v in store.values[slot * WIDTH:(slot + 1) * WIDTH])


def test_the_readings_are_a_read_only_view() -> None:
    t = GpuTracker(uuid="GPU-a", readings=Readings())
    sample(t, "H100", 1, T0, 50, 400.0, 60)
    with pytest.raises(TypeError):
        t.smoothed["temp_c"] = 20.0  # type: ignore[index]
    with pytest.raises(TypeError, match="shallowly"):
        copy.copy(t)


def test_a_deep_copy_of_a_processor_has_readings_of_its_own() -> None:
    """The heartbeat's oracle test deep-copies a processor: the copy's learning must not reach the original's rows."""
    proc = StreamProcessor({})
    proc.on_telemetry(telemetry_batch("n", 1, T0, util=40, gpus=2), 0, T0)
    twin = copy.deepcopy(proc)
    twin.on_telemetry(telemetry_batch("n", 2, T0 + 5000, util=100, gpus=2), 0, T0 + 5000)
    assert proc.trackers["GPU-n-0"].smoothed["util_gpu"] == 40.0
    assert twin.trackers["GPU-n-0"].smoothed["util_gpu"] > 40.0
    assert proc.trackers["GPU-n-0"].readings is not twin.trackers["GPU-n-0"].readings
    # a GPU the copy meets after the copy takes its row in the copy's store: its fleet check gathers one store
    twin.on_telemetry(telemetry_batch("m", 1, T0 + 6000, util=10, gpus=2), 0, T0 + 6000)
    assert twin.trackers["GPU-m-0"].readings is twin.trackers["GPU-n-0"].readings is twin.readings
    twin.fleet_check(T0 + 6000, None)
    proc.fleet_check(T0 + 6000, None)


def test_a_restored_tracker_has_the_readings_and_what_the_check_reads() -> None:
    store = Readings()
    t = GpuTracker(uuid="GPU-a", readings=store)
    sample(t, "H100", 1, T0, 50, 400.0, 60, throttle=CAP, sbe=3)
    restored = GpuTracker.from_dict(t.to_dict(), history=[])
    assert dict(restored.smoothed) == dict(t.smoothed) and set(t.smoothed) == set(NAMES)
    assert restored.to_dict() == t.to_dict()


def fleet(rnd: random.Random) -> list[GpuTracker]:
    """Three models' GPUs: most healthy, some hot, slow or power-hungry, some capped, with SBE counts or without, some
    silent for minutes, some without a sample, some restored from their snapshots (no cap or count known since)."""
    trackers = []
    for i in range(600):
        model = ("H100", "A100", "T4")[i % 3]
        t = GpuTracker(uuid=f"GPU-{i}")
        if i % 97 != 5:  # else never sampled
            ts = T0 - (300_000 if i % 53 == 7 else rnd.randrange(0, 60_000))
            for seq in range(1, rnd.randrange(3, 7)):
                power = rnd.uniform(300, 320) * (1.6 if i % 41 == 3 else 1.0)
                temp = int(30 + power / 20 + rnd.gauss(0, 1)) + (15 if i % 37 == 2 else 0)
                clock = None if i % 11 == 4 else 1980 - (500 if i % 43 == 8 else 0) + int(rnd.gauss(0, 8))
                sbe = (15 * seq if i % 59 == 9 else seq // 3) if i % 2 else None  # (a count over the window)
                sample(t, model, seq, ts + seq * 1000, rnd.choice([20, 25, 90, 95]), power, temp, clock,
                       CAP if i % 31 == 6 else None, sbe)
            if i % 29 == 10:
                t = GpuTracker.from_dict(t.to_dict(history=False), history=[])
        trackers.append(t)
    return trackers


def reference(trackers: list[GpuTracker], now_ms: int) -> dict[str, list[tuple[str, str]]]:
    """The check as it read each tracker before the columns: a row per fresh GPU from its readings, per model."""
    by_model: dict[str, list] = defaultdict(list)
    for t in trackers:
        sm = t.smoothed
        if t.model and t.samples and t.fresh_ms >= now_ms - S.fresh_ms and "power_w" in sm:
            by_model[t.model].append((t.uuid, sm["power_w"], sm.get("temp_c", 0.0), sm.get("util_gpu", 0.0),
                                      sm.get("sm_clock_mhz"), t.throttle_reasons & CAP, t.sbe_in_window))
    out = {}
    for rows in by_model.values():
        out.update({uuid: sorted(reasons) for uuid, reasons in outliers(rows, S).items()})
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_check_over_columns_judges_as_the_check_over_each_tracker(seed: int) -> None:
    trackers = fleet(random.Random(seed))
    want = reference(trackers, T0)
    assert {kind for reasons in want.values() for kind, _ in reasons} == {"temperature", "clock", "power", "ecc"}
    for _ in range(S.strikes):
        check(trackers, T0, S)
    assert {t.uuid: t.fleet_reasons for t in trackers if t.fleet_reasons} == {
        uuid: [text for _, text in reasons] for uuid, reasons in want.items()}
    check(trackers, T0 + 10 * 60_000, S)  # the data goes stale: every reason is dropped
    assert not any(t.fleet_reasons or t.fleet_strikes for t in trackers)


def test_the_check_refuses_trackers_of_two_stores() -> None:
    a, b = GpuTracker(uuid="GPU-a", readings=Readings()), GpuTracker(uuid="GPU-b", readings=Readings())
    with pytest.raises(ValueError, match="one store"):
        check([a, b], T0, S)
