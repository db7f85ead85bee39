"""The fragmentation experiment on a slice of the real openb cluster."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.sim.fragmentation import run_fragmentation
from scheduler.sim.openb import load_nodes, load_pods
from tests.support import OPENB_PODS as PODS


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
