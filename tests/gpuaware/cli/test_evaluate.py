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
