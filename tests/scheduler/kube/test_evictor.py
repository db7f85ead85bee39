"""Evictor: checkpoint first when the pod can, then the Eviction API, retried while a PodDisruptionBudget blocks."""

from __future__ import annotations

import asyncio

from gpuaware.contract import annotations
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.plumbing.kube.api import now_rfc3339
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.settings import SchedulerSettings

FAST = SchedulerSettings(checkpoint_timeout_s=5.0, eviction_retry_s=0.05, eviction_timeout_s=0.3, extender_port=0)


def bound(kube, listed, name: str, ann: dict[str, str] | None = None, labels: dict[str, str] | None = None):
    """A pod bound to n0 and running, as the cache has it after listing."""
    kube.create("nodes", make_node("n0", gpus=2))
    p = make_pod(name, gpus=1, annotations=ann, labels=labels)
    p["spec"]["nodeName"] = "n0"
    p["status"] = {"phase": "Running"}
    kube.create("pods", p)
    cache = listed()
    return cache, cache.pods[f"default/{name}"], cache.running[f"default/{name}"]


def names(kube) -> set[str]:
    return {p["metadata"]["name"] for p in kube.objects("pods")}


def evicted(kube, name: str) -> bool:
    """Eviction of a pod on a node is a graceful delete: it is Terminating (a deletionTimestamp) until the
    kubelet (kwok here) ends it, then gone. The fake API server deleted it at once."""
    pod = next((p for p in kube.objects("pods") if p["metadata"]["name"] == name), None)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


def test_a_pod_is_claimed_once_while_its_eviction_runs(calls, stats, listed):
    evictor = Evictor(calls, listed(), FAST, stats)
    assert evictor.claim("default/a") and evictor.evicting("default/a")
    assert not evictor.claim("default/a")
    assert evictor.claim("default/b")


async def test_plain_pod_is_evicted_with_an_event_and_released(kube, calls, stats, listed, wait_for):
    cache, pod, running = bound(kube, listed, "plain")
    evictor = Evictor(calls, cache, FAST, stats)
    assert evictor.claim("default/plain")
    await evictor.evict(pod, running, "GPU 0 of n0 turned critical", "Migrated")
    assert evicted(kube, "plain")
    await wait_for(lambda: "plain" not in names(kube), what="the kubelet to end the evicted pod")
    await wait_for(lambda: [e for e in kube.objects("events") if e["reason"] == "Migrated"], what="the Event")
    (event,) = [e for e in kube.objects("events") if e["reason"] == "Migrated"]
    assert event["message"] == "GPU 0 of n0 turned critical"
    assert not evictor.evicting("default/plain")


async def test_checkpointable_pod_is_asked_first_and_evicted_once_it_answers(kube, calls, stats, listed, wait_for):
    cache, pod, running = bound(kube, listed, "ckpt", {"gpuaware.io/checkpoint": "true"})
    evictor = Evictor(calls, cache, FAST, stats)
    evictor.claim("default/ckpt")
    task = asyncio.create_task(evictor.evict(pod, running, "preempted", "Preempted"))
    await wait_for(lambda: annotations.ANN_CHECKPOINT_REQUEST in next(
        p for p in kube.objects("pods") if p["metadata"]["name"] == "ckpt")["metadata"]["annotations"],
        what="checkpoint request")
    assert "ckpt" in names(kube)  # not before its answer
    # The answer reaches the evictor through the cache (the pod watch in the scheduler).
    cache.pods["default/ckpt"]["metadata"]["annotations"][annotations.ANN_CHECKPOINT_DONE] = now_rfc3339()
    await asyncio.wait_for(task, 5)
    assert evicted(kube, "ckpt")


async def test_eviction_blocked_by_a_disruption_budget_gives_up_and_the_pod_keeps_its_gpus(kube, calls, stats,
                                                                                          listed, wait_for):
    cache, pod, running = bound(kube, listed, "guarded", labels={"app": "db"})
    kube.create("poddisruptionbudgets", {"metadata": {"name": "db", "namespace": "default"},
                                         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}},
                group="policy", version="v1")
    evictor = Evictor(calls, cache, FAST, stats)
    evictor.claim("default/guarded")
    cache.release("default/guarded")  # as a pass does when it picks a victim
    await evictor.evict(pod, running, "preempted by default/high", "Preempted")
    assert "guarded" in names(kube)
    assert stats.api_errors[("evict", 429)] >= 2  # retried until eviction_timeout_s
    await wait_for(lambda: [e for e in kube.objects("events") if e["reason"] == "EvictionFailed"], what="the Event")
    (failed,) = [e for e in kube.objects("events") if e["reason"] == "EvictionFailed"]
    assert failed["type"] == "Warning" and failed["message"].startswith("preempted by default/high: eviction failed")
    assert "default/guarded" in cache.running  # accounted again
    assert not evictor.evicting("default/guarded")


async def test_a_pod_already_gone_is_nothing_to_evict(kube, calls, stats, listed):
    cache, pod, running = bound(kube, listed, "gone")
    kube.delete("pods", "gone")  # finished meanwhile
    evictor = Evictor(calls, cache, FAST, stats)
    evictor.claim("default/gone")
    await evictor.evict(pod, running, "moved", "Migrated")
    assert not [e for e in kube.objects("events") if e["reason"] == "EvictionFailed"]
    assert ("evict", 404) not in stats.api_errors
