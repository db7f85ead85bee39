"""The trace-driven simulator on a slice of the real openb trace, and `gpuaware simulate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.sim.dynamic import DynamicConfig, run_dynamic, summarize
from scheduler.sim.fragmentation import run_fragmentation
from scheduler.sim.openb import TraceError, load_nodes, load_pods

OPENB = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-openb"
NODES = OPENB / "openb_node_list_gpu_node.csv"
PODS = OPENB / "openb_pod_list_default.csv"


@pytest.fixture(scope="module")
def small_nodes(tmp_path_factory) -> Path:
    """Every 20th node of the real cluster: 61 nodes with the real model mix."""
    lines = NODES.read_text().splitlines()
    path = tmp_path_factory.mktemp("trace") / "nodes.csv"
    path.write_text("\n".join([lines[0], *lines[1::20]]) + "\n")
    return path


def test_trace_errors_name_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing columns"):
        load_pods(bad)
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,lots,1,1,1000\n")
    with pytest.raises(TraceError, match=r"pods\.csv:2"):
        load_pods(bad)
    with pytest.raises(TraceError, match="cannot read"):
        load_nodes(tmp_path / "absent.csv")


def test_the_openb_cluster_loads_with_its_6212_gpus():
    nodes = load_nodes(NODES)
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212


@pytest.mark.parametrize("policy", ["fgd", "gpuaware", "k8s-default", "random"])
def test_fragmentation_runs_are_deterministic_and_consistent(small_nodes, policy):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    a = run_fragmentation(nodes, pods, policy, seed=3)
    b = run_fragmentation(nodes, pods, policy, seed=3)
    assert a.allocated_pct == b.allocated_pct
    arrived, allocated = np.array(a.arrived_pct), np.array(a.allocated_pct)
    assert arrived[-1] >= 130 and (np.diff(arrived) >= 0).all() and (np.diff(allocated) >= 0).all()
    assert (allocated <= arrived + 1e-9).all() and allocated[-1] <= 100
    for load in (80, 100, 130):
        assert a.unallocated_at(load) >= max(0.0, 100 - load) - 1e-6


def test_fgd_leaves_fewer_gpus_unallocated_than_random_here(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    fgd = np.mean([run_fragmentation(nodes, pods, "fgd", s).unallocated_at(130) for s in range(3)])
    rnd = np.mean([run_fragmentation(nodes, pods, "random", s).unallocated_at(130) for s in range(3)])
    assert fgd < rnd


def test_dynamic_runs_finish_every_job_and_leave_the_cluster_empty(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    # Heterogeneity off: then no job can finish faster than its trace duration.
    cfg = DynamicConfig(jobs=400, node_fraction=1.0, fault_every_s=300.0, fault_duration_s=600.0,
                        heterogeneity=False, check_invariants=True)
    results = {p: run_dynamic(nodes, pods, p, seed=1, cfg=cfg) for p in ("k8s-default", "gpuaware")}
    for r in results.values():
        assert all(j.finish_s is not None for j in r.jobs.values())
        assert all(j.first_start_s >= j.workload.submit_s for j in r.jobs.values())
        assert all(j.finish_s - j.first_start_s >= j.duration_s - 1e-6 for j in r.jobs.values())
    assert results["gpuaware"].migrations > 0 and results["gpuaware"].killed_by_faults == 0
    assert results["k8s-default"].migrations == 0 and results["k8s-default"].killed_by_faults > 0
    s = summarize([results["gpuaware"]])
    assert set(s["queue_wait_mean_s"]) == {"high", "medium", "low"}
    assert 0 < s["busy_share_of_allocated"] <= 1 and 0 < s["jain_fairness"] <= 1
    assert summarize([results["k8s-default"]])["busy_share_of_allocated"] < 1  # fractions rounded up


def test_gpuaware_waits_instead_of_preempting_when_room_frees_soon(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    base = dict(jobs=600, node_fraction=0.3, target_load=2.0, fault_every_s=1e9, check_invariants=True)
    eager = run_dynamic(nodes, pods, "gpuaware", seed=3, cfg=DynamicConfig(**base, preempt_grace_s=(0.0, 0.0, 0.0)))
    patient = run_dynamic(nodes, pods, "gpuaware", seed=3, cfg=DynamicConfig(**base))
    assert eager.preemptions_avoided == 0 and eager.preemptions > 0
    assert patient.preemptions_avoided > 0 and patient.preemptions < eager.preemptions
    assert all(j.finish_s is not None for j in patient.jobs.values())


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


def test_heterogeneity_scales_durations_by_the_gpu_model(small_nodes):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    cfg = DynamicConfig(jobs=200, node_fraction=1.0, target_load=0.3)
    r = run_dynamic(nodes, pods, "gpuaware", seed=2, cfg=cfg)
    gpu_jobs = [j for j in r.jobs.values() if j.workload.num_gpu]
    assert all(j.workload.labels.get("gavel_class") for j in gpu_jobs)
    ratios = [(j.finish_s - j.first_start_s) / j.duration_s for j in gpu_jobs]
    assert min(ratios) < 0.99 or max(ratios) > 1.01  # some model is faster or slower than the V100 reference


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.floats(0.5, 2.0), st.sampled_from(["gpuaware", "fgd", "k8s-default"]))
def test_dynamic_invariants_hold_under_random_load(small_nodes, seed, load, policy):
    """No over-allocation after any event; a tenant exceeds its quota only with borrowed (reclaimable) work."""
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    cfg = DynamicConfig(jobs=150, node_fraction=0.5, target_load=load, check_invariants=True)
    r = run_dynamic(nodes, pods, policy, seed=seed, cfg=cfg)
    assert all(j.finish_s is not None for j in r.jobs.values())  # every job that fits some node completes
    assert len(r.jobs) + len(r.unschedulable) == cfg.jobs
