"""`gpuaware simulate --ablation stream`: the real stream parts handed to the simulator, and its usage errors."""

from __future__ import annotations

import subprocess
import sys

from gpuaware.cli.stream_sim import forecaster, make_stream, physics


def test_the_ablation_needs_the_dynamic_experiment(small_nodes):
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--ablation", "stream", "--nodes",
                          str(small_nodes)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "needs --experiment dynamic" in bad.stderr


def test_the_stream_model_gets_gentd26_the_stream_forecaster_and_the_agent_physics():
    model = make_stream(frozenset({"forecast"}))
    assert len(model.series) >= 100 and model.uses("forecast") and not model.uses("demand")
    idle, busy = physics("V100M16", 0.0, 30.0, 600.0), physics("V100M16", 1.0, 30.0, 600.0)
    assert idle[0] == 40.0 and busy[0] == 300.0 and busy[1] > idle[1] and busy[2] == 300.0  # V100: 40-300 W
    f = forecaster(5, 1.0)
    for y in [0.2] * 30:
        f.learn_one(y)
    assert 0.0 <= f.forecast().upper <= 1.0
