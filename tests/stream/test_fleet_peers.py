"""Fleet-level peer comparison in the stream: a GPU hotter at the same power, slower clocked under load, or
drawing other power at the same utilisation than its model's fleet gets a reason on gpu.state."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

import numpy as np
import pytest

from gpuaware.contract.events import GpuInfo, GpuSample, HealthVerdict
from gpuaware.stream.fleet_peers import MAD_TO_SIGMA, FleetPeerSettings, Row, check, outliers, power_bins
from gpuaware.stream.gpu_state import SBE_WINDOW_MS, GpuTracker
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.readings import Readings, gather

S = FleetPeerSettings()


def fleet(n: int, seed: int = 0) -> list[Row]:
    """A healthy H100 fleet: busy GPUs at 600-700 W, 60-70 °C rising with power, clocks near 1980 MHz."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        power = rnd.uniform(600, 700)
        rows.append((f"GPU-{i}", power, 30 + power / 20 + rnd.gauss(0, 1.0), rnd.uniform(85, 95),
                     1980 + rnd.gauss(0, 10), False))
    return rows


def test_a_healthy_fleet_has_no_outlier():
    for seed in range(20):
        assert outliers(fleet(200, seed), S) == {}


def test_a_hot_gpu_a_slow_clocked_one_and_a_power_hungry_one_are_flagged_and_only_they():
    rows = fleet(64)
    rows[3] = (rows[3][0], rows[3][1], rows[3][2] + 12, *rows[3][3:])  # a failing fan
    rows[5] = (*rows[5][:4], 1500.0, False)  # clocks held down
    rows[7] = (rows[7][0], rows[7][1] * 1.6, *rows[7][2:])  # power off its utilisation
    rows[9] = (rows[9][0], rows[9][1] * 0.5, rows[9][2], rows[9][3], 1400.0, True)  # power-capped: not a fault
    found = outliers(rows, S)
    assert {u: [k for k, _ in v] for u, v in found.items()} == \
        {"GPU-3": ["temperature"], "GPU-5": ["clock"], "GPU-7": ["power"]}
    assert found["GPU-3"][0][1].startswith("fleet peers: +1") and "same power" in found["GPU-3"][0][1]


def test_too_few_peers_judges_nothing():
    rows = fleet(8)  # 7 peers each
    rows[0] = (rows[0][0], rows[0][1], rows[0][2] + 30, *rows[0][3:])
    assert outliers(rows, S) == {}


def tracker(i: int, temp: int, ts_ms: int) -> GpuTracker:
    t = GpuTracker(uuid=f"GPU-{i}")
    info = GpuInfo(f"GPU-{i}", i % 8, "H100", 81920)
    t.learn_sample(f"n{i // 8}", info, GpuSample(i % 8, 1, 0, 90, 50, 40000, 6500, temp, 1980), ts_ms, ts_ms)
    return t


def test_the_reason_shows_on_the_state_after_three_checks_and_goes_when_it_stops():
    now = 1_000_000
    trackers = [tracker(i, 62 + (i % 3), now) for i in range(24)]
    hot = tracker(99, 80, now)
    trackers.append(hot)
    for n in range(1, 4):
        check(trackers, now, S)
        assert bool(hot.fleet_reasons) == (n == 3)
    state = hot.state(now)
    assert state.verdict == HealthVerdict.WARNING and state.recommended_action.value == "WATCH"
    assert any(r.startswith("fleet peers:") for r in state.verdict_reasons)
    assert all(not t.fleet_reasons for t in trackers if t is not hot)
    info = GpuInfo("GPU-99", 99 % 8, "H100", 81920)
    for seq in range(2, 12):  # it cools down to its peers' temperature
        hot.learn_sample("n12", info, GpuSample(99 % 8, seq, 0, 90, 50, 40000, 6500, 63, 1980), now + seq, now + seq)
    assert hot.smoothed["temp_c"] < 64
    check(trackers, now, S)
    assert hot.fleet_reasons == [] and hot.state(now).verdict == HealthVerdict.PASS


def test_the_processor_judges_only_the_gpus_of_its_partitions():
    now = 1_000_000
    processor = StreamProcessor({})
    for i in range(24):
        processor.trackers[f"GPU-{i}"], processor.partition_of[f"GPU-{i}"] = tracker(i, 62 + (i % 3), now), 0
    processor.trackers["GPU-99"], processor.partition_of["GPU-99"] = tracker(99, 80, now), 0
    for _ in range(3):
        processor.fleet_check(now, {1})  # another worker's partitions: nothing here is judged
    assert not processor.trackers["GPU-99"].fleet_reasons
    for _ in range(3):
        processor.fleet_check(now, {0})
    assert processor.trackers["GPU-99"].fleet_reasons


def test_a_gpu_with_single_bit_errors_its_fleet_does_not_see_is_flagged_stray_errors_are_not():
    rnd = random.Random(3)
    rows = [(*r, rnd.choice([0, 0, 0, 1])) for r in fleet(64)]  # the stray correctable error
    rows[11] = (*rows[11][:6], 12)  # a slow storm: 12 in 10 minutes
    found = outliers(rows, S)
    assert {u: [k for k, _ in v] for u, v in found.items()} == {"GPU-11": ["ecc"]}
    assert outliers([(*r[:6], None) for r in rows], S) == {}  # no counts reported, nothing judged


def test_the_tracker_counts_single_bit_errors_over_its_window_and_a_reset_counter_starts_again():
    t = GpuTracker(uuid="GPU-1")
    info = GpuInfo("GPU-1", 0, "H100", 81920)
    for i, (ts, sbe) in enumerate([(0, 100), (300_000, 104), (700_000, 110), (710_000, 2)]):
        t.learn_sample("n0", info, GpuSample(0, i + 1, 0, 90, 50, 40000, 6500, 60, 1980, ecc_sbe=sbe), ts, ts)
        if ts == 700_000:
            assert t.sbe_window[-1][1] - t.sbe_window[0][1] == 6  # 104 -> 110: the first read left the window
    assert list(t.sbe_window) == [(710_000, 2)]


def test_the_tracker_keeps_one_entry_per_count_in_its_window_and_counts_as_with_every_read():
    """A GPU read every few seconds kept a tuple per read for 10 minutes; a run of reads of one count is one entry, and
    the count over the window is what every read kept gives, a late read (out of order) included."""
    rnd = random.Random(7)
    t = GpuTracker(uuid="GPU-1")
    info = GpuInfo("GPU-1", 0, "H100", 81920)
    reads, sbe, ts = [], 0, 0
    for i in range(600):
        ts += rnd.choice([2_000, 5_000, 30_000])
        sbe += rnd.random() < 0.02
        at = ts - rnd.choice([0, 0, 0, 40_000])  # now and then a read stamped before the last one
        t.learn_sample("n0", info, GpuSample(0, i + 1, 0, 90, 50, 40000, 6500, 60, 1980, ecc_sbe=sbe), at, ts)
        reads.append((at, sbe))
        while len(reads) > 1 and reads[0][0] < at - SBE_WINDOW_MS:
            del reads[0]
        assert t.sbe_in_window == reads[-1][1] - reads[0][1]
        assert len(t.sbe_window) == len({c for _, c in reads})
    assert len(reads) > 20 > len(t.sbe_window)


# The check before its numpy columns, as the oracle for them: same bins, medians, tests and reasons.
def _robust(values: list, floor: float) -> tuple[float, float]:
    med = statistics.median(values)
    return med, max(floor, MAD_TO_SIGMA * statistics.median(abs(v - med) for v in values))


def _reference(gpus: list, s: FleetPeerSettings) -> dict[str, list[tuple[str, str]]]:
    """The check as it was written before its columns (commit 045496a), one row at a time."""
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    by_power: dict[int, list] = defaultdict(list)
    by_util: dict[int, list] = defaultdict(list)
    for g in gpus:
        by_power[int(math.log(max(g[1], 1.0)) / math.log1p(s.power_window))].append(g)
        if not g[5]:
            by_util[int(g[3] // s.util_window)].append(g)
    busy = [g for g in gpus if g[4] is not None and g[3] >= s.busy_util and not g[5]]
    for group in by_power.values():
        if len(group) - 1 < s.min_peers:
            continue
        med, spread = _robust([g[2] for g in group], s.temp_floor_c)
        for uuid, _, temp, *_ in group:
            excess = temp - med
            if excess >= s.temp_excess_c and excess / spread >= s.z:
                out[uuid].append(("temperature", f"fleet peers: {excess:+.1f} °C against {len(group) - 1} GPUs of "
                                                 f"its model at the same power (robust z {excess / spread:.1f})"))
    if len(busy) - 1 >= s.min_peers:
        med, spread = _robust([float(g[4]) for g in busy if g[4] is not None], s.clock_floor_mhz)
        for uuid, _, _, _, clock, *_ in busy:
            deficit = med - float(clock or 0.0)
            if med > 0 and deficit / med >= s.clock_deficit and deficit / spread >= s.z:
                out[uuid].append(("clock", f"fleet peers: SM clock {clock:.0f} MHz, {deficit / med:.0%} below "
                                           f"{len(busy) - 1} busy GPUs of its model (robust z {deficit / spread:.1f})"))
    for group in by_util.values():
        if len(group) - 1 < s.min_peers:
            continue
        med, spread = _robust([g[1] for g in group], s.power_floor_w)
        for uuid, power, *_ in group:
            off = power - med
            if med > 0 and abs(off) / med >= s.power_deviation and abs(off) / spread >= s.z:
                out[uuid].append(("power", f"fleet peers: power {power:.0f} W, {off / med:+.0%} against "
                                           f"{len(group) - 1} GPUs of its model at the same utilisation "
                                           f"(robust z {abs(off) / spread:.1f})"))
    counted = [(g[0], g[6]) for g in gpus if len(g) > 6 and g[6] is not None]
    if len(counted) - 1 >= s.min_peers:
        med, spread = _robust([float(c) for _, c in counted], s.sbe_floor)
        for uuid, count in counted:
            excess = count - med
            if count >= s.sbe_min and excess / spread >= s.z:
                out[uuid].append(("ecc", f"fleet peers: {count} single-bit ECC errors in "
                                         f"{SBE_WINDOW_MS // 60_000} min against a median of {med:.0f} on "
                                         f"{len(counted) - 1} GPUs of its model (robust z {excess / spread:.1f})"))
    return out


def _mixed_fleet(n: int, seed: int) -> list[Row]:
    """Rows of every kind the check meets: powers over the whole range (repeats among them, so medians meet
    ties), idle and busy GPUs, clocks not reported, power-capped ones, SBE counts not reported, and outliers."""
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        power = rnd.choice([rnd.uniform(40, 700), 300.0, 75.0, 0.5])
        util = rnd.choice([0.0, 100.0, rnd.uniform(0, 100), 55.0])
        temp = 25 + power / 15 + rnd.gauss(0, 1.5) + (rnd.random() < 0.03) * rnd.uniform(5, 40)
        clock = None if rnd.random() < 0.1 else 1980 + rnd.gauss(0, 12) - (rnd.random() < 0.03) * rnd.uniform(100, 900)
        power *= 1 + (rnd.random() < 0.03) * rnd.choice([-0.6, 0.5, 1.2])
        sbe = None if rnd.random() < 0.2 else rnd.choice([0, 0, 1, 2, rnd.randrange(0, 400)])
        rows.append((f"GPU-{i}", power, temp, util, clock, rnd.random() < 0.05, sbe))
    return rows


def test_the_columns_judge_exactly_as_the_rows_did() -> None:
    flagged = 0
    for seed in range(40):
        for n in (3, 9, 10, 40, 300, 2000):
            rows = _mixed_fleet(n, seed * 7 + n)
            want = _reference(rows, S)
            assert dict(outliers(rows, S)) == dict(want), (seed, n)
            flagged += len(want)
            six = [r[:6] for r in rows]  # rows without the SBE field, as older callers gave
            assert dict(outliers(six, S)) == dict(_reference(six, S))
    assert flagged > 1000  # the fleets have outliers of every kind to agree on


def test_power_bins_are_the_scalar_rule_at_every_bin_edge() -> None:
    """numpy's log may differ from math.log in the last bit: the column's bins are still the scalar rule's, at
    the edges between bins (each edge's power and the doubles on either side of it) as well as between them."""
    step = math.log1p(S.power_window)
    edges = [math.exp(k * step) for k in range(0, 120)]
    power = np.array([*edges, *np.nextafter(edges, 0.0), *np.nextafter(edges, np.inf), 0.0, 0.5, 1.0,
                      *np.random.default_rng(3).uniform(0.0, 2000.0, 5000)])
    assert power_bins(power, step).tolist() == [int(math.log(max(p, 1.0)) / step) for p in power.tolist()]


def test_rows_are_gathered_from_one_store_only() -> None:
    a, b = GpuTracker(uuid="GPU-a", readings=Readings()), GpuTracker(uuid="GPU-b", readings=Readings())
    assert gather([a]).shape[0] == 1
    with pytest.raises(ValueError, match="one store of readings"):
        gather([a, b])
