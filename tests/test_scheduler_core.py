"""The scheduling core: each plugin alone, and the invariants over random clusters (hypothesis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.events import HealthBand
from scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from scheduler.core.framework import Candidates, CycleContext, Profile, Scheduler
from scheduler.core.plugins.bestfit import BestFit
from scheduler.core.plugins.clustering import Clustering
from scheduler.core.plugins.cpu_for_gpus import CpuForGpus
from scheduler.core.plugins.fgd import FragmentationGradient, TaskTypes, fragmentation
from scheduler.core.plugins.health import HealthFilter
from scheduler.core.plugins.least_allocated import LeastAllocated
from scheduler.core.plugins.model_affinity import ModelAffinity
from scheduler.core.plugins.model_reservation import ModelReservation
from scheduler.core.plugins.packing import GpuPacking
from scheduler.core.policies import POLICIES, profile
from scheduler.core.preemption import Running, select_victims
from scheduler.core.queue import Tenant, TenantLedger, fair_order
from scheduler.core.workload import Workload
from scheduler.core.workload_mix import WorkloadMix

TYPES = TaskTypes.from_counts({(1000, 1024, 1, 1000): 3, (1000, 1024, 1, 500): 1, (0, 0, 0, 0): 1})
MIX = WorkloadMix.of([Workload(f"w{i}", 1000, 1024, 1, 1000) for i in range(3)]
                     + [Workload("half", 1000, 1024, 1, 500), Workload("cpu", 1000, 1024, 0)])


def cluster(*gpus_per_node: int, model: str = "V100", cpu: int = 32000) -> ClusterState:
    return ClusterState([NodeSpec(f"n{i}", cpu, 262144, g, model, 16384) for i, g in enumerate(gpus_per_node)])


def scheduler_with(*scores, filters=None) -> Scheduler:
    return Scheduler(Profile("t", filters or [ModelAffinity(), HealthFilter()], [(s, 1.0) for s in scores]))


def test_a_plain_gpu_request_is_whole_gpus():
    w = Workload("plain", 1000, 1024, num_gpu=2)
    assert w.gpu_milli == 1000 and not w.shares_gpu and w.gpu_milli_total == 2000
    with pytest.raises(ValueError, match="fractions are for one GPU only"):
        Workload("bad", num_gpu=2, gpu_milli=500)


def test_model_affinity_keeps_workloads_on_allowed_models():
    c = ClusterState([NodeSpec("t4", 32000, 65536, 2, "T4"), NodeSpec("v100", 32000, 65536, 2, "V100")])
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("w", 1000, 1024, 1, 1000, models=("V100",)))
    assert c.names[d.allocation.node] == "v100"
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("x", 1000, 1024, 1, 1000, models=("A100",)))
    assert d.allocation is None and "gpu model not allowed" in d.reasons[0]


def test_critical_gpus_take_nothing_and_degraded_only_preemptible_work():
    c = cluster(2)
    c.set_band(0, 0, HealthBand.CRITICAL)
    c.set_band(0, 1, HealthBand.DEGRADED)
    s = scheduler_with(LeastAllocated())
    assert s.schedule(c, Workload("strict", 0, 0, 1, 500, preemptible=False)).allocation is None
    d = s.schedule(c, Workload("batch", 0, 0, 1, 500, preemptible=True))
    assert d.allocation.gpus == [1]


def test_least_allocated_spreads_and_best_fit_packs():
    c = cluster(4, 4)
    c.allocate(Allocation("busy", 0, [0, 1], [1000, 1000], 8000, 1024))
    assert scheduler_with(LeastAllocated()).schedule(c, Workload("a", 1000, 1024, 1, 1000)).allocation.node == 1
    assert scheduler_with(BestFit()).schedule(c, Workload("b", 1000, 1024, 1, 1000)).allocation.node == 0


def test_packing_fills_a_shared_gpu_first():
    c = cluster(2, 2)
    c.allocate(Allocation("half", 1, [1], [500], 1000, 1024))
    d = scheduler_with(GpuPacking()).schedule(c, Workload("w", 1000, 1024, 1, 300))
    assert (d.allocation.node, d.allocation.gpus) == (1, [1])


def test_clustering_puts_like_with_like():
    c = cluster(4, 4)
    c.allocate(Allocation("same-shape", 1, [0], [300], 1000, 1024))
    c.allocate(Allocation("other-shape", 0, [0], [1000], 1000, 1024))
    d = scheduler_with(Clustering()).schedule(c, Workload("w", 1000, 1024, 1, 300))
    assert d.allocation.node == 1


def test_fragmentation_measure_by_hand():
    free = np.array([[1000, 500, 200, 0]])
    frag = fragmentation(free, np.array([4000]), np.array([8192]), TYPES)
    # whole-GPU type: partial GPUs (500 + 200) are fragments; 500-milli type: the 200 is; CPU type: none.
    assert frag.tolist() == [[700.0, 200.0, 0.0]]
    no_cpu = fragmentation(free, np.array([0]), np.array([8192]), TYPES)
    assert no_cpu.tolist() == [[1700.0, 1700.0, 0.0]]  # the CPU-only type (0 CPU) still fits


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from([0, 50, 190, 300, 500, 810, 1000]), min_size=1, max_size=8), min_size=1,
                max_size=6),
       st.sampled_from([(1, 300), (1, 1000), (1, 50), (2, 1000), (0, 0)]), st.integers(0, 8000))
def test_fgd_delta_equals_fragmentation_recomputed_from_scratch(gpus, request, cpu):
    """The cached, incremental path (one GPU changed per candidate) against the definition."""
    c = ClusterState([NodeSpec(f"n{i}", 16000, 65536, len(g), "V100") for i, g in enumerate(gpus)])
    for i, g in enumerate(gpus):
        for j, free in enumerate(g):
            if free < 1000:
                c.allocate(Allocation(f"w{i}-{j}", i, [j], [1000 - free], 1000, 1024))
    types = TaskTypes.from_counts({(1000, 1024, 1, 1000): 3, (2000, 1024, 1, 300): 2, (500, 512, 1, 190): 1,
                                   (4000, 4096, 2, 1000): 1, (8000, 1024, 0, 0): 1})
    fgd = FragmentationGradient(types)
    w = Workload("w", cpu, 1024, request[0], request[1] or 1000) if request[0] else Workload("w", cpu, 1024, 0)
    for step in range(2):  # the second step reads the node figures FGD cached and updated for the changed node
        ctx = CycleContext(c, w)
        cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
        if not len(cand):
            return
        _check_delta(fgd, ctx, cand, types)
        c.allocate(Allocation(f"placed-{step}", int(cand.node[0]), [max(int(cand.gpu[0]), 0)] if w.num_gpu == 1 else [],
                              [w.gpu_milli] if w.num_gpu == 1 else [], 0, 0))


def _check_delta(fgd: FragmentationGradient, ctx: CycleContext, cand: Candidates, types: TaskTypes) -> None:
    c, w = ctx.cluster, ctx.workload
    got = fgd.delta(ctx, cand)
    for k in range(len(cand)):
        n, g = int(cand.node[k]), int(cand.gpu[k])
        free = c.gpu_free[n:n + 1].copy()
        if w.num_gpu == 1:
            free[0, g] -= w.gpu_milli
        elif w.num_gpu > 1:
            free[0, np.flatnonzero(ctx.cache["gpu_ok"][n])[:w.num_gpu]] -= 1000
        before = fragmentation(c.gpu_free[n:n + 1], c.cpu_free[n:n + 1], c.mem_free[n:n + 1], types) @ types.p
        after = fragmentation(free, c.cpu_free[n:n + 1] - w.cpu_milli, c.mem_free[n:n + 1] - w.memory_mib,
                              types) @ types.p
        assert got[k] == pytest.approx(float(after[0] - before[0]))


def test_fgd_fills_a_half_used_gpu_rather_than_breaking_a_whole_one():
    c = cluster(2, 2)
    c.allocate(Allocation("half", 0, [0], [500], 1000, 1024))
    d = scheduler_with(FragmentationGradient(TYPES)).schedule(c, Workload("w", 1000, 1024, 1, 500))
    assert (d.allocation.node, d.allocation.gpus) == (0, [0])


def test_the_mix_gives_fgd_its_typical_shapes_and_knows_cpu_per_gpu_and_constrained_demand():
    common = [Workload(f"c{i}", 4000, 8192, 1, 1000) for i in range(6)]
    rare = [Workload("r1", 1000, 1024, 1, 160), Workload("r2", 3000, 2048, 1, 160), Workload("r3", 2000, 4096, 1, 160)]
    t4 = [Workload(f"t{i}", 4000, 8192, 1, 500, models=("T4",)) for i in range(2)]
    mix = WorkloadMix.of(common + rare + t4)
    top = mix.task_types(top=2)  # FGD's artifact: typical shapes only; the T4 pods' shape counts, models aside
    assert list(zip(top.milli.tolist(), top.p.round(3).tolist(), strict=True)) == [(1000, 0.75), (500, 0.25)]
    assert len(mix.task_types(top=None).p) == 5
    demand = 6 * 1000 + 3 * 160 + 2 * 500
    assert mix.model_demand() == {frozenset({"T4"}): 1000 / demand}
    assert mix.cpu_per_gpu() == pytest.approx((6 * 4000 + 6000 + 8000) / (demand / 1000))



def test_model_reservation_keeps_a_scarce_models_gpus_for_the_work_only_it_can_serve():
    c = ClusterState([NodeSpec("t4", 32000, 65536, 2, "T4"), NodeSpec("g2", 32000, 65536, 8, "G2")])
    reserve = ModelReservation({frozenset({"T4"}): 0.5})
    anywhere = Workload("any", 1000, 1024, 1, 1000)
    # Half the demand needs a T4 and only two of ten GPUs are T4s: work that could run anywhere goes elsewhere
    d = scheduler_with(reserve, LeastAllocated()).schedule(c, anywhere)
    assert c.names[d.allocation.node] == "g2"
    # ... while a T4-only workload is not held back by its own reservation
    ctx = CycleContext(c, Workload("t4-only", 1000, 1024, 1, 1000, models=("T4",)))
    assert not reserve.score(ctx, Candidates(np.array([0, 0]), np.array([0, 1]))).any()
    # Sharing a GPU already in use takes no whole T4 and costs nothing; the last whole T4 falls short of
    # half of the 7 whole GPUs left after it
    c.allocate(Allocation("half", 0, [0], [500], 1000, 1024))
    ctx = CycleContext(c, Workload("small", 1000, 1024, 1, 300))
    assert reserve.score(ctx, Candidates(np.array([0, 0]), np.array([0, 1]))).tolist() == [0.0, -3500.0]
    # With no constrained demand the score is flat
    flat = ModelReservation({}).score(CycleContext(c, anywhere), Candidates(np.array([0, 1]), np.array([1, 0])))
    assert not flat.any()


def test_placements_leave_each_node_the_cpu_its_free_gpus_need():
    c = ClusterState([NodeSpec("gpus-free", 16000, 65536, 2, "V100"), NodeSpec("gpus-taken", 16000, 65536, 2, "V100")])
    c.allocate(Allocation("busy", 1, [0, 1], [1000, 1000], 4000, 1024))
    etl = Workload("etl", 8000, 1024, 0)
    assert c.names[scheduler_with(LeastAllocated()).schedule(c, etl).allocation.node] == "gpus-free"  # spreading
    c.release("etl")
    assert c.names[scheduler_with(CpuForGpus(cpu_per_gpu=6000.0)).schedule(c, etl).allocation.node] == "gpus-taken"
    c.release("etl")
    both = Candidates(np.array([0, 1]), np.array([-1, -1]))
    # two free GPUs need 12 cores; 16 free, 8 taken: 4 short. The other node has no free GPU to starve.
    assert CpuForGpus(6000.0).score(CycleContext(c, etl), both).tolist() == [-4000.0, 0.0]
    # A GPU pod takes its GPU's share of CPU along: a lean one leaves no shortage, a CPU-hungry one does
    one_gpu = Candidates(np.array([0]), np.array([0]))
    assert CpuForGpus(6000.0).score(CycleContext(c, Workload("lean", 4000, 1024, 1)), one_gpu).tolist() == [0.0]
    hungry = Workload("hungry", 14000, 1024, 1)  # leaves 2 cores beside a free GPU that needs 6
    assert CpuForGpus(6000.0).score(CycleContext(c, hungry), one_gpu).tolist() == [-4000.0]


def test_multi_gpu_workloads_stay_on_one_nvlink_island():
    c = ClusterState([NodeSpec("dgx", 96000, 1048576, 8, "H100", 81920, nvlink_groups=[0, 0, 0, 0, 1, 1, 1, 1])])
    c.allocate(Allocation("one", 0, [0], [1000], 1000, 1024))
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("pair", 2000, 4096, num_gpu=4))
    assert d.allocation.gpus == [4, 5, 6, 7]
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("two", 2000, 4096, num_gpu=2))
    assert set(d.allocation.gpus) <= {1, 2, 3}


def test_k8s_default_rounds_fractions_up_to_whole_gpus():
    c = cluster(2)
    s = Scheduler(profile("k8s-default", MIX))
    assert s.schedule(c, Workload("a", 0, 0, 1, 300)).allocation.milli == [1000]


def _running(wid: str, node: int, gpu: int, prio: int, lost_s: float, now: float = 1000.0, **kw) -> Running:
    w = Workload(wid, 1000, 1024, 1, 1000, priority=prio, **kw)
    return Running(w, Allocation(wid, node, [gpu], [1000], 1000, 1024), now - lost_s, 0.0, None)


def test_preemption_evicts_the_cheapest_lower_priority_victims_only():
    c = cluster(2, 2)
    running = {}
    for r in (_running("low-young", 0, 0, 0, 10), _running("low-old", 0, 1, 0, 900),
              _running("high", 1, 0, 2, 5), _running("low-b", 1, 1, 0, 500)):
        c.allocate(r.allocation)
        running[r.workload.id] = r
    urgent = Workload("urgent", 1000, 1024, 1, 1000, priority=2)
    node, victims = select_victims(c, urgent, running, now=1000.0)
    assert [v.workload.id for v in victims] == ["low-young"]  # least work lost
    assert node == 0
    peer = Workload("peer", 1000, 1024, 1, 1000, priority=0)
    assert select_victims(c, peer, running, now=1000.0) is None  # never equal or higher priority


def test_borrowed_work_is_reclaimed_for_a_tenant_within_quota():
    c = cluster(1)
    r = _running("borrowed", 0, 0, 1, 100, tenant="team-b")
    r.borrowed = True
    c.allocate(r.allocation)
    owner = Workload("owner", 1000, 1024, 1, 1000, priority=1, tenant="team-a")
    assert select_victims(c, owner, {"borrowed": r}, 1000.0) is None
    _, victims = select_victims(c, owner, {"borrowed": r}, 1000.0, reclaimable=lambda v: v.borrowed)
    assert [v.workload.id for v in victims] == ["borrowed"]


def test_fair_order_is_priority_then_dominant_share_then_arrival():
    ledger = TenantLedger({"a": Tenant("a", 1.0), "b": Tenant("b", 1.0)}, 10_000, 100_000)
    ledger.charge(Workload("x", 0, 0, 4, 1000, tenant="a"))
    pending = [Workload("a1", num_gpu=1, tenant="a", submit_s=1), Workload("b1", num_gpu=1, tenant="b", submit_s=2),
               Workload("a0", num_gpu=1, tenant="a", priority=2, submit_s=3)]
    assert [w.id for w in fair_order(pending, ledger)] == ["a0", "b1", "a1"]
    assert [w.id for w in fair_order(pending, None)] == ["a0", "a1", "b1"]


node_st = st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["V100", "T4"])), min_size=1, max_size=6)
work_st = st.lists(st.tuples(st.integers(0, 4000), st.sampled_from([0, 1, 1, 1, 2, 4, 8]),
                             st.sampled_from([100, 250, 500, 1000]), st.booleans(), st.sampled_from([(), ("T4",)])),
                   min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_st, work_st, st.sampled_from(POLICIES), st.integers(0, 3))
def test_invariants_hold_for_every_policy_on_random_clusters(nodes, works, policy, seed):
    c = ClusterState([NodeSpec(f"n{i}", 16000, 65536, g, m, 16384) for i, (g, m) in enumerate(nodes)])
    if c.gpu_exists.any():
        n, g = np.argwhere(c.gpu_exists)[0]
        c.set_band(int(n), int(g), HealthBand.CRITICAL)
    s = Scheduler(profile(policy, MIX, seed), seed=seed)
    placed = []
    for i, (cpu, k, milli, preemptible, models) in enumerate(works):
        w = Workload(f"w{i}", cpu, 1024, k, milli if k == 1 else 1000, models=models, preemptible=preemptible)
        d = s.schedule(c, w)
        c.check_invariants()  # never over-allocate a GPU's milli or memory, a node's CPU or memory
        if d.allocation is None:
            continue
        a = d.allocation
        assert len(a.gpus) == k and len(set(a.gpus)) == k  # a gang of GPUs is all or nothing, on one node
        assert all(c.band[a.node, g] < 2 for g in a.gpus)  # a critical GPU gets nothing
        if models and k:
            assert c.models[a.node] in models  # a GPU-model constraint binds GPU workloads
        placed.append(w.id)
    for wid in placed:
        c.release(wid)
    assert (c.gpu_free == c.gpu_cap).all() and (c.cpu_free == c.cpu_cap).all()


def test_scheduling_context_exposes_the_gpu_mask_to_plugins():
    c = cluster(2)
    ctx = CycleContext(c, Workload("w", 0, 0, 1, 500))
    cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
    assert len(cand) == 2 and ctx.cache["gpu_ok"].shape == c.gpu_free.shape


GAVEL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "gavel" / "simulation_throughputs.json"


def test_gavel_table_orders_gpus_and_learns_online():
    from scheduler.core.throughput import ThroughputTable

    t = ThroughputTable.from_gavel(json.loads(GAVEL.read_text()))
    job = "ResNet-50 (batch size 64)"
    k80, p100, v100 = t.relative(job, ["K80", "P100", "V100M32"])
    assert k80 < p100 < v100 == 1.0
    assert t.throughput(job, "H100") > t.throughput(job, "V100M16")  # the FP32 prior for unmeasured models
    assert 0 < t.colocated_speed(job, "ResNet-18 (batch size 64)", "V100M16") < 1
    before = t.throughput(job, "T4")
    for _ in range(50):
        t.learn_one(job, "T4", 1.0)
    assert t.throughput(job, "T4") < before and abs(t.throughput(job, "T4") - 1.0) < 0.01


def test_heterogeneity_prefers_the_faster_model_and_interference_the_quieter_gpu():
    from scheduler.core.plugins.heterogeneity import HeterogeneityAffinity
    from scheduler.core.plugins.interference import InterferenceAware
    from scheduler.core.throughput import ThroughputTable

    table = ThroughputTable.from_gavel(json.loads(GAVEL.read_text()))
    c = ClusterState([NodeSpec("k80", 32000, 65536, 2, "K80"), NodeSpec("v100", 32000, 65536, 2, "V100M16")])
    job = {"gavel_class": "ResNet-50 (batch size 64)"}
    d = scheduler_with(HeterogeneityAffinity(table)).schedule(c, Workload("w", 1000, 1024, 1, 1000, labels=job))
    assert c.names[d.allocation.node] == "v100"
    c2 = cluster(2)
    classes = {"noisy": "ResNet-50 (batch size 64)"}
    c2.allocate(Allocation("noisy", 0, [0], [500], 1000, 1024, sharing="shared"))
    c2.allocate(Allocation("other", 0, [1], [500], 1000, 1024, sharing="shared"))
    scores = InterferenceAware(table, classes).score(
        CycleContext(c2, Workload("new", 0, 0, 1, 400, labels=job)),
        Candidates(np.array([0, 0]), np.array([0, 1])))
    assert scores[0] < 1.0 and scores[1] == 1.0  # the GPU with a measured co-runner costs throughput


def test_forecast_headroom_and_thermal_spreading():
    from scheduler.core.plugins.forecast_headroom import ForecastHeadroom
    from scheduler.core.plugins.thermal import ThermalSpread

    c = cluster(2)
    c.forecast_util[0, 0] = 80.0
    w = Workload("w", 0, 0, 1, 300)  # expects ~30% of a GPU
    d = Scheduler(Profile("t", [ForecastHeadroom()], [(ForecastHeadroom(), 1.0)])).schedule(c, w)
    assert d.allocation.gpus == [1]
    c = cluster(2)
    c.temp[0] = [83.0, 55.0]
    assert scheduler_with(ThermalSpread()).schedule(c, Workload("x", 0, 0, 1, 1000)).allocation.gpus == [1]


def test_consolidation_frees_whole_gpus_without_breaking_others():
    from scheduler.core.rebalance import consolidation_moves

    c = cluster(2, 2)
    c.allocate(Allocation("small", 0, [0], [200], 1000, 1024, sharing="shared"))
    c.allocate(Allocation("big", 1, [0], [700], 1000, 1024, sharing="shared"))
    moves = consolidation_moves(c)
    assert [(m.workload_id, m.to_node, m.to_gpu) for m in moves] == [("small", 1, 0)]
    lone = cluster(2)
    lone.allocate(Allocation("only", 0, [0], [300], 1000, 1024, sharing="shared"))
    assert consolidation_moves(lone) == []  # no shared GPU to move onto: moving would break a whole one


def test_throttling_caps_low_priority_power_first_and_hot_gpus_always():
    from scheduler.core.throttle import throttle_decisions

    power = np.array([[300.0, 250.0, 100.0]])
    temp = np.array([[60.0, 60.0, 90.0]])
    exists = np.ones((1, 3), dtype=bool)
    prio = np.array([[2, 0, 0]])
    actions = throttle_decisions(power, temp, exists, np.array([550.0]), prio)
    assert [(a.gpu, a.reason.split(":")[0]) for a in actions] == [(2, "thermal"), (1, "power")]
    assert actions[1].cap_w == pytest.approx(175.0)
    assert throttle_decisions(power, temp * 0 + 50, exists, np.array([1000.0]), prio) == []


def test_capability_requests_pick_models_that_meet_them():
    from scheduler.core.plugins.capabilities import Capabilities

    c = ClusterState([NodeSpec("p100", 32000, 65536, 2, "P100"), NodeSpec("t4", 32000, 65536, 2, "T4"),
                      NodeSpec("a100", 32000, 65536, 2, "NVIDIA A100-SXM4-80GB"),
                      NodeSpec("g2", 32000, 65536, 8, "G2")])
    s = Scheduler(Profile("t", [Capabilities()], [(LeastAllocated(), 1.0)]))
    tensor = s.schedule(c, Workload("tc", 0, 0, 1, 1000, needs_tensor_cores=True, min_gpu_memory_gib=20))
    assert c.names[tensor.allocation.node] == "a100"
    nvlink_tc = s.schedule(c, Workload("nv", 0, 0, 1, 1000, needs_nvlink=True, min_memory_bandwidth_gbs=800))
    assert c.names[nvlink_tc.allocation.node] == "a100"
    none = s.schedule(c, Workload("x", 0, 0, 1, 1000, min_gpu_memory_gib=100))
    assert none.allocation is None and "gpu capabilities" in none.reasons[0]
    plain = s.schedule(c, Workload("plain", 0, 0, 1, 1000))  # no capability asked: any model, G2 included
    assert plain.allocation is not None


def test_mig_gpus_take_whole_slices_and_record_the_sharing_mode():
    c = ClusterState([NodeSpec("mig", 32000, 65536, 1, "A100", 81920, mig=[True]),
                      NodeSpec("plain", 32000, 65536, 1, "A100", 81920)])
    s = scheduler_with(BestFit())
    c.allocate(Allocation("fill-plain", 1, [0], [900], 0, 0))
    d = s.schedule(c, Workload("small", 0, 0, 1, 200))  # 200 milli does not fit the plain GPU's 100 left
    assert (d.allocation.node, d.allocation.milli, d.allocation.sharing) == (0, [286], "mig")  # two 1/7 slices
    c.release("fill-plain")
    c.allocate(Allocation("fill-mig", 0, [0], [714], 0, 0))
    d = s.schedule(c, Workload("mps", 0, 0, 1, 500, labels={"sharing": "mps"}))
    assert (d.allocation.node, d.allocation.milli, d.allocation.sharing) == (1, [500], "mps")
    c.check_invariants()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.lists(st.integers(1, 8), min_size=1, max_size=6),
       st.integers(0, 3))
def test_a_gang_is_placed_whole_or_leaves_the_cluster_exactly_as_it_was(node_gpus, member_gpus, busy):
    from scheduler.core.cycle import place_gang

    cluster = ClusterState([NodeSpec(f"n{i}", 64_000, 512_000, g, "H100", 81920) for i, g in enumerate(node_gpus)])
    if busy and cluster.gpu_count[0] >= busy:
        cluster.allocate(Allocation("already", 0, list(range(busy)), [1000] * busy, 0, 0))
    before = (cluster.gpu_free.copy(), cluster.cpu_free.copy(), dict(cluster.allocations))
    members = [Workload(f"m{i}", 1000, 1024, g, gang="g") for i, g in enumerate(member_gpus)]
    scheduler = Scheduler(profile("gpuaware", WorkloadMix.of([Workload("w", 1000, 1024, 1, 1000)])))
    placed, reasons = place_gang(scheduler, cluster, members)
    cluster.check_invariants()
    if placed:
        assert not reasons and {d.workload.id for d in placed} == {m.id for m in members}
        assert all(m.id in cluster.allocations for m in members)
    else:
        assert reasons and "none of its" in reasons[0]
        assert (cluster.gpu_free == before[0]).all() and (cluster.cpu_free == before[1]).all()
        assert cluster.allocations == before[2]
    free_total = sum(max(0, g) for g in node_gpus) - (busy if busy and node_gpus[0] >= busy else 0)
    if sum(member_gpus) > free_total:
        assert not placed  # more GPUs asked than exist free: never a partial gang
