"""Fingerprint co-location: interfering classes apart (Gavel pairs), idle holders packed."""

from __future__ import annotations

import json

from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.framework import Profile, Scheduler
from gpuaware.scheduler.core.plugins.colocation import (
    COMPUTE,
    MEMORY,
    FingerprintColocation,
    class_speeds,
    fingerprint_of,
)
from gpuaware.scheduler.core.throughput import ThroughputTable
from gpuaware.scheduler.core.workload import Workload
from tests.support import cluster

# Two measured pairs: ResNet-50 with itself slows both to 0.5; ResNet-50 with an LM barely (0.9).
GAVEL = {"v100": {
    "('ResNet-50 (batch size 64)', 1)": {"null": 10.0, "('ResNet-50 (batch size 64)', 1)": [5.0, 5.0],
                                        "('LM (batch size 20)', 1)": [9.0, 9.0]},
    "('LM (batch size 20)', 1)": {"null": 10.0, "('ResNet-50 (batch size 64)', 1)": [9.0, 9.0]}}}


def _table():
    return ThroughputTable.from_gavel(json.loads(json.dumps(GAVEL)))


def test_class_speeds_come_from_the_gavel_pairs():
    speeds = class_speeds(_table())
    assert speeds[(COMPUTE, COMPUTE)] == 0.5 and speeds[(COMPUTE, MEMORY)] == 0.9
    assert fingerprint_of("Transformer (batch size 32)") == MEMORY and fingerprint_of("unknown") is None


def _shared(classes):
    c = cluster(3)
    for g, cls in enumerate(classes):
        c.allocate(Allocation(f"r{g}", 0, [g], [500], 0, 0, [], "shared"))
        c.fingerprint[0, g] = cls
    return c


def _place(c, w):
    p = FingerprintColocation(_table())
    return Scheduler(Profile("t", [], [(p, 1.0)])).schedule(c, w)


def test_a_compute_bound_job_goes_beside_the_idle_holder_then_the_memory_bound_one():
    w = Workload("w", 0, 0, 1, 300, labels={"gavel_class": "ResNet-50 (batch size 32)"})
    c = _shared([COMPUTE, MEMORY, "idle-holding-gpu"])
    c.live[:] = True
    d = _place(c, w)
    assert d.allocation.gpus == [2] and d.signals == ["fingerprint"]
    c = _shared([COMPUTE, MEMORY, COMPUTE])
    c.live[:] = True
    assert _place(c, w).allocation.gpus == [1]


def test_without_fingerprints_every_gpu_scores_the_same():
    c = _shared([COMPUTE, MEMORY, "idle-holding-gpu"])  # not live
    p = FingerprintColocation(_table())
    from gpuaware.scheduler.core.framework import Candidates, CycleContext

    ctx = CycleContext(c, Workload("w", 0, 0, 1, 300, labels={"gavel_class": "ResNet-50 (batch size 32)"}))
    s = p.score(ctx, Candidates(c.gpu_exists.nonzero()[0], c.gpu_exists.nonzero()[1]))
    assert len(set(s.tolist())) == 1 and ctx.signals == set()
