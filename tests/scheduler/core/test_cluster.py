"""The cluster model's bookkeeping of the stream's per-GPU readings."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from tests.support import cluster


def test_a_gpu_keeps_its_readings_while_anyone_holds_it():
    c = cluster(1)
    for wid in ("a", "b"):
        c.allocate(Allocation(wid, 0, [0], [400], 0, 0, [4096], "shared"))
    c.live[:] = True
    c.forecast_mem[0], c.fingerprint[0] = [6000.0], ["idle-holding-gpu"]
    c.release("a")
    assert c.forecast_mem[0, 0] == 6000.0 and c.fingerprint[0, 0] == "idle-holding-gpu"
    c.release("b")
    assert c.forecast_mem[0, 0] == 0.0 and c.fingerprint[0, 0] == ""


def test_a_gpu_without_live_readings_keeps_what_the_feed_wrote():
    # A stale GPU's forecast is the feed's "fully busy" (gpuaware/scheduler/feed.py); the next live reading replaces it.
    c = cluster(1)
    c.allocate(Allocation("a", 0, [0], [400], 0, 0, [4096], "shared"))
    c.forecast_util[0] = [100.0]
    c.release("a")
    assert c.forecast_util[0, 0] == 100.0


def test_a_workload_charged_anew_keeps_its_gpus_readings():
    # The simulator re-charges a running job to its forecast: it stays, so its GPU is not emptied.
    c = cluster(1)
    c.allocate(Allocation("a", 0, [0], [500], 0, 0, [8192], "shared"))
    c.live[:] = True
    c.forecast_mem[0] = [5000.0]
    c.resize(Allocation("a", 0, [0], [200], 0, 0, [5000], "shared"))
    assert c.forecast_mem[0, 0] == 5000.0 and c.gpu_free[0, 0] == 800 and c.gpu_mem_free[0, 0] == 16384 - 5000
