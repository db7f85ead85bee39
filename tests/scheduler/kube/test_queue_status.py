"""QueueStatusWriter: GPUQueue status from the cache, written only when it changed."""

from __future__ import annotations

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.kube.queue_status import QueueStatusWriter

GROUP = {"group": "gpuaware.io", "version": "v1alpha1"}


def queue(kube) -> dict:
    (q,) = kube.objects("gpuqueues", **GROUP)
    return q


async def test_status_counts_running_pending_and_borrowed_gpus_per_model(kube, listed, calls, stats):
    kube.create("nodes", make_node("n0", gpus=4, product="NVIDIA-H100-80GB-HBM3"))
    kube.create("gpuqueues", {"metadata": {"name": "vision"}, "spec": {
        "tenant": "vision", "namespaces": ["vision-train"], "weight": 1, "quota": [{"model": "*", "gpus": 1}]}},
        **GROUP)
    for name, gpus in (("a", 2), ("b", 1)):
        p = make_pod(name, namespace="vision-train", gpus=gpus)
        p["spec"]["nodeName"] = "n0"
        kube.create("pods", p)
    kube.create("pods", make_pod("waiting", namespace="vision-train", gpus=8))
    writer = QueueStatusWriter(calls, listed().view(), stats)
    await writer.write()
    status = queue(kube)["status"]
    assert {k: status[k] for k in ("admitted", "running", "pending", "borrowedGpus")} == {
        "admitted": 2, "running": 2, "pending": 1, "borrowedGpus": 2.0}
    assert [q["gpus"] for q in status["quotaUsed"]] == [3.0]
    assert status["observedGeneration"] == 1


async def test_an_unchanged_status_is_not_written_again(kube, listed, calls, stats):
    kube.create("nodes", make_node("n0", gpus=1))
    kube.create("gpuqueues", {"metadata": {"name": "q"}, "spec": {"tenant": "t", "namespaces": ["t"], "weight": 1,
                                                                  "quota": [{"model": "*", "gpus": 1}]}}, **GROUP)
    writer = QueueStatusWriter(calls, listed().view(), stats)
    await writer.write()
    version = queue(kube)["metadata"]["resourceVersion"]
    await writer.write()
    assert queue(kube)["metadata"]["resourceVersion"] == version


async def test_a_refused_write_is_counted_and_tried_again(kube, listed, calls, stats):
    kube.create("gpuqueues", {"metadata": {"name": "q"}, "spec": {"tenant": "t", "namespaces": ["t"], "weight": 1,
                                                                  "quota": [{"model": "*", "gpus": 1}]}}, **GROUP)
    cache = listed()
    kube.delete("gpuqueues", "q", None, "gpuaware.io", "v1alpha1")  # gone before the write
    writer = QueueStatusWriter(calls, cache.view(), stats)
    await writer.write()
    assert stats.api_errors[("patch-queue-status", 404)] == 1 and writer.sent == {}
