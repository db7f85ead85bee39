"""The dynamic simulation (arrivals, completions, faults, preemption) on a slice of the real openb cluster."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaware.scheduler.sim.dynamic import run_dynamic, summarize
from gpuaware.scheduler.sim.jobs import BOARD_POWER_W, DynamicConfig
from gpuaware.scheduler.sim.openb import load_nodes, load_pods
from gpuaware.scheduler.sim.stream_model import StreamConfig, StreamModel
from tests.support import OPENB_PODS as PODS
from tests.support import LastValue


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
    """When the core knows when running work ends (here the oracle's truth), it waits for room instead of
    evicting; without any estimate (a live scheduler without runtime forecasts) it cannot."""
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    base = dict(jobs=600, node_fraction=0.3, target_load=2.0, fault_every_s=1e9, check_invariants=True,
                durations="oracle")
    # Summed over seeds: one seed's count moves with any tie-break (seed 3 alone went 122 vs 119 to 114 vs 139
    # when FGD stopped deciding ties on rounding noise), the effect over several does not (about a third fewer).
    eager = [run_dynamic(nodes, pods, "gpuaware", seed=s, cfg=DynamicConfig(**base, preempt_grace_s=(0.0, 0.0, 0.0)))
             for s in (0, 1, 2)]
    patient = [run_dynamic(nodes, pods, "gpuaware", seed=s, cfg=DynamicConfig(**base)) for s in (0, 1, 2)]
    assert all(r.preemptions_avoided == 0 and r.preemptions > 0 for r in eager)
    assert all(r.preemptions_avoided > 0 for r in patient)
    assert sum(r.preemptions for r in patient) < sum(r.preemptions for r in eager)
    assert all(j.finish_s is not None for r in patient for j in r.jobs.values())
    blind = run_dynamic(nodes, pods, "gpuaware", seed=0, cfg=DynamicConfig(**{**base, "durations": "unknown"}))
    assert blind.preemptions_avoided == 0 and blind.preemptions > 0


def _physics(model, util, temp, dt):
    board = BOARD_POWER_W.get(model, 300.0)
    return board * (0.2 + 0.8 * util), 40.0, board  # idle at a fifth of the board, as dynamic.py's estimate


def _stream_run(small_nodes, util: float, parts: set[str], physics=_physics):
    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    model = StreamModel([(np.full(60, util), np.full(60, 1.0))], LastValue, physics,
                        cfg=StreamConfig(parts=frozenset(parts)))
    cfg = DynamicConfig(jobs=200, node_fraction=0.3, fault_every_s=1e9, power_budget=0.5, heterogeneity=False)
    return run_dynamic(nodes, pods, "gpuaware", seed=0, cfg=cfg, stream=model)


def test_in_the_stream_world_gpus_draw_power_by_the_usage_their_jobs_replay_not_by_their_requests(small_nodes):
    # Idle jobs: fully allocated nodes are over half their board power by their requests, never by what they draw.
    for parts in ({"thermal"}, set()):
        idle = _stream_run(small_nodes, 0.0, parts)
        assert idle.throttles == 0 and idle.over_budget_node_s == 0
    # Busy jobs draw it: the scheduler caps what the stream shows over budget; without the stream's power
    # readings it cannot, and the node's own capping (every GPU alike) does. At 60% busy a GPU draws 68% of its
    # board: over the budget, far from the power-headroom score's 15%, so both place alike until the caps.
    busy = {name: _stream_run(small_nodes, 60.0, parts) for name, parts in (("live", {"thermal"}), ("none", set()))}
    assert all(r.over_budget_node_s > 0 and r.throttles > 0 for r in busy.values())
    assert busy["live"].throttles < busy["none"].throttles  # lowest priority first, not every GPU

    def bigger_boards(model, util, temp, dt):  # boards twice dynamic.py's, busy at 45% of them: within budget
        board = 2 * BOARD_POWER_W.get(model, 300.0)
        return board * (0.2 + 0.25 * util), 40.0, board

    assert _stream_run(small_nodes, 100.0, {"thermal"}, bigger_boards).over_budget_node_s == 0


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


def test_the_core_never_sees_a_true_runtime_unless_it_is_the_oracle(small_nodes):
    """The simulator knows only what the live scheduler would: no true duration reaches a workload the core
    reads, except as the oracle ceiling's runtime."""
    from gpuaware.stream.runtime import RuntimeForecaster

    nodes, pods = load_nodes(small_nodes), load_pods(PODS)
    base = dict(jobs=200, node_fraction=0.3, fault_every_s=1e9)
    for durations in ("unknown", "forecast", "oracle"):
        r = run_dynamic(nodes, pods, "gpuaware", seed=0, cfg=DynamicConfig(**base, durations=durations,
                                                                           order="predicted"),
                        runtime=RuntimeForecaster())
        sources = {j.workload.runtime.source if j.workload.runtime else None for j in r.jobs.values()}
        assert all(j.workload.duration_s is None for j in r.jobs.values())
        assert sources == {"unknown": {None}, "forecast": {"forecast"}, "oracle": {"oracle"}}[durations]
