"""`gpuaware up` end to end: broker, simulated agents, a stream worker, the scheduler and Prometheus as one stack."""

from __future__ import annotations

import json

import pytest

from gpuaware.contract import topics
from gpuaware.local.kube_control_plane import BinariesMissing, find_binaries
from tests.support import need, run


@pytest.mark.broker
@pytest.mark.parametrize("kube", ["embedded", "real"])
def test_up_runs_the_simulated_cluster_and_every_fault_gets_a_reaction(tmp_path, kube):
    """On the embedded fake API server and on the real control plane (kube-apiserver, kwok nodes)."""
    if kube == "real":
        need(find_binaries, BinariesMissing)  # skipped without them, failed under CI=true
    scenario = tmp_path / "quick.yaml"
    scenario.write_text(
        "name: quick\nseed: 9\nnodes: 2\ngpus_per_node: 4\nmodels: [H100]\nfaults:\n"
        "  - {kind: xid, node: 0, gpu: 1, at_s: 2, xid: 79}\n"
        "  - {kind: ecc_dbe, node: 1, gpu: 3, at_s: 3}\n"
        "  - {kind: dead, node: 1, gpu: 0, at_s: 3}\n")
    result = run("up", "--port", "0", "--duration", "10", "--json", "--scenario", str(scenario), "--kube", kube,
                 timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["kube"] == kube
    # With the real control plane, what kubectl needs to follow it is printed.
    assert ("kubectl --kubeconfig" in result.stderr) == (kube == "real"), result.stderr
    assert summary["topics"] == sorted(t.name for t in topics.ALL_TOPICS)
    assert summary["nodes"] == 2 and summary["gpus"] == 8 and summary["samples"] > 0
    assert summary["watch_reads"] >= 8 * 5
    assert [f["injected"] for f in summary["faults"]] == [True, True, True]
    assert all(f["agent_reaction_s"] is not None and f["agent_reaction_s"] <= 3 for f in summary["faults"])
    assert summary["health_bands"]["lost"] == 1 and summary["health_bands"]["critical"] >= 1
    # The stream worker ran beside the agents, published state, and stopped cleanly.
    stream = summary["stream"]
    assert stream["worker_exit_codes"] == {"stream-0": 0}
    assert stream["records"].get("gpu.state.v1", 0) > 0 and stream["gpus_with_state"] >= 7
    dbe = summary["faults"][1]
    assert dbe["stream_reaction_s"] is not None
    # The scheduler placed openb pods on the simulated nodes and took the failing GPUs out of service.
    assert summary["components"]["scheduler"] == "running"
    sched = summary["scheduler"]
    assert sched["placements"] > 0 and sched["pods_submitted"] >= sched["placements"] - sched["migrations"]
    assert all(f["scheduler_reaction_s"] is not None for f in summary["faults"]), summary["faults"]
    assert sched["cordons"] >= 1
    if kube == "real":  # the agents publish their GPUs as ResourceSlices, gpuaware allocates the demo claims
        dra = sched["dra"]
        assert (dra["resource_slices"], dra["devices"], dra["claims"]) == (2, 8, 4), dra
        # A demo pod on the node the xid drains is evicted (nothing recreates it); its claim stays allocated.
        assert dra["claims_allocated"] >= dra["claim_pods_bound"] >= 1, dra
    else:
        assert sched["dra"] is None
    # Per fault: the verdict and the remediation chain (docs/health.md). Two nodes: the circuit breaker
    # lets one be quarantined in 5 minutes and holds the other.
    xid79, dbe, dead = summary["faults"]
    assert (xid79["verdict"], xid79["action"]) == ("CRITICAL", "REBOOT_NODE")
    assert dbe["verdict"] == "CRITICAL" and dead["action"] == "REBOOT_NODE"
    cordoned = [f for f in summary["faults"] if f["time_to_cordon_s"] is not None]
    assert cordoned and all(f["time_workloads_moved_s"] >= f["time_to_cordon_s"] for f in cordoned)
    assert any(f["breaker_held"] for f in summary["faults"]) and not all(f["breaker_held"] for f in summary["faults"])
    from gpuaware.local.prometheus import available

    if available():  # the local Prometheus evaluated the rules on the agent's metrics: the lost GPU pages
        assert "GpuLost" in summary["prometheus"]["alerts_firing"], summary["prometheus"]
    else:
        assert summary["prometheus"] is None


@pytest.mark.broker
@pytest.mark.parametrize("kube", ["embedded", "real"])
def test_up_shows_a_gpu_reset_validated_and_returned_to_service(tmp_path, kube):
    """A fault a GPU reset clears (XID 119, GSP RPC timeout: critical, reset the GPU): cordoned, drained, the
    reset requested through the node's GPUMaintenanceRequired condition, done by the cluster's tooling (the
    simulator's reset, which the collector does not announce, as NVML does not) and stamped on the Node, where
    the agent learns it; validated for up's 30 s and returned: the GPU is uncordoned by the end."""
    if kube == "real":
        need(find_binaries, BinariesMissing)  # skipped without them, failed under CI=true
    scenario = tmp_path / "reset.yaml"
    scenario.write_text("name: reset\nseed: 9\nnodes: 2\ngpus_per_node: 4\nmodels: [H100]\nfaults:\n"
                        "  - {kind: xid, node: 0, gpu: 1, at_s: 2, xid: 119}\n")
    result = run("up", "--port", "0", "--duration", "55", "--json", "--scenario", str(scenario), "--kube", kube,
                 timeout=240)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    (fault,) = summary["faults"]
    assert (fault["verdict"], fault["action"]) == ("CRITICAL", "RESET_GPU"), fault
    assert fault["gpu_reset_by_tooling"] and not fault["breaker_held"], fault
    assert isinstance(fault["time_back_in_service_s"], float), fault
    assert fault["time_to_cordon_s"] <= fault["time_action_requested_s"] <= fault["time_back_in_service_s"], fault
    assert summary["agent_cordoned_gpus"] == 0  # the agents saw the cordon lifted
    assert summary["health_bands"]["healthy"] == 8
    # Pods that ran their time ended Succeeded (deleted at once): published on job.completions.v1, learned by the
    # stream, and scored against the runtime estimate each was placed with (its declared duration).
    runtimes = summary["scheduler"]["runtimes"]
    assert runtimes["completions_published"] >= 1 and runtimes["completions_scored"] >= 1, runtimes
    assert {"p50_s", "p90_s", "actual_s", "level"} <= set(runtimes["recent"][-1]), runtimes


@pytest.mark.broker
def test_up_reports_a_thermal_faults_verdict_and_its_lead_time(tmp_path):
    """A +3 °C/s runaway on an H100 holding memory at idle power crosses its slowdown temperature ~24 s after it
    starts: `up` reports its verdict, action and lead time (first CRITICAL verdict minus the simulated GPU's
    crossing, on one clock: the simulated clock starts at the agents' first read); a fault that takes no GPU to
    a limit (an XID) has none."""
    scenario = tmp_path / "hot.yaml"
    scenario.write_text("name: hot\nseed: 9\nnodes: 1\ngpus_per_node: 4\nmodels: [H100]\n"
                        "workloads: [idle-holding]\nfaults:\n"
                        "  - {kind: thermal_runaway, node: 0, gpu: 2, at_s: 2, rise_c_per_s: 3.0}\n"
                        "  - {kind: xid, node: 0, gpu: 0, at_s: 2, xid: 79}\n")
    result = run("up", "--port", "0", "--duration", "35", "--json", "--scenario", str(scenario), "--kube", "embedded",
                 timeout=180)
    assert result.returncode == 0, result.stderr
    hot, xid = json.loads(result.stdout)["faults"]
    assert (hot["verdict"], hot["action"]) == ("CRITICAL", "DRAIN"), hot
    assert isinstance(hot["lead_time_s"], float) and -35 < hot["lead_time_s"] < 0, hot  # before the crossing
    assert xid["lead_time_s"] is None
