"""``bench scheduler-scale``: the fleet's state reaches the scheduler through its feed path, and pods get placed."""

from __future__ import annotations

import pytest

from gpuaware.bench.scheduler_scale import run_size
from tests.support import OPENB_PODS

KEYS = {"gpus", "nodes", "gpus_in_view", "cycle_p50_ms", "cycle_p99_ms", "cycle_cpu_p50_ms", "cycle_cpu_p99_ms",
        "pass_p99_ms", "pass_cpu_p99_ms", "state_apply_p99_ms", "state_apply_cpu_p99_ms", "states_per_s_read",
        "feed_lag_p50_s", "feed_lag_p99_s", "feed_lag_growing", "placed", "cpu_percent", "cpu_s_per_pod", "rss_mib"}


def test_a_small_fleet_is_fed_and_scheduled_on():
    if not OPENB_PODS.is_file():
        pytest.skip("the openb traces are not in ../shared/traces")
    r = run_size(64, 3.0, OPENB_PODS, states_per_gpu_s=1.0, pod_rate=10.0, warmup_s=1.0)
    assert set(r) >= KEYS
    assert (r["gpus"], r["nodes"], r["gpus_in_view"]) == (64, 8, 64)  # every GPU's state caught up on
    assert r["states_per_s_read"] > 0 and r["feed_lag_p99_s"] is not None  # live records kept coming
    assert r["placed"] > 0 and r["cycles"] >= r["placed"] and r["state_applies"] > 0
