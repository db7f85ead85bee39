"""GPUQueue limits that hold (issue 17, item 2): per-model quota, borrowing on/off and its limit, the policy
for namespaces in no queue, and non-preemptibility granted only by the queue. The core's ledger alone, then
the live scheduler on the real apiserver, as its shipped ServiceAccount."""

from __future__ import annotations

import pytest

from gpuaware.local.fake_apiserver import make_node, make_pod
from scheduler.core.queue import Tenant, TenantLedger
from scheduler.core.workload import PriorityLevel, Workload
from scheduler.kube.cache import Queue
from scheduler.kube.objects import PodSpecError, workload_of
from scheduler.kube.queues import govern, tenant_of
from tests.support import FAST, events, pods, running, wait_for

GQ = {"group": "gpuaware.io", "version": "v1alpha1"}


def _queue(**spec) -> Queue:
    return Queue.of({"metadata": {"name": "q", "creationTimestamp": "2026-01-01T00:00:00Z"},
                     "spec": {"tenant": "t", "namespaces": ["ns"], **spec}})


def test_the_ledger_holds_borrowing_and_per_model_quota():
    w = Workload("w", num_gpu=1, gpu_milli=1000, tenant="t")
    no_borrow = TenantLedger({"t": tenant_of(_queue(quota=[{"model": "*", "gpus": 2}], borrowing={"enabled": False}))},
                             8000, 1 << 20, {"t": 2000})
    assert not no_borrow.admits(w)
    limited = TenantLedger({"t": tenant_of(_queue(quota=[{"model": "*", "gpus": 2}], borrowing={"limitGpus": 1}))},
                           8000, 1 << 20, {"t": 2000})
    assert limited.admits(w)
    limited.charge(w)
    assert not limited.admits(w)
    by_model = TenantLedger({"t": tenant_of(_queue(quota=[{"model": "H100", "gpus": 1}, {"model": "*", "gpus": 1}],
                                                   borrowing={"enabled": False}))}, 8000, 1 << 20)
    by_model.charge(w, model="H100")
    assert by_model.models_full(w, ["A100", "H100"]) == {"H100"}
    by_model.charge(w, model="A100")
    assert by_model.models_full(w, ["A100", "H100"]) == {"A100", "H100"}
    # Defaults limit nothing: the simulator's tenants behave as before.
    assert TenantLedger({"t": Tenant("t", 1.0, 1000)}, 8000, 1 << 20, {"t": 7000}).admits(w)


def test_unqueued_work_is_all_borrowed_and_reclaimable():
    ledger = TenantLedger({"unqueued": Tenant("unqueued", unqueued=True)}, 8000, 1 << 20, {"unqueued": 3000})
    assert ledger.over_quota("unqueued") == 3000
    assert not ledger.within_quota(Workload("w", num_gpu=1, tenant="unqueued"))


def _pw(priority: int = 0, annotations: dict | None = None, cls: str | None = None, namespace: str = "ns"):
    pod = make_pod("p", namespace=namespace, priority=priority, annotations=annotations)
    if cls:
        pod["spec"]["priorityClassName"] = cls
    return pod, workload_of(pod, "t", 0.0)


def test_only_the_queue_grants_non_preemptibility():
    q = _queue(priorityClasses=["high", "normal"])
    pod, pw = _pw(annotations={"gpuaware.io/preemptible": "false"}, cls="normal")  # low priority opting out
    assert govern(pw, pod, q, "best-effort").workload.preemptible is True
    pod, pw = _pw(priority=200_000, cls="high")
    assert govern(pw, pod, q, "best-effort").workload.preemptible is False
    pod, pw = _pw(priority=200_000, cls="high", annotations={"gpuaware.io/preemptible": "true"})  # volunteers
    assert govern(pw, pod, q, "best-effort").workload.preemptible is True
    pod, pw = _pw(priority=1_000_000, cls="cluster-critical")  # any class >= 100000 used to get the top level
    with pytest.raises(PodSpecError, match="priority class 'cluster-critical' is not one GPUQueue q allows"):
        govern(pw, pod, q, "best-effort")


def test_the_policy_for_namespaces_in_no_queue():
    pod, pw = _pw(priority=200_000, annotations={"gpuaware.io/preemptible": "false"})
    best = govern(pw, pod, None, "best-effort").workload
    assert (best.tenant, best.priority, best.preemptible) == ("unqueued", PriorityLevel.MEDIUM, True)
    allowed = govern(pw, pod, None, "allow").workload
    assert (allowed.priority, allowed.preemptible) == (PriorityLevel.HIGH, False)
    with pytest.raises(PodSpecError, match="in no GPUQueue"):
        govern(pw, pod, None, "reject")


async def test_the_live_scheduler_holds_a_queue_to_its_model_quota_without_borrowing(kube):
    kube.create("nodes", make_node("h", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    kube.create("nodes", make_node("a", gpus=4, product="NVIDIA-A100-SXM4-80GB"))
    kube.create("gpuqueues", {"metadata": {"name": "vision"}, "spec": {
        "tenant": "vision", "namespaces": ["vision"], "borrowing": {"enabled": False},
        "quota": [{"model": "H100", "gpus": 1}, {"model": "*", "gpus": 1}]}}, **GQ)
    for i in range(3):
        kube.create("pods", make_pod(f"p{i}", namespace="vision", gpus=1))
    async with running(kube, FAST):
        await wait_for(lambda: sum(1 for p in pods(kube).values() if p["spec"].get("nodeName")) == 2,
                       what="two placed")
        await wait_for(lambda: any("quota" in e["message"] for e in events(kube, "FailedScheduling")),
                       what="the third refused for quota")
        placed = sorted(p["spec"]["nodeName"] for p in pods(kube).values() if p["spec"].get("nodeName"))
        assert placed == ["a", "h"]  # one per model quota, never two on the H100s


async def test_the_live_scheduler_rejects_namespaces_in_no_queue_when_told_to(kube):
    kube.create("nodes", make_node("n", gpus=2))
    kube.create("pods", make_pod("stray", namespace="nowhere", gpus=1))
    async with running(kube, FAST.model_copy(update={"unqueued": "reject"})) as live:
        await wait_for(lambda: "nowhere/stray" in live.cache.rejected, what="rejected")
        assert "in no GPUQueue" in live.cache.rejected["nowhere/stray"].reason
        assert not pods(kube)["stray"]["spec"].get("nodeName")


async def test_a_gang_is_held_to_its_queue_quota_as_a_whole(kube):
    kube.create("nodes", make_node("n", gpus=8))
    kube.create("gpuqueues", {"metadata": {"name": "nlp"}, "spec": {
        "tenant": "nlp", "namespaces": ["nlp"], "borrowing": {"enabled": True, "limitGpus": 1},
        "quota": [{"model": "*", "gpus": 2}]}}, **GQ)
    gang = {"gpuaware.io/gang": "train", "gpuaware.io/gang-size": "2"}
    for i in range(2):  # 4 GPUs: over 2 + 1
        kube.create("pods", make_pod(f"g{i}", namespace="nlp", gpus=2, annotations=gang))
    async with running(kube, FAST):
        await wait_for(lambda: any("quota" in e["message"] for e in events(kube, "FailedScheduling")),
                       what="the gang refused for quota")
        assert not any(p["spec"].get("nodeName") for p in pods(kube).values())
