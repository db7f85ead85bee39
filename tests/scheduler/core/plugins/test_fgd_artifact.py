"""FGD as the ATC'23 artifact runs it: typical pods, the measure, the quantized score, the tie order, and a
placement worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Candidates, CycleContext, Profile, Scheduler
from gpuaware.scheduler.core.plugins.fgd import GpuFigures
from gpuaware.scheduler.core.plugins.fgd_artifact import (
    ArtifactFragmentationGradient,
    artifact_fragmentation,
    pod_key,
    quantize,
    typical_pods,
    typical_pods_of,
)
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix


def test_typical_pods_keep_the_most_frequent_to_95_percent_and_renormalise():
    counts = {pod_key(1000, 1, 500, ()): 50, pod_key(2000, 1, 1000, ()): 30, pod_key(4000, 0, 0, ()): 15,
              pod_key(8000, 8, 1000, ()): 4, pod_key(500, 1, 200, ("T4",)): 1}
    t = typical_pods(counts)
    # 50 + 30 + 15 = 95 of 100 pods: three types, renormalised over those 95.
    assert t.cpu.tolist() == [1000, 2000, 4000]
    assert np.allclose(t.p, [50 / 95, 30 / 95, 15 / 95])
    assert typical_pods(counts, popularity_pct=96).cpu.tolist() == [1000, 2000, 4000, 8000]


def test_typical_pods_ties_go_to_the_larger_key_and_keys_carry_the_model_not_memory():
    # Equal counts: sort.Reverse(TargetPodList) puts the larger (cpu, milli, count, model) first.
    t = typical_pods({pod_key(1000, 1, 500, ()): 5, pod_key(1000, 1, 500, ("V100M16",)): 5,
                      pod_key(3000, 1, 500, ()): 5, pod_key(0, 0, 0, ()): 1}, popularity_pct=60)
    assert t.cpu.tolist() == [3000, 1000] and t.models == [(), ("V100M16",)]
    # Memory is not part of the key: two shapes differing only in memory merge; CPU 0 reads as 100.
    mix = WorkloadMix.of([Workload("a", 1000, 1024, 1, 500), Workload("b", 1000, 9999, 1, 500),
                          Workload("c", 0, 10, 0, 1000)])
    merged = typical_pods_of(mix.counts.items())
    assert merged.cpu.tolist() == [1000, 100] and np.allclose(merged.p, [2 / 3, 1 / 3])
    assert merged.milli.tolist() == [500, 0] and merged.num_gpu.tolist() == [1, 0]


def test_fragmentation_counts_cpu_only_types_model_mismatch_and_cpu_shortage_as_all_free():
    t = typical_pods({pod_key(1000, 1, 500, ()): 1, pod_key(1000, 0, 0, ()): 1, pod_key(1000, 1, 500, ("T4",)): 1,
                      pod_key(9000, 1, 500, ()): 1})
    free = np.array([[1000, 300]])  # 1300 free, 300 of it below the 500-milli threshold
    gpus = GpuFigures.of(free, t.thresholds)
    access = t.access(np.array(["V100M16"]))
    frag = artifact_fragmentation(gpus, np.array([4000]), access, t)
    # fits: 300 | CPU-only: all 1300 | T4 only on a V100 node: all | 9 cores on 4 free: all.
    assert frag.tolist() == [300 + 1300 + 1300 + 1300]  # weighted by pod counts (1 each here)


def test_score_is_the_sigmoid_of_the_drop_in_thousandths_truncated_to_an_integer():
    before, after = np.array([1000.0, 1000.0, 1000.0, 0.0]), np.array([1000.0, 0.0, 3000.0, 1.0])
    # sigmoid(0) = .5 -> 50; sigmoid(1) = .731 -> 73; sigmoid(-2) = .119 -> 11; sigmoid(-.001) = .49975 -> 49
    assert quantize(before, after).tolist() == [50, 73, 11, 49]


def _scheduler(nodes: list[NodeSpec], mix: list[Workload], seed: int = 0) -> Scheduler:
    return Scheduler(profile("fgd-artifact", WorkloadMix.of(mix), seed), seed=seed)


def test_ties_go_to_a_seeded_node_order_fixed_for_the_run_and_then_the_lowest_gpu():
    nodes = [NodeSpec(f"n{i}", 32000, 65536, 2, "V100M16") for i in range(6)]
    s = _scheduler(nodes, [Workload("m", 1000, 1024, 1, 1000)], seed=7)
    rank = s.node_rank(len(nodes))
    assert sorted(rank.tolist()) == list(range(6))
    c = ClusterState(nodes)
    first = s.schedule(c, Workload("a", 1000, 1024, 1, 1000)).allocation
    # Every empty node scores alike: the first in the seeded order takes it, on its GPU 0.
    assert first.node == int(np.argmin(rank)) and first.gpus == [0]
    again = _scheduler(nodes, [Workload("m", 1000, 1024, 1, 1000)], seed=7)
    assert again.schedule(ClusterState(nodes), Workload("a", 1000, 1024, 1, 1000)).allocation.node == first.node
    assert not np.array_equal(_scheduler(nodes, [], seed=8).node_rank(6), rank)


def test_unknown_tie_order_is_refused():
    with pytest.raises(ValueError, match="tie order"):
        Scheduler(Profile("x", [], [], tie_order="alphabetical"))


def test_hand_computed_placement_on_a_small_cluster():
    """Two nodes; the mix: a 500-milli pod (3 of 4 pods) and a whole-GPU pod (1 of 4).

    n0 has GPUs free (1000, 500), n1 has (1000, 1000); a 500-milli pod arrives.
    Fragmentation before: n0: share type 0 (both GPUs >= 500), whole type 500 (the partial GPU) -> .25*500 = 125;
    n1: 0. After, per GPU: n0 GPU0 (500, 500): whole type all 1000 -> 250, delta -125 -> sigmoid(-.125) -> 46;
    n0 GPU1 (1000, 0): 0 -> delta +125 -> sigmoid(.125) -> 53; n1 GPU0 (500, 1000): whole 500 -> 125,
    delta -125 -> 46. So n0's GPU1 wins (53), though n1 is emptier."""
    nodes = [NodeSpec("n0", 32000, 65536, 2, "V100M16"), NodeSpec("n1", 32000, 65536, 2, "V100M16")]
    mix = [Workload(f"s{i}", 1000, 1024, 1, 500) for i in range(3)] + [Workload("w", 1000, 1024, 1, 1000)]
    c = ClusterState(nodes)
    c.allocate(Allocation("x", 0, [1], [500], 1000, 1024))
    s = _scheduler(nodes, mix)
    w = Workload("p", 1000, 1024, 1, 500)
    plugin = s.profile.scores[0][0]
    assert isinstance(plugin, ArtifactFragmentationGradient)
    cand = Candidates(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]))
    assert plugin.score(CycleContext(c, w), cand).tolist() == [46, 53, 46, 46]
    got = s.schedule(c, w).allocation
    assert (got.node, got.gpus) == (0, [1])


@pytest.mark.parametrize("request_", [(0, 1000), (1, 1000), (2, 1000), (1, 300), (1, 50)])
def test_cached_after_states_equal_the_fragmentation_recomputed_from_scratch(request_):
    num_gpu, milli = request_
    rng = np.random.default_rng(5)
    nodes = [NodeSpec(f"n{i}", 16000, 65536, 4, ("T4", "V100M16")[i % 2]) for i in range(8)]
    c = ClusterState(nodes)
    for i in range(8):
        for j in range(4):
            used = int(rng.choice([0, 0, 200, 500, 1000]))
            if used:
                c.allocate(Allocation(f"w{i}-{j}", i, [j], [used], 1000, 1024))
    t = typical_pods({pod_key(1000, 1, 500, ()): 4, pod_key(2000, 1, 1000, ("T4",)): 3, pod_key(4000, 0, 0, ()): 2,
                      pod_key(1000, 2, 1000, ()): 2, pod_key(500, 1, 300, ()): 1})
    plugin = ArtifactFragmentationGradient(t)
    w = Workload("p", 3000, 1024, num_gpu, milli)
    ctx = CycleContext(c, w)
    cand, _ = Scheduler(Profile("x", [], [])).candidates(ctx)
    got = plugin.score(ctx, cand)
    access = t.access(c.models)
    before = artifact_fragmentation(GpuFigures.of(c.gpu_free, t.thresholds), c.cpu_free, access, t)
    want = []
    for node, gpu in zip(cand.node, cand.gpu, strict=True):
        free = c.gpu_free[node].copy()
        if num_gpu == 1 and milli < 1000:
            free[gpu] -= milli
        elif num_gpu:
            free[np.flatnonzero(free == 1000)[:num_gpu]] = 0
        after = artifact_fragmentation(GpuFigures.of(free[None, :], t.thresholds), np.array([c.cpu_free[node] - 3000]),
                                       access[[node]], t)
        want.append(quantize(before[[node]] / t.count.sum(), after / t.count.sum())[0])
    assert got.tolist() == want
