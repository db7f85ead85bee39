"""`gpuaware simulate`: JSON figures, the report and the plot, and a clear error for an unknown policy."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import OPENB_PODS as PODS


def test_simulate_cli_prints_json_and_writes_report_and_plot(small_nodes, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gpuaware", "simulate", "--experiment", "fragmentation", "--nodes", str(small_nodes),
         "--pods", str(PODS), "--policy", "fgd", "--seed", "0", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["policy"] == "fgd" and set(figures["unallocated_pct"]) == {"80", "90", "100", "110", "120", "130"}
    assert figures["decisions_per_s"] > 0 and figures["p99_decision_ms"] > 0
    assert (out / "fragmentation-openb_pod_list_default.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--policy", "nope", "--nodes",
                          str(small_nodes)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown policy" in bad.stderr


def test_simulate_cli_runs_the_artifact_protocol_and_refuses_it_for_dynamic(small_nodes):
    result = subprocess.run(
        [sys.executable, "-m", "gpuaware", "simulate", "--nodes", str(small_nodes), "--pods", str(PODS),
         "--policy", "fgd-artifact", "--protocol", "artifact", "--seeds", "0-1", "--json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["protocol"] == "artifact" and figures["seeds"] == [0, 1]
    assert set(figures["unallocated_pct_iqr"]) == {"80", "90", "100", "110", "120", "130"}
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--experiment", "dynamic", "--protocol",
                          "artifact", "--nodes", str(small_nodes), "--pods", str(PODS), "--policy", "fgd"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "fragmentation experiment only" in bad.stderr


def test_the_durations_ablation_needs_the_dynamic_experiment(small_nodes):
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--ablation", "durations", "--nodes",
                          str(small_nodes), "--pods", str(PODS)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--ablation durations needs --experiment dynamic" in bad.stderr


def test_the_durations_ablation_refuses_an_unknown_variant_naming_the_known_ones(small_nodes):
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--experiment", "dynamic", "--ablation",
                          "durations", "--variants", "fifo,sjf", "--nodes", str(small_nodes), "--pods", str(PODS)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown durations variant(s) sjf" in bad.stderr and "predicted" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "gpuaware", "simulate", "--experiment", "dynamic", "--ablation",
                          "stream", "--variants", "fifo", "--nodes", str(small_nodes), "--pods", str(PODS)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--variants is for --ablation durations" in bad.stderr
