"""The framework's extension points, reason codes and priority levels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.cycle import PassStats, QueuePolicy, QueueState, gang_failure, place_gang, schedule_pass
from gpuaware.scheduler.core.framework import (
    CycleContext,
    Decision,
    GpuFilterPlugin,
    NodeFilterPlugin,
    Profile,
    Scheduler,
    ScorePlugin,
)
from gpuaware.scheduler.core.plugins.bestfit import BestFit
from gpuaware.scheduler.core.plugins.forecast_headroom import ForecastHeadroom
from gpuaware.scheduler.core.plugins.health import HealthFilter
from gpuaware.scheduler.core.plugins.least_allocated import LeastAllocated
from gpuaware.scheduler.core.plugins.model_affinity import ModelAffinity
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.queue import Tenant, TenantLedger
from gpuaware.scheduler.core.registry import Handle, in_tree
from gpuaware.scheduler.core.status import Code, Reason, reason_label
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from tests.support import cluster, scheduler_with

MIX = WorkloadMix.of([Workload("w", 1000, 1024, 1, 1000)])


def _cluster(*specs: tuple[int, str], cpu: int = 32000) -> ClusterState:
    return ClusterState([NodeSpec(f"n{i}", cpu, 262144, g, m, 16384) for i, (g, m) in enumerate(specs)])


class _Both:
    """A filter on nodes and on GPUs."""

    name, code, reason = "both", Code.UNHEALTHY, "both"

    def filter_nodes(self, ctx):
        return np.arange(len(ctx.cluster)) != 0

    def filter_gpus(self, ctx):
        return np.ones_like(ctx.cluster.gpu_exists)


def test_in_tree_plugins_implement_the_protocols_their_role_needs():
    plugins = [in_tree().build(n, Handle(MIX, throughput=ThroughputTable({}, {}))) for n in in_tree().names()]
    kinds = {p.name: (isinstance(p, NodeFilterPlugin), isinstance(p, GpuFilterPlugin), isinstance(p, ScorePlugin))
             for p in plugins}
    assert kinds["model-affinity"] == kinds["capabilities"] == (True, False, False)
    assert kinds["gpu-health"] == (False, True, False)
    assert kinds["forecast-headroom"] == (False, True, True)
    assert kinds["fgd"] == kinds["random"] == (False, False, True)
    assert all(any(k) for k in kinds.values())


def test_a_profile_sorts_its_filters_into_steps_once_in_declared_order():
    both, health, affinity = _Both(), HealthFilter(), ModelAffinity()
    p = Profile("t", [health, both, affinity], [(LeastAllocated(), 1)])
    assert [(s.plugin, s.on_gpus) for s in p.filter_steps] == [(health, True), (both, False), (both, True),
                                                             (affinity, False)]
    assert p.scored_by == "least-allocated" and Profile("t", [], []).scored_by == "first fit"
    assert isinstance(p.filters, tuple) and p.scores == ((p.scores[0][0], 1.0),)


def test_a_plugin_in_the_wrong_slot_is_refused_when_the_profile_is_built():
    with pytest.raises(TypeError, match="neither NodeFilterPlugin nor GpuFilterPlugin"):
        Profile("t", [LeastAllocated()], [])
    with pytest.raises(TypeError, match="does not implement ScorePlugin"):
        Profile("t", [], [(HealthFilter(), 1.0)])

    class NoCode:  # filter_nodes, but no code to report a rejection with
        name, reason = "no-code", "x"

        def filter_nodes(self, ctx):
            return np.ones(len(ctx.cluster), dtype=bool)

    with pytest.raises(TypeError):
        Profile("t", [NoCode()], [])


def test_a_failed_cycle_carries_typed_reasons_and_renders_the_same_lines():
    c = _cluster((2, "T4"), (2, "V100"), (2, "V100"), cpu=4000)
    c.set_band(2, 0, HealthBand.CRITICAL)
    c.set_band(2, 1, HealthBand.CRITICAL)
    c.allocate(Allocation("big", 1, [], [], 4000, 0))
    s = Scheduler(Profile("t", [ModelAffinity(), HealthFilter()], [(LeastAllocated(), 1.0)]))
    d = s.schedule(c, Workload("w", 1000, 1024, 1, 1000, models=("V100",)))
    assert d.allocation is None
    assert [(r.code, r.plugin) for r in d.why] == [(Code.INSUFFICIENT_CPU_MEMORY, "node-resources"),
                                                  (Code.GPU_MODEL_MISMATCH, "model-affinity"),
                                                  (Code.UNHEALTHY, "gpu-health"),
                                                  (Code.INSUFFICIENT_GPU, "gpu-fit")]
    assert d.reasons == ["0/3 nodes available: 1 insufficient cpu/memory, 1 gpu model not allowed, "
                         "2 GPUs excluded by gpu health, no GPU with enough free compute/memory"]
    ok = s.schedule(c, Workload("gpu", 1000, 1024, 1, 1000))
    assert [r.code for r in ok.why] == [Code.SCHEDULED, Code.SCHEDULED]
    assert ok.reasons == [f"n0 gpus=[{ok.allocation.gpus[0]}] by least-allocated", "2 candidates"]


def test_rank_reports_the_filter_messages():
    c = _cluster((2, "T4"), (2, "V100"))
    s = Scheduler(profile("fgd", MIX))
    best, why = s.rank(c, Workload("w", 1000, 1024, 1, 1000, models=("V100",)))
    assert np.isinf(best[0]) and np.isfinite(best[1]) and why == ["1 gpu model not allowed"]


def test_rank_among_scores_and_counts_only_the_nodes_asked_about():
    c = _cluster((2, "T4"), (2, "V100"), (2, "V100"))
    s = Scheduler(profile("fgd", MIX))
    w = Workload("w", 1000, 1024, 1, 1000, models=("V100",))
    everywhere, _ = s.rank(c, w)
    best, why = s.rank(c, w, among=np.array([True, True, False]))
    assert np.isinf(best[2]) and best[1] == everywhere[1] and why == ["1 gpu model not allowed"]
    _, why = s.rank(c, w, among=np.array([False, True, True]))
    assert why == []  # the T4 node was not asked about: no reason counts it
    c.set_band(2, 0, HealthBand.CRITICAL)  # a GPU filter's reason counts only the GPUs of nodes asked about
    c.set_band(2, 1, HealthBand.CRITICAL)
    _, why = Scheduler(Profile("t", [HealthFilter()], [(LeastAllocated(), 1.0)])).rank(
        c, w, among=np.array([True, True, False]))
    assert why == []


class _Blocked:
    """Pass hooks that keep the decisions of blocked workloads."""

    def __init__(self):
        self.decisions: list[Decision] = []

    def evict(self, victim, preemptor, now):
        pass

    def start(self, workload, decision, now):
        return True

    def blocked(self, workload, decision, now):
        self.decisions.append(decision)


def _failures() -> list[Decision]:
    """Failed decisions for every way the core rejects a workload."""
    gpuaware = Scheduler(profile("gpuaware", MIX))

    def fail(c: ClusterState, w: Workload, mask=None, s: Scheduler = gpuaware) -> Decision:
        d = s.schedule(c, w, mask)
        assert d.allocation is None, w.id
        return d

    full = _cluster((1, "V100"))
    full.allocate(Allocation("low", 0, [0], [1000], 0, 0))
    sick = _cluster((1, "V100"))
    sick.set_band(0, 0, HealthBand.CRITICAL)
    hot = _cluster((1, "V100"))
    hot.forecast_util[:] = 99.0
    out = [fail(_cluster((2, "V100"), cpu=8000), Workload("cpu", 9000, 1024)),
           fail(_cluster((2, "V100")), Workload("model", 1000, 1024, 1, 1000, models=("A100",))),
           fail(_cluster((2, "V100"), (2, "V100")), Workload("whole", 1000, 1024, 4)),
           fail(full, Workload("one", 1000, 1024, 1, 1000)),
           fail(_cluster((2, "V100")), Workload("caps", 1000, 1024, 1, 1000, min_gpu_memory_gib=1000)),
           fail(sick, Workload("sick", 0, 0, 1, 500, preemptible=False)),
           fail(_cluster((2, "V100")), Workload("masked", 1000, 1024), np.array([False])),
           fail(_cluster(), Workload("nowhere", 1000, 1024)),
           fail(hot, Workload("hot", 0, 0, 1, 500), s=Scheduler(Profile("t", [ForecastHeadroom()], [])))]
    running = {"low": Running(Workload("low", num_gpu=1, preemptible=False), full.allocations["low"], 0.0, 0.0, None)}
    hooks = _Blocked()
    schedule_pass(gpuaware, full, QueueState([Workload("urgent", 0, 0, 1, 1000, priority=PriorityLevel.HIGH)],
                                             running, {}, None), QueuePolicy.kube(), hooks, PassStats(), 0.0)
    out += hooks.decisions
    capped = TenantLedger({"t": Tenant("t", quota_gpu_milli=1000, borrow=False)}, 2000, 1 << 20, {"t": 1000})
    hooks = _Blocked()
    schedule_pass(gpuaware, _cluster((2, "V100")), QueueState([Workload("over", 0, 0, 1, 1000, tenant="t")], {}, {},
                                                              capped, enforce_quota=True),
                  QueuePolicy.kube(), hooks, PassStats(), 0.0)
    out += hooks.decisions
    gang = [Workload("g0", 1000, 1024, 8, gang="g"), Workload("g1", 1000, 1024, 1, gang="g")]
    assert place_gang(gpuaware, _cluster((2, "V100")), gang) == \
        ([], gang_failure(fail(_cluster((2, "V100")), gang[0]), 2).reasons)
    out.append(gang_failure(fail(_cluster((2, "V100")), gang[0]), len(gang)))
    return out


def test_every_failure_the_core_produces_gets_the_live_schedulers_label():
    failures = _failures()
    seen = {r.code for d in failures for r in d.why}
    assert seen == set(Code) - {Code.SCHEDULED, Code.PREEMPTED}  # every code a failure can carry
    for d in failures:
        assert reason_label(d) == _reason_class("; ".join(d.reasons)), d.reasons
    # Any mix of the reasons a failure can carry: the label is the most telling code's.
    pool = {r.code: r for d in failures for r in d.why if r.code.filtered or r.code is Code.PREEMPTION_FAILED}
    preempted = Reason(Code.PREEMPTED, "preemption", "preempted low")
    for k in range(1, len(pool) + 1):
        for combo in itertools.combinations(pool.values(), k):
            for extra in ((), (preempted,)):
                d = Decision(Workload("w"), None, [*combo, *extra], nodes=3)
                assert reason_label(d) == _reason_class("; ".join(d.reasons)), d.reasons
    gang = next(d for d in failures if d.why[0].code is Code.GANG_INCOMPLETE)
    assert reason_label(gang) == "gang-incomplete" and gang.reasons[0].startswith("gang g: member g0 does not fit")


def test_priority_levels_are_the_ints_they_always_were():
    assert [int(p) for p in PriorityLevel] == [0, 1, 2]
    assert (PriorityLevel.LOW, PriorityLevel.MEDIUM, PriorityLevel.HIGH) == (0, 1, 2)
    assert [p.label for p in reversed(PriorityLevel)] == ["high", "medium", "low"]
    assert Workload("w").priority == 0 and f"{PriorityLevel.HIGH}" == "2"


def _reason_class(reason: str) -> str:
    """The live scheduler's old substring classifier, kept as the oracle: the labels on the dashboards
    must not change now that they come from reason codes."""
    for needle, label in (("gang", "gang-incomplete"), ("insufficient cpu", "cpu-memory"),
                          ("free GPUs", "gpus"), ("enough free compute", "gpus"), ("health", "health"),
                          ("model", "gpu-model"), ("capabilit", "capabilities"), ("reserved", "reservation")):
        if needle in reason:
            return label
    return "other"
def test_multi_gpu_workloads_stay_on_one_nvlink_island():
    c = ClusterState([NodeSpec("dgx", 96000, 1048576, 8, "H100", 81920, nvlink_groups=[0, 0, 0, 0, 1, 1, 1, 1])])
    c.allocate(Allocation("one", 0, [0], [1000], 1000, 1024))
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("pair", 2000, 4096, num_gpu=4))
    assert d.allocation.gpus == [4, 5, 6, 7]
    d = scheduler_with(LeastAllocated()).schedule(c, Workload("two", 2000, 4096, num_gpu=2))
    assert set(d.allocation.gpus) <= {1, 2, 3}


def test_scheduling_context_exposes_the_gpu_mask_to_plugins():
    c = cluster(2)
    ctx = CycleContext(c, Workload("w", 0, 0, 1, 500))
    cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
    assert len(cand) == 2 and ctx.cache["gpu_ok"].shape == c.gpu_free.shape


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


# Half-GPU pods common, whole GPUs rarer: FGD alone keeps GPUs with half or more free and opens a fresh one.
SHARE_MIX = WorkloadMix.of([Workload(f"h{i}", 1000, 1024, 1, 500) for i in range(9)] + [Workload("w", 1000, 1024, 1)])


def _shared(*used: int) -> ClusterState:
    """Nodes of two GPUs, GPU 0 of node i holding ``used[i]`` milli of shares (0: none)."""
    c = ClusterState([NodeSpec(f"n{i}", 32000, 262144, 2, "A100", 81920) for i in range(len(used))])
    for i, milli in enumerate(used):
        if milli:
            c.allocate(Allocation(f"s{i}", i, [0], [milli], 0, 0, sharing="shared"))
    return c


def _place(c: ClusterState, milli: int, memory_share: bool = True) -> tuple[int, int]:
    d = Scheduler(profile("gpuaware", SHARE_MIX), seed=3).schedule(
        c, Workload("share", 1000, 1024, 1, milli, memory_share=memory_share))
    return d.allocation.node, d.allocation.gpus[0]


def test_a_memory_share_goes_to_the_partly_used_gpu_it_fills_most_tightly():
    assert _place(_shared(400, 0, 0), 200, memory_share=False) != (0, 0)  # FGD alone opens another GPU
    assert _place(_shared(400, 0, 0), 200) == (0, 0)
    assert _place(_shared(400, 700, 0), 200) == (1, 0)  # 100 left there, 400 on n0
    assert _place(_shared(400, 700, 0), 600) == (0, 0)  # the only partly used GPU it fits
    c = _shared(400, 700, 0)
    c.set_band(1, 0, HealthBand.CRITICAL)  # the health filter still applies
    assert _place(c, 200) == (0, 0)


def test_a_memory_share_no_partly_used_gpu_fits_is_placed_by_the_scores_alone():
    for make in (lambda: _shared(400, 700, 0), lambda: _shared(0, 0, 0)):
        assert _place(make(), 700) == _place(make(), 700, memory_share=False)
