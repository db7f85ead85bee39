"""Fragmentation gradient descent: the measure by hand, its incremental delta against the definition
(hypothesis), and the placement it picks."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Candidates, CycleContext, Profile, Scheduler
from gpuaware.scheduler.core.plugins.fgd import (
    FragmentationGradient,
    NodeFigures,
    TaskTypes,
    _first_of_each,
    fragmentation,
)
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster, scheduler_with

TYPES = TaskTypes.from_counts({(1000, 1024, 1, 1000): 3, (1000, 1024, 1, 500): 1, (0, 0, 0, 0): 1})


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


def test_node_figures_recompute_only_the_nodes_that_changed_and_everything_for_a_new_cluster():
    """The per-node cache both FGD plugins keep (fgd and fgd-artifact share it)."""
    calls, new = [], []

    def fragment(c, figures, rows):
        calls.append(rows if isinstance(rows, slice) else rows.tolist())
        return figures.total.copy()

    nodes = NodeFigures(TYPES.thresholds, fragment, new.append)
    c = cluster(2, 2, 2)
    assert nodes.node_fragmentation(c).tolist() == [2000.0] * 3
    assert calls == [slice(None)] and new == [c]
    nodes.node_fragmentation(c)
    assert len(calls) == 1  # nothing changed: nothing recomputed
    c.allocate(Allocation("w", 1, [0], [500], 0, 0))
    assert nodes.node_fragmentation(c).tolist() == [2000.0, 1500.0, 2000.0]
    assert calls[1:] == [[1]] and nodes.gpus.total.tolist() == [2000.0, 1500.0, 2000.0]
    other = cluster(2, 2)
    assert nodes.node_fragmentation(other).tolist() == [2000.0, 2000.0]
    assert calls[2:] == [slice(None)] and new == [c, other]


def test_fgd_fills_a_half_used_gpu_rather_than_breaking_a_whole_one():
    c = cluster(2, 2)
    c.allocate(Allocation("half", 0, [0], [500], 1000, 1024))
    d = scheduler_with(FragmentationGradient(TYPES)).schedule(c, Workload("w", 1000, 1024, 1, 500))
    assert (d.allocation.node, d.allocation.gpus) == (0, [0])


def test_nodes_in_the_same_state_share_one_score_and_it_is_the_definitions():
    """FGD scores each node state once per cycle (a fleet's thousands of empty nodes are one state); every
    candidate still gets what the definition gives for its own node."""
    c = ClusterState([NodeSpec(f"n{i}", 16000, 65536, 4, "V100") for i in range(40)])
    for i in range(0, 40, 3):  # every third node half used on GPU 0, every ninth on GPU 1 too
        c.allocate(Allocation(f"a{i}", i, [0], [500], 1000, 1024))
        if i % 9 == 0:
            c.allocate(Allocation(f"b{i}", i, [1], [810], 1000, 1024))
    types = TaskTypes.from_counts({(1000, 1024, 1, 1000): 3, (2000, 1024, 1, 300): 2, (4000, 4096, 2, 1000): 1,
                                   (8000, 1024, 0, 0): 1})
    fgd = FragmentationGradient(types)
    fgd.node_fragmentation(c)
    ids = fgd._nodes.state_id
    assert len(set(ids.tolist())) == 3 and ids[1] == ids[2] and ids[0] == ids[9] != ids[3]
    for w in (Workload("one", 1000, 1024, 1, 300), Workload("whole", 1000, 1024, 1, 1000),
              Workload("two", 1000, 1024, 2, 1000), Workload("cpu", 1000, 1024, 0)):
        ctx = CycleContext(c, w)
        cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
        _check_delta(fgd, ctx, cand, types)
    c.allocate(Allocation("moved", 1, [2], [1000], 0, 0))  # node 1 leaves its state: its id follows
    fgd.node_fragmentation(c)
    assert fgd._nodes.state_id[1] != fgd._nodes.state_id[2]


def test_candidates_alike_score_exactly_alike_however_their_figures_were_computed():
    """Nodes in the same state whose fragmentation was computed in different batches (all nodes at first, the
    changed ones since) get the same score to the bit: the matrix product's last bits vary with the rows it is
    given, and the 0-100 normalisation made a gap of one rounding error a gap of 100 between candidates."""
    rng = np.random.default_rng(3)
    c = ClusterState([NodeSpec(f"n{i}", 128000, 786432, 8, "V100") for i in range(64)])
    types = TaskTypes.from_counts({(4000, 22888, 1, 320): 5, (1000, 1024, 1, 1000): 3, (2000, 1024, 1, 500): 2,
                                   (8000, 16384, 2, 1000): 1, (6000, 8192, 0, 0): 1, (3000, 4096, 1, 250): 2})
    fgd = FragmentationGradient(types)
    w = Workload("w", 4000, 22888, 1, 320)
    for step in range(40):  # allocations and releases spread over the nodes, each pass recomputing a few rows
        n = int(rng.integers(64))
        c.allocate(Allocation(f"a{step}", n, [int(rng.integers(8))], [250], 2000, 4096))
        if step % 3 == 0:
            c.release(f"a{step}")
        ctx = CycleContext(c, w)
        cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
        scores = fgd.score(ctx, cand)
        state = fgd._nodes.state_id[cand.node] * 1001 + c.gpu_free[cand.node, cand.gpu]
        for key in np.unique(state):
            alike = scores[state == key]
            assert (alike == alike[0]).all(), f"step {step}: {np.unique(alike)}"


def test_a_candidates_score_does_not_depend_on_the_others_scored_with_it():
    """Scored alone or among all candidates, to the bit (the product's rounding varies with the batch)."""
    rng = np.random.default_rng(5)
    c = ClusterState([NodeSpec(f"n{i}", 128000, 786432, 8, "V100") for i in range(48)])
    for k in range(60):
        c.allocate(Allocation(f"a{k}", int(rng.integers(48)), [int(rng.integers(8))], [int(rng.choice([90, 250, 500]))],
                              int(rng.integers(500, 4000)), 4096))
    types = TaskTypes.from_counts({(4000, 22888, 1, 320): 5, (1000, 1024, 1, 1000): 3, (2000, 1024, 1, 500): 2,
                                   (8000, 16384, 2, 1000): 1, (6000, 8192, 0, 0): 1, (3000, 4096, 1, 250): 2,
                                   (1500, 2048, 1, 90): 4, (12000, 65536, 4, 1000): 1})
    fgd = FragmentationGradient(types)
    for w in (Workload("one", 4000, 22888, 1, 320), Workload("two", 8000, 16384, 2, 1000)):
        ctx = CycleContext(c, w)
        cand, _ = Scheduler(Profile("t", [], [])).candidates(ctx)
        together = fgd.delta(ctx, cand)
        for k in range(0, len(cand), 7):
            alone = fgd.delta(ctx, Candidates(cand.node[k:k + 1], cand.gpu[k:k + 1]))
            assert alone[0] == together[k], (w.id, k, alone[0], together[k])


def _groups(keys: np.ndarray) -> tuple[list[int], np.ndarray]:
    first, inverse = _first_of_each(keys)
    return [int(k) for k in keys[first]], inverse


@pytest.mark.parametrize("spread", [3, 1001 * 3000])  # keys packed (a lookup table) and spread (sorting)
def test_first_of_each_names_one_element_per_distinct_key_in_key_order(spread):
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 40, 500) * spread + rng.integers(0, 3, 500)
    distinct, inverse = _groups(keys)
    assert distinct == sorted(set(keys.tolist()))
    assert (np.array(distinct)[inverse] == keys).all()


def test_first_of_each_works_in_memory_of_the_candidates_not_of_the_key_range():
    """Node state ids x 1001 free shares span millions of keys on a cluster of a thousand nodes: a lookup table
    over that range was allocated and filled on every decision (32 MB, most of the bench's scheduling time)."""
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 3000, 6000) * 1001 + rng.integers(0, 1001, 6000)
    tracemalloc.start()
    try:
        _first_of_each(keys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50 * keys.nbytes, peak
