"""The scheduler's collector: what each replica exports."""

from __future__ import annotations

from gpuaware.scheduler.metrics import POD_DECISIONS_KEPT, QueueSnapshot, SchedulerCollector, SchedulerStats

POD_DECISION = "gpuaware_scheduler_pod_decision_timestamp_seconds"

SNAPSHOT = QueueSnapshot(pending={("vision", "high"): 3}, oldest_wait_s={("vision", "high"): 40.0},
                         gpus_used={"vision": 6.0}, gpus_quota={"vision": 4.0}, gpus_borrowed={"vision": 2.0},
                         jain=0.9, running=5, stale_gpus=1, cordoned_gpus=2, allocated_gpu_share=0.5,
                         allocated_busy_ratio=0.7)
QUEUE_FAMILIES = {"gpuaware_scheduler_pending_pods", "gpuaware_scheduler_oldest_pending_seconds",
                  "gpuaware_scheduler_tenant_gpus", "gpuaware_scheduler_tenant_quota_gpus",
                  "gpuaware_scheduler_tenant_borrowed_gpus", "gpuaware_scheduler_jain_fairness",
                  "gpuaware_scheduler_allocated_busy_ratio", "gpuaware_scheduler_running_pods",
                  "gpuaware_scheduler_stale_gpus", "gpuaware_scheduler_cordoned_gpus",
                  "gpuaware_scheduler_allocated_gpu_ratio"}


def _families(leader: bool) -> dict[str, list]:
    stats = SchedulerStats(leader=leader)
    return {f.name: f.samples for f in SchedulerCollector(stats, lambda: SNAPSHOT).collect()}


def test_only_the_leader_exports_the_queue_snapshot_so_two_replicas_do_not_double_it() -> None:
    leader, follower = _families(True), _families(False)
    assert leader.keys() >= QUEUE_FAMILIES
    assert not QUEUE_FAMILIES & follower.keys(), sorted(QUEUE_FAMILIES & follower.keys())
    # Both say whether they lead, and keep their own counters.
    assert [s.value for s in leader["gpuaware_scheduler_leader"]] == [1]
    assert [s.value for s in follower["gpuaware_scheduler_leader"]] == [0]
    assert "gpuaware_scheduler_decisions" in follower
    pending = {s.labels["tenant"]: s.value for s in leader["gpuaware_scheduler_pending_pods"]}
    assert pending == {"vision": 3}


def test_each_recent_pods_last_decision_is_one_series_from_the_leader_bounded() -> None:
    stats = SchedulerStats(leader=True)
    stats.pod_decided("vision/a", "UNSCHEDULABLE", "no node has 8 free GPUs", None, 100.0)
    stats.pod_decided("vision/a", "PLACE", "fits " + "x" * 200, "n1", 160.0)  # replaces a's series
    for i in range(POD_DECISIONS_KEPT):
        stats.pod_decided(f"speech/p{i}", "PLACE", "fits", "n2", 200.0 + i)
    samples = {f.name: f.samples for f in SchedulerCollector(stats, lambda: SNAPSHOT).collect()}[POD_DECISION]
    assert len(samples) == POD_DECISIONS_KEPT and samples[0].labels["pod"] == "p0"  # a, the oldest, dropped
    stats.pod_decided("vision/a", "PLACE", "fits " + "x" * 200, "n1", 900.0)
    families = SchedulerCollector(stats, lambda: SNAPSHOT).collect()
    latest = next(f for f in families if f.name == POD_DECISION).samples[-1]
    assert latest.labels == {"namespace": "vision", "pod": "a", "action": "PLACE", "reason": ("fits " + "x" * 75),
                             "node": "n1"} and latest.value == 900.0
    stats.leader = False  # a follower decides nothing: a replica that stopped leading does not double the view
    assert POD_DECISION not in {f.name for f in SchedulerCollector(stats, lambda: SNAPSHOT).collect()}
