"""``gpuaware eval forecast``: the stream's forecaster over every series of a GenTD26-style trace.

Here rather than in ``stream`` because it joins the agent's trace loader to the stream's forecaster.

The forecaster learns each series from scratch, so every series is unseen by the model; its few
settings, though, were chosen by looking at figures. ``split`` keeps that honest: settings are
tuned on the ``tune`` half of the series (a stable hash of the series id) and reported on the
``holdout`` half as well as on ``all``.
"""

from __future__ import annotations

import zlib

from gpuaware.agent.traces import load_series
from gpuaware.stream.forecast import prequential

SPLITS = ("all", "tune", "holdout")


def split_of(series_id: str) -> str:
    """``tune`` or ``holdout``: half the series each, by a hash that does not change between runs."""
    return "tune" if zlib.crc32(series_id.encode()) % 2 == 0 else "holdout"


def evaluate_forecast(series_path: str, horizon: int = 5, max_value: float | None = None,
                      limit: int | None = None, split: str = "all", columns: bool = False) -> dict:
    """Prequential figures (``gpuaware.stream.forecast.prequential``) for the first ``limit`` series (all when None)
    of ``split``.

    Forecasts are clamped at ``max_value``, by default 100 for duty-cycle files and unbounded otherwise.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    series = load_series(series_path)
    if split != "all":
        series = {k: v for k, v in series.items() if split_of(k) == split}
    if limit:
        series = dict(list(series.items())[:limit])
    upper = max_value if max_value is not None else (100.0 if "duty_cycle" in series_path else None)
    figures = prequential(series, horizon=horizon, upper=upper, columns=columns)
    return {"series_file": series_path, **({"split": split} if split != "all" else {}),
            **({"forecaster": "columns"} if columns else {}), **figures}
