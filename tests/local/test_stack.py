"""Pure pieces of `gpuaware up`'s summary (gpuaware/local/stack.py)."""

from __future__ import annotations

import json

from gpuaware.contract.events import ClusterForecast, EventKind, GpuEvent, ModelDemand, Severity
from gpuaware.local.stack import forecast_rows, settled_verdict, worst_verdict


def test_the_cluster_forecast_is_json_rows():
    """Its records are slots dataclasses: a summary written with ``vars`` failed on the first forecast."""
    f = ClusterForecast("c", 1, [ModelDemand("H100", 60, 1.5, 1.0, 2.0, 8.0)])
    assert json.loads(json.dumps(forecast_rows(f))) == [
        {"model": "H100", "horizon_s": 60, "demand_gpus": 1.5, "lower": 1.0, "upper": 2.0, "capacity_gpus": 8.0}]
    assert forecast_rows(None) == []


def _event(kind: EventKind, **attributes: str) -> GpuEvent:
    return GpuEvent("e", 0, "n", "GPU-1", kind, Severity.INFO, attributes=attributes)


def test_a_withdrawn_forecast_is_reported_at_the_grade_it_settled_at_and_the_worst_beside_it():
    # A fan spinning down: CRITICAL while its settle point rose, lowered once it settled below slowdown.
    evs = [_event(EventKind.ANOMALY, condition="open"),
           _event(EventKind.HEALTH_CHANGE, verdict="CRITICAL", action="DRAIN"),
           _event(EventKind.ANOMALY, condition="lowered"),
           _event(EventKind.HEALTH_CHANGE, verdict="WARNING", action="DRAIN")]
    assert settled_verdict(evs) == ("WARNING", "DRAIN") and worst_verdict(evs) == ("CRITICAL", "DRAIN")
    assert settled_verdict(evs[:2]) == ("CRITICAL", "DRAIN")  # nothing withdrawn: the worst
