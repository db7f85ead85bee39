"""The throughput table from Gavel's measurements, and its online learning."""

from __future__ import annotations

import json

from tests.support import GAVEL


def test_gavel_table_orders_gpus_and_learns_online():
    from gpuaware.scheduler.core.throughput import ThroughputTable

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
