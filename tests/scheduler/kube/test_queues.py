"""GPUQueue limits that hold (issue 17, item 2): per-model quota, borrowing on/off and its limit, the policy
for namespaces in no queue, and non-preemptibility granted only by the queue. The core's ledger alone, then
the live scheduler on the real apiserver, as its shipped ServiceAccount."""

from __future__ import annotations

import re

import pytest

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.core.queue import Tenant, TenantLedger
from gpuaware.scheduler.core.workload import PriorityLevel, Workload
from gpuaware.scheduler.kube.objects import PodSpecError, workload_of
from gpuaware.scheduler.kube.queues import Queue, QueueSpecError, govern, tenant_of
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


def test_gpu_memory_caps_count_fractions_by_their_memory_and_whole_gpus_by_all_of_theirs():
    """memoryGiB caps the GPU memory a queue holds per model: a fraction counts what it asked for (else its
    share of the GPU), a whole GPU all of its memory; borrowing does not extend the cap."""
    q = _queue(quota=[{"model": "H100", "gpus": 4, "memoryGiB": 100}, {"model": "*", "gpus": 4}])
    assert q.memory_by_model == (("H100", 100.0),)
    ledger = TenantLedger({"t": tenant_of(q)}, 64000, 1 << 20, gpu_mem_by_model={"H100": 81920, "A100": 40960})
    whole = Workload("whole", num_gpu=1, tenant="t")
    frac = Workload("frac", num_gpu=1, gpu_milli=250, gpu_memory_mib=10240, tenant="t")
    share = Workload("share", num_gpu=1, gpu_milli=300, tenant="t")  # no memory asked: 30 % of the GPU's
    assert [ledger.gpu_memory_mib(w, "H100") for w in (whole, frac, share)] == [81920, 10240, 24576]
    ledger.charge(whole, model="H100")  # 80 of 100 GiB
    assert ledger.models_full(frac, ["A100", "H100"]) == set()  # 90: fits
    assert ledger.models_full(share, ["A100", "H100"]) == {"H100"}  # 104: over the cap, the A100s uncapped
    assert ledger.models_full(whole, ["A100", "H100"]) == {"H100"}
    ledger.charge(frac, model="H100")
    ledger.charge(whole, model="A100")  # no cap on A100 memory, and it does not count against H100's
    assert ledger.model_mem_used == {("t", "H100"): 81920 + 10240}
    ledger.charge(whole, -1, model="H100")  # released: room again
    assert ledger.models_full(share, ["H100"]) == set()


def test_a_gang_is_masked_from_models_its_whole_demand_does_not_fit():
    q = _queue(quota=[{"model": "H100", "gpus": 2}, {"model": "A100", "gpus": 8, "memoryGiB": 120}],
               borrowing={"enabled": False})
    ledger = TenantLedger({"t": tenant_of(q)}, 64000, 1 << 20, gpu_mem_by_model={"H100": 81920, "A100": 40960})
    gang = [Workload(f"g{i}", num_gpu=1, tenant="t", gang="ns/g") for i in range(3)]
    # One member fits either model; the gang of three not the H100s (3 > 2) but the A100s (3 x 40 = 120 GiB).
    assert ledger.models_full(gang[0], ["A100", "H100"]) == set()
    assert ledger.models_full(gang[0], ["A100", "H100"], gang) == {"H100"}
    four = [*gang, Workload("g3", num_gpu=1, tenant="t", gang="ns/g")]
    assert ledger.models_full(four[0], ["A100", "H100"], four) == {"A100", "H100"}  # 160 GiB > 120


@pytest.mark.parametrize(("quota", "borrowing", "message"), [
    ([{"model": "H100", "gpus": 1, "memoryGiB": -5}], {}, "spec.quota[0].memoryGiB: -5 is not a non-negative number"),
    ([{"model": "H100", "gpus": 1, "memoryGiB": "80Gi"}], {}, "spec.quota[0].memoryGiB: '80Gi' is not a non-negative"),
    ([{"model": "H100", "gpus": 1, "memoryGiB": 0}], {}, "spec.quota[0].memoryGiB: 0 would refuse every pod"),
    ([{"model": "H100", "gpus": True}], {}, "spec.quota[0].gpus: True is not a non-negative number"),
    ([], {"limitGpus": float("nan")}, "spec.borrowing.limitGpus: nan is not a non-negative number"),
])
def test_a_queue_with_bad_quota_values_is_ignored_naming_the_field(quota, borrowing, message):
    with pytest.raises(QueueSpecError, match=r"GPUQueue 'q' is ignored: ValueError: " + re.escape(message)):
        _queue(quota=quota, borrowing=borrowing)


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


async def test_a_gang_lands_only_on_a_model_whose_quota_and_memory_cap_it_fits_as_a_whole(kube):
    """Per-model quota masks apply to a gang as a whole: two 1-GPU members with one H100 of quota left and
    the A100s' memory cap room for both go to the A100s, together."""
    kube.create("nodes", make_node("h", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    kube.create("nodes", make_node("a", gpus=4, product="NVIDIA-A100-SXM4-80GB"))
    kube.create("gpuqueues", {"metadata": {"name": "nlp"}, "spec": {
        "tenant": "nlp", "namespaces": ["nlp"], "borrowing": {"enabled": False},
        "quota": [{"model": "H100", "gpus": 1}, {"model": "A100", "gpus": 4, "memoryGiB": 160}]}}, **GQ)
    gang = {"gpuaware.io/gang": "train", "gpuaware.io/gang-size": "2"}
    for i in range(2):
        kube.create("pods", make_pod(f"g{i}", namespace="nlp", gpus=1, annotations=gang))
    async with running(kube, FAST):
        await wait_for(lambda: sum(1 for p in pods(kube).values() if p["spec"].get("nodeName")) == 2,
                       what="the gang placed")
        assert {p["spec"]["nodeName"] for p in pods(kube).values()} == {"a"}


async def test_the_live_scheduler_holds_fractional_pods_to_the_queues_gpu_memory_cap(kube):
    """Three quarter-GPU pods of 12 GiB each under a 30 GiB cap on H100 memory: two placed, the third refused
    for quota though the H100s have compute, memory and GPU quota to spare."""
    kube.create("nodes", make_node("h", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    kube.create("gpuqueues", {"metadata": {"name": "serve"}, "spec": {
        "tenant": "serve", "namespaces": ["serve"], "borrowing": {"enabled": False},
        "quota": [{"model": "H100", "gpus": 4, "memoryGiB": 30}]}}, **GQ)
    frac = {"gpuaware.io/gpu-milli": "250", "gpuaware.io/gpu-memory-mib": "12288"}
    for i in range(3):
        kube.create("pods", make_pod(f"f{i}", namespace="serve", gpus=1, annotations=frac))
    async with running(kube, FAST):
        await wait_for(lambda: sum(1 for p in pods(kube).values() if p["spec"].get("nodeName")) == 2,
                       what="two placed")
        await wait_for(lambda: any("GPU memory" in e["message"] for e in events(kube, "FailedScheduling")),
                       what="the third refused for the memory cap")
        assert sum(1 for p in pods(kube).values() if p["spec"].get("nodeName")) == 2


# ------------------------------------------------------------------ Kueue's queue-name label (issue 45, item 4)
def _named(name: str, namespaces: list[str], created: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"tenant": name, "namespaces": namespaces}}


def test_kueues_queue_name_label_picks_a_gpuqueue_of_that_name_that_lists_the_namespace():
    from gpuaware.scheduler.kube.queues import KUEUE_QUEUE_LABEL, Tenancy

    tenancy = Tenancy()
    assert tenancy.sync([_named("a", ["team"], "2026-01-01T00:00:00Z"), _named("c", ["other"], "2026-01-01T00:00:00Z")])
    # A queue that changes no namespace's owner still changes what a label picks: the pods are read again.
    assert tenancy.event("ADDED", _named("b", ["team"], "2026-01-02T00:00:00Z"))

    def pod(label: str | None, namespace: str = "team") -> dict:
        return make_pod("p", namespace=namespace, labels={KUEUE_QUEUE_LABEL: label} if label else {})

    assert [tenancy.tenant_of(pod(x)) for x in (None, "b", "a", "nope", "c")] == ["a", "b", "a", "a", "a"]
    assert tenancy.queue_of(pod("b")).name == "b" and tenancy.queue_of(pod("c")).name == "a"
    assert tenancy.tenant_of(pod("c", namespace="other")) == "c"


async def test_the_live_scheduler_charges_a_kueue_labelled_pod_to_the_gpuqueue_it_names(kube):
    """Namespace team is in GPUQueues a (older: its own, no quota) and b (2 GPUs): only the pod labelled
    ``kueue.x-k8s.io/queue-name: b`` gets a GPU; one labelled with a queue that does not list team, or none, is
    charged to a and refused for quota."""
    from gpuaware.scheduler.kube.queues import KUEUE_QUEUE_LABEL

    kube.create("nodes", make_node("n", gpus=4))
    for name, gpus in (("a", 0), ("b", 2), ("c", 4)):
        kube.create("gpuqueues", {"metadata": {"name": name}, "spec": {
            "tenant": name, "namespaces": ["elsewhere"] if name == "c" else ["team"],
            "borrowing": {"enabled": False}, "quota": [{"model": "*", "gpus": gpus}]}}, **GQ)
    for name, label in (("by-b", "b"), ("by-c", "c"), ("plain", None), ("unknown", "nope")):
        kube.create("pods", make_pod(name, namespace="team", gpus=1,
                                     labels={KUEUE_QUEUE_LABEL: label} if label else {}))
    async with running(kube, FAST) as live:
        await wait_for(lambda: pods(kube)["by-b"]["spec"].get("nodeName"), what="the pod labelled b placed")
        await wait_for(lambda: {e["involvedObject"]["name"] for e in events(kube, "FailedScheduling")}
                       >= {"by-c", "plain", "unknown"}, what="the others refused")
        assert [n for n, p in pods(kube).items() if p["spec"].get("nodeName")] == ["by-b"]
        assert live.cache.running["team/by-b"].workload.tenant == "b"
