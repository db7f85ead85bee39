"""What the workload mix tells the plugins: typical shapes, CPU per GPU, constrained demand."""

from __future__ import annotations

import pytest

from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.core.workload_mix import WorkloadMix


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
