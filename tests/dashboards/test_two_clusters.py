"""Two clusters in one Prometheus, two scheduler replicas and two stream workers each: the dashboards'
queries, with `$cluster` set, give each cluster's own figures (promtool evaluates them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuaware.dashboards.definitions import DASHBOARDS

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool (Debian package prometheus) not installed")

# Only each cluster's leader exports the queue snapshot (gpuaware.scheduler.metrics); both stream workers of
# cluster a export a forecast for a moment after a rebalance (the old owner's last one, until it ages out).
SERIES = {
    'gpuaware_scheduler_leader{cluster="a", pod="r1"}': "1x10",
    'gpuaware_scheduler_leader{cluster="a", pod="r2"}': "0x10",
    'gpuaware_scheduler_leader{cluster="b", pod="r1"}': "0x10",
    'gpuaware_scheduler_leader{cluster="b", pod="r2"}': "1x10",
    'gpuaware_scheduler_pending_pods{cluster="a", pod="r1", tenant="vision", priority="high"}': "3x10",
    'gpuaware_scheduler_pending_pods{cluster="b", pod="r2", tenant="vision", priority="high"}': "5x10",
    'gpuaware_cluster_capacity_gpus{cluster="a", pod="s1", model="H100"}': "24x10",
    'gpuaware_cluster_capacity_gpus{cluster="a", pod="s2", model="H100"}': "24x10",
    'gpuaware_cluster_demand_gpus{cluster="a", pod="s1", model="H100", horizon_s="900", bound="upper"}': "30x10",
    'gpuaware_cluster_demand_gpus{cluster="a", pod="s2", model="H100", horizon_s="900", bound="upper"}': "28x10",
    'gpuaware_cluster_capacity_gpus{cluster="b", pod="s1", model="H100"}': "24x10",
    'gpuaware_cluster_demand_gpus{cluster="b", pod="s1", model="H100", horizon_s="900", bound="upper"}': "10x10",
    # Forecast quality: the leader scores completions; a standby scores none (and exports no correlation).
    'gpuaware_scheduler_forecast_window_completions{cluster="a", pod="r1"}': "120x10",
    'gpuaware_scheduler_forecast_window_completions{cluster="a", pod="r2"}': "0x10",
    'gpuaware_scheduler_forecast_window_completions{cluster="b", pod="r2"}': "40x10",
    'gpuaware_scheduler_forecast_spearman{cluster="a", pod="r1"}': "0.6x10",
    'gpuaware_scheduler_forecast_spearman{cluster="b", pod="r2"}': "0.3x10",
    'DCGM_FI_DEV_GPU_UTIL{cluster="a", Hostname="n1", gpu="0", modelName="H100", GPU_I_ID="", pod_uid=""}': "50x10",
    'DCGM_FI_DEV_GPU_UTIL{cluster="a", Hostname="n1", gpu="1", modelName="H100", GPU_I_ID="", pod_uid=""}': "50x10",
    'DCGM_FI_DEV_GPU_UTIL{cluster="b", Hostname="n1", gpu="0", modelName="H100", GPU_I_ID="", pod_uid=""}': "50x10",
}


def _query(uid: str, title: str, cluster: str) -> str:
    (panel,) = [p for p in DASHBOARDS[uid].panels if p.title == title]
    expr = panel.targets[0].expr.replace("$cluster", cluster)
    for variable in DASHBOARDS[uid].variable_names():
        expr = expr.replace(f"${variable}", ".*")
    return expr


# (dashboard, panel, cluster) -> the figure it must show, with its labels
EXPECTED = [
    ("gpuaware-scheduler", "Pending pods", "a", "{}", 3),
    ("gpuaware-scheduler", "Pending pods", "b", "{}", 5),
    ("gpuaware-forecasts", "Forecast headroom (capacity - upper bound, 15 min)", "a", '{cluster="a", model="H100"}',
     -6),
    ("gpuaware-forecasts", "Forecast headroom (capacity - upper bound, 15 min)", "b", '{cluster="b", model="H100"}',
     14),
    ("gpuaware-scheduler", "Completions scored", "a", "{}", 120),
    ("gpuaware-scheduler", "Completions scored", "b", "{}", 40),
    ("gpuaware-scheduler", "Runtime forecasts: rank correlation and p90 coverage", "a", "{}", 0.6),
    ("gpuaware-scheduler", "Runtime forecasts: rank correlation and p90 coverage", "b", "{}", 0.3),
    ("gpuaware-fleet", "GPUs by model", "a", '{modelName="H100"}', 2),
    ("gpuaware-fleet", "GPUs by model", "b", '{modelName="H100"}', 1),
]


def test_each_cluster_gets_its_own_figures(tmp_path: Path) -> None:
    tests = [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in SERIES.items()],
              "promql_expr_test": [{"expr": _query(uid, title, cluster), "eval_time": "5m",
                                    "exp_samples": [{"labels": labels, "value": value}]}
                                   for uid, title, cluster, labels, value in EXPECTED]}]
    path = tmp_path / "two_clusters_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
