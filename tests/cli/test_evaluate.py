"""`gpuaware eval`: the online forecaster on the real GenTD26 duty-cycle trace; the sampling figures as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import TRACES, run

DUTY = TRACES / "alibaba-gentd26" / "pod_gpu_duty_cycle_anon.csv.gz"


def test_eval_forecast_on_the_real_duty_cycle_trace():
    result = subprocess.run([sys.executable, "-m", "gpuaware", "eval", "forecast", "--series", str(DUTY),
                             "--horizon", "5", "--limit", "10", "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["series"] == 10 and figures["points"] > 10_000
    for key in ("mae", "persistence_mae", "ratio", "interval_coverage_80", "us_per_update"):
        assert figures[key] > 0
    assert figures["mae"] < figures["persistence_mae"]


def test_eval_sampling_prints_the_figures_as_json():
    result = run("eval", "sampling", "--scenario", "ecc", "--scenario", "stuck-dead", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("sample_reduction", "util_mae_pct_points", "faults_injected", "faults_detected",
                "detection_delay_p95_s", "false_alarms"):
        assert key in figures
    assert figures["faults_injected"] == 4 and figures["scenarios"] == ["ecc", "stuck-dead"]


def test_eval_forecast_splits_the_series_into_stable_tune_and_holdout_halves(tmp_path):
    import gzip

    from gpuaware.bench.forecast_eval import evaluate_forecast, split_of

    path = tmp_path / "series.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("value,timestamp_anon,container_ip\n")
        for pod in range(12):
            for t in range(60):
                f.write(f"{(pod * 7 + t) % 10},{t * 60},pod-{pod}\n")
    halves = {split: evaluate_forecast(str(path), split=split) for split in ("all", "tune", "holdout")}
    assert halves["tune"]["series"] + halves["holdout"]["series"] == halves["all"]["series"] == 12
    assert halves["tune"]["series"] == sum(split_of(f"pod-{p}") == "tune" for p in range(12)) > 0
    assert halves["tune"]["split"] == "tune" and "split" not in halves["all"]
