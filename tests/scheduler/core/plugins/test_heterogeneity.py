"""Heterogeneity affinity, and interference awareness, from Gavel's throughputs."""

from __future__ import annotations

import json

import numpy as np

from gpuaware.scheduler.core.cluster import Allocation, ClusterState, NodeSpec
from gpuaware.scheduler.core.framework import Candidates, CycleContext
from gpuaware.scheduler.core.workload import Workload
from tests.support import GAVEL, cluster, scheduler_with


def test_heterogeneity_prefers_the_faster_model_and_interference_the_quieter_gpu():
    from gpuaware.scheduler.core.plugins.heterogeneity import HeterogeneityAffinity
    from gpuaware.scheduler.core.plugins.interference import InterferenceAware
    from gpuaware.scheduler.core.throughput import ThroughputTable

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
