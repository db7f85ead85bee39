"""DecisionSink: a bounded log, each decision published as a SchedulerDecision; a failed publish is not fatal."""

from __future__ import annotations

import logging

from gpuaware.contract.events import DecisionAction, GpuAssignment, SchedulerDecision
from gpuaware.scheduler.core.workload import Workload
from gpuaware.scheduler.kube.decisions import DecisionSink, Outcome


async def test_decision_record_carries_the_outcome_and_the_workload():
    published: list[SchedulerDecision] = []

    async def publish(record: SchedulerDecision) -> None:
        published.append(record)

    w = Workload(id="default/p", tenant="team-a", priority=2, num_gpu=1, gpu_milli=1000, cpu_milli=1000,
                 memory_mib=1024, submit_s=0.0)
    sink = DecisionSink(publish)
    await sink.record(Outcome("default/p", DecisionAction.PLACE, "n0", [f"r{i}" for i in range(10)]), w,
                      [GpuAssignment("GPU-0", 1000, 0)], "exclusive", 0.5, 0.002)
    (r,) = published
    assert (r.workload_id, r.action, r.node, r.tenant, r.sharing, r.score) == (
        "default/p", DecisionAction.PLACE, "n0", "team-a", "exclusive", 0.5)
    assert r.priority == "high" and r.latency_us == 2000 and len(r.reasons) == 8
    assert len(r.decision_id) == 32 and r.ts_ms > 0


async def test_the_log_keeps_the_latest_and_a_failed_publish_only_logs(caplog):
    async def broken(record: SchedulerDecision) -> None:
        raise ConnectionError("broker away")

    sink = DecisionSink(broken, keep=3)
    with caplog.at_level(logging.WARNING):
        for i in range(5):
            await sink.record(Outcome(f"default/p{i}", DecisionAction.UNSCHEDULABLE), None)
    assert [o.key for o in sink.recent] == ["default/p2", "default/p3", "default/p4"]
    assert "could not publish decision for default/p4" in caplog.text


async def test_default_publisher_keeps_only_the_log():
    sink = DecisionSink()
    await sink.record(Outcome("n0/gpu1", DecisionAction.CORDON, "n0"), None)
    assert [o.action for o in sink.recent] == [DecisionAction.CORDON]


async def test_pod_decisions_reach_the_per_pod_view_and_gpu_decisions_do_not():
    heard: list[tuple] = []
    w = Workload(id="default/p", tenant="team-a", priority=2, num_gpu=1, gpu_milli=1000, cpu_milli=1000,
                 memory_mib=1024, submit_s=0.0)
    sink = DecisionSink(on_pod=lambda *a: heard.append(a))
    await sink.record(Outcome("default/p", DecisionAction.PLACE, "n0", ["fits", "second"]), w)
    await sink.record(Outcome("n0/gpu1", DecisionAction.CORDON, "n0", ["gpu-critical"]), None)
    await sink.record(Outcome("default/p", DecisionAction.PREEMPT, "n0"), w)
    assert [a[:4] for a in heard] == [("default/p", "PLACE", "fits", "n0"), ("default/p", "PREEMPT", "", "n0")]
    assert all(a[4] > 0 for a in heard)
