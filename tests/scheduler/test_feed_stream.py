"""The feed writes the stream plugins' inputs into the cluster model; a stale GPU is not live."""

from __future__ import annotations

from gpuaware.contract.events import Forecast, GpuState, HealthBand
from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.feed import StateView

T0 = 1_700_000_000_000


def _state(sample_ms: int) -> GpuState:
    return GpuState("g0", "n", "NVIDIA H100 80GB HBM3", sample_ms, sample_ms + 100, 40.0, 20.0, 30000.0, 81920,
                    250.0, 61.0, 95.0, HealthBand.HEALTHY, {},
                    [Forecast("util_gpu", 300, 45.0, 30.0, 55.0),
                     Forecast("fb_used_mib", 300, 31000.0, 29000.0, 33000.0)],
                    "idle-holding-gpu", 0.9, 10)


def test_live_state_reaches_the_stream_plugins_inputs_and_staleness_turns_it_off():
    view = StateView(stale_after_ms=60_000)
    view.learn(_state(T0), arrived_ms=T0)
    c = ClusterState([NodeSpec("n", 32000, 262144, 1, "H100", 81920)])
    assert view.apply(c, lambda uuid: (0, 0), T0 + 1000) == 1
    assert c.live[0, 0] and c.forecast_util[0, 0] == 55.0 and c.forecast_mem[0, 0] == 33000.0
    assert c.power[0, 0] == 250.0 and c.temp[0, 0] == 61.0 and c.fingerprint[0, 0] == "idle-holding-gpu"
    view.apply(c, lambda uuid: (0, 0), T0 + 120_000)
    assert not c.live[0, 0]  # the plugins fall back to requests for it
