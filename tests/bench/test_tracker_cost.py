"""gpuaware/bench/tracker_cost.py: GPUs built with a full history hold every horizon's forecasts and are measured."""

from __future__ import annotations

import json
import sys

from gpuaware.bench import tracker_cost


def test_built_gpus_forecast_every_horizon_and_the_figures_are_printed(monkeypatch, capsys):
    gpus = tracker_cost.build(3, 20)
    assert all(len(t.history) == 20 and len(t.forecasts) == 6 for t in gpus)
    assert {f.horizon_s for f in gpus[0].forecasts} == {60, 300, 900}
    monkeypatch.setattr(sys, "argv", ["tracker_cost", "--gpus", "50", "--minutes", "20"])
    tracker_cost.main()
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 50 and out["minutes"] == 20
    assert out["cpu_s"] > 0 and out["gc_objects_per_gpu"] > 0 and out["kib_per_gpu"] > 0
