"""The forecast-rows bench learns the same rows both ways and reports whether they end equal."""

from __future__ import annotations

from gpuaware.bench.forecast_rows import run


def test_the_bench_learns_both_copies_to_the_same_rows_and_reports_both_costs() -> None:
    out = run(rows=12, age=90, spread=20, steps=2, rounds=2)
    assert out["same_rows"] is True
    assert out["one_us_per_row"] > 0 and out["many_us_per_row"] > 0
    assert set(out) == {"rows", "age", "spread", "one_us_per_row", "many_us_per_row", "ratio", "same_rows"}
