"""Consolidation moves."""

from __future__ import annotations

from gpuaware.scheduler.core.cluster import Allocation
from tests.support import cluster


def test_consolidation_frees_whole_gpus_without_breaking_others():
    from gpuaware.scheduler.core.rebalance import consolidation_moves

    c = cluster(2, 2)
    c.allocate(Allocation("small", 0, [0], [200], 1000, 1024, sharing="shared"))
    c.allocate(Allocation("big", 1, [0], [700], 1000, 1024, sharing="shared"))
    moves = consolidation_moves(c)
    assert [(m.workload_id, m.to_node, m.to_gpu) for m in moves] == [("small", 1, 0)]
    lone = cluster(2)
    lone.allocate(Allocation("only", 0, [0], [300], 1000, 1024, sharing="shared"))
    assert consolidation_moves(lone) == []  # no shared GPU to move onto: moving would break a whole one
