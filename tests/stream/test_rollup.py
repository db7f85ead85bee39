"""Roll-ups of per-GPU state to nodes and to per-model demand: critical GPUs are no capacity."""

from __future__ import annotations

import pytest

from gpuaware.contract.events import HealthBand
from gpuaware.stream.processor import StreamProcessor
from gpuaware.stream.rollup import merge_demand, model_demand, node_state
from tests.support import telemetry_batch


def test_rollups_exclude_critical_gpus_from_capacity() -> None:
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(telemetry_batch("n", 1, t0, util=40, fb=1000, gpus=2), 0, t0)
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


def test_model_demand_follows_each_new_forecast_list() -> None:
    """A minute's new forecasts are what the next sum adds."""
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(telemetry_batch("n", 1, t0, util=40, fb=1000, gpus=1), 0, t0)
    gpu = proc.trackers["GPU-n-0"]
    gpu._models()
    gpu._learn_minute(40.0, 1000.0)
    first = model_demand([gpu])
    assert model_demand([gpu]) == first
    for _ in range(30):
        gpu._learn_minute(90.0, 1000.0)
    (model,) = first
    assert model_demand([gpu])[model]["60"][0] > first[model]["60"][0] + 0.3
    gpu.packed_forecasts = b""
    assert model_demand([gpu]) == {}


def test_the_demand_of_a_model_s_gpus_read_at_once_is_the_sum_of_each_gpu_s_forecasts_in_order() -> None:
    """``model_demand`` reads a model's forecasts as one array: the sums a loop over each GPU's utilisation forecasts
    makes, to the bit, with critical GPUs no capacity and GPUs without forecasts left out."""
    import random

    rnd = random.Random(11)
    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    for node in range(12):
        proc.on_telemetry(telemetry_batch(f"n{node}", 1, t0, util=rnd.randrange(100), fb=1000, gpus=4), 0, t0)
    gpus = list(proc.trackers.values())
    for i, t in enumerate(gpus):
        t.model = ("H100", "A100")[i % 2]
        if i % 9 == 0:
            continue  # no forecast yet
        t._models()
        for _ in range(rnd.randrange(1, 20)):
            t._learn_minute(rnd.uniform(0, 100), 1000.0)
        if i % 5 == 0:
            t.health_band = HealthBand.CRITICAL.value
    want: dict[str, dict[str, list[float]]] = {}
    for t in gpus:
        for f in t.forecasts:
            if f.metric == "util_gpu":
                cell = want.setdefault(t.model, {}).setdefault(str(f.horizon_s), [0.0, 0.0, 0.0, 0.0])
                cell[0] += f.mean / 100.0
                cell[1] += f.lower / 100.0
                cell[2] += f.upper / 100.0
                cell[3] += 0.0 if t.health_band == HealthBand.CRITICAL.value else 1.0
    assert model_demand(gpus) == want and len(want) == 2


def test_a_demand_of_negative_zeros_is_zero_as_the_loop_from_zero_gave() -> None:
    import math
    import struct

    proc = StreamProcessor({})
    t0 = 1_700_000_000_000
    proc.on_telemetry(telemetry_batch("n", 1, t0, util=0, fb=1000, gpus=2), 0, t0)
    gpus = list(proc.trackers.values())
    for t in gpus:
        t.packed_forecasts = struct.pack("<18d", *([-0.0] * 18))
    (cells,) = model_demand(gpus).values()
    assert all(math.copysign(1.0, v) == 1.0 for cell in cells.values() for v in cell)
