"""``gpuaware eval forecast``: the stream's forecaster over every series of a GenTD26-style trace.

Here rather than in ``stream`` because it joins the agent's trace loader to the stream's forecaster.
"""

from __future__ import annotations

from agent.traces import load_series
from stream.forecast import prequential


def evaluate_forecast(series_path: str, horizon: int = 5, max_value: float | None = None,
                      limit: int | None = None) -> dict:
    """Prequential figures (``stream.forecast.prequential``) for the first ``limit`` series (all when None).

    Forecasts are clamped at ``max_value``, by default 100 for duty-cycle files and unbounded otherwise.
    """
    series = load_series(series_path)
    if limit:
        series = dict(list(series.items())[:limit])
    upper = max_value if max_value is not None else (100.0 if "duty_cycle" in series_path else None)
    return {"series_file": series_path, **prequential(series, horizon=horizon, upper=upper)}
