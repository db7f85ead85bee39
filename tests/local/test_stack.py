"""Pure pieces of `gpuaware up`'s summary (gpuaware/local/stack.py)."""

from __future__ import annotations

import json

from gpuaware.contract.events import ClusterForecast, ModelDemand
from gpuaware.local.stack import forecast_rows


def test_the_cluster_forecast_is_json_rows():
    """Its records are slots dataclasses: a summary written with ``vars`` failed on the first forecast."""
    f = ClusterForecast("c", 1, [ModelDemand("H100", 60, 1.5, 1.0, 2.0, 8.0)])
    assert json.loads(json.dumps(forecast_rows(f))) == [
        {"model": "H100", "horizon_s": 60, "demand_gpus": 1.5, "lower": 1.0, "upper": 2.0, "capacity_gpus": 8.0}]
    assert forecast_rows(None) == []
