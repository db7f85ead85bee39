"""The named policies, and the invariants every one keeps on random clusters (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaware.contract.events import HealthBand
from gpuaware.scheduler.core.cluster import ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.policy_specs import POLICIES
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from tests.support import cluster

MIX = WorkloadMix.of([Workload(f"w{i}", 1000, 1024, 1, 1000) for i in range(3)]
                     + [Workload("half", 1000, 1024, 1, 500), Workload("cpu", 1000, 1024, 0)])


def test_k8s_default_rounds_fractions_up_to_whole_gpus():
    c = cluster(2)
    s = Scheduler(profile("k8s-default", MIX))
    assert s.schedule(c, Workload("a", 0, 0, 1, 300)).allocation.milli == [1000]


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
