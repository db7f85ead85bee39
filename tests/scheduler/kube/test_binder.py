"""Binder: one Binding carrying the GPUs, a Scheduled Event and a PLACE decision; failures release or requeue."""

from __future__ import annotations

import asyncio
import json
import time

from gpuaware.contract import annotations
from gpuaware.contract.events import DecisionAction, HealthBand, NodeGpu, NodeState, SchedulerDecision
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.scheduler.core.cluster import Allocation
from gpuaware.scheduler.core.framework import Decision
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.core.status import Code, Reason
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube.binder import Binder
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.departures import Departures
from gpuaware.scheduler.settings import SchedulerSettings

SETTINGS = SchedulerSettings(checkpoint_timeout_s=0.0, eviction_timeout_s=0.3, extender_port=0)


class Recorder:
    def __init__(self) -> None:
        self.bound: list[str] = []
        self.wakes = 0
        self.published: list[SchedulerDecision] = []

    def on_bound(self, key: str) -> None:
        self.bound.append(key)

    def wake(self) -> None:
        self.wakes += 1

    async def publish(self, record: SchedulerDecision) -> None:
        self.published.append(record)


def setup(kube, listed, calls, stats, view=None):
    kube.create("nodes", make_node("n0", gpus=2))
    kube.create("pods", make_pod("p", gpus=1))
    cache = listed()
    rec = Recorder()
    binder = Binder(calls, cache, SETTINGS, stats, DecisionSink(rec.publish), Departures(), view,
                    on_bound=rec.on_bound, wake=rec.wake)
    w = cache.pending["default/p"].workload
    alloc = Allocation(w.id, 0, [1], [1000], w.cpu_milli, w.memory_mib)
    cache.pending.pop(w.id)
    cache.assume(w.id, Running(w, alloc, time.time(), 0.0, None))
    return cache, binder, rec, Decision(w, alloc, [Reason(Code.SCHEDULED, "test", "fits")], 1.0, 0.001)


def pod(kube, name="p"):
    return next(p for p in kube.objects("pods") if p["metadata"]["name"] == name)


async def test_bind_writes_node_gpus_and_sharing_in_one_binding_then_event_and_decision(kube, listed, calls, stats,
                                                                                         wait_for):
    view = StateView()
    view.learn(NodeState("n0", int(time.time() * 1000), None, None,
                         [NodeGpu(f"GPU-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(2)], 2000, 0))
    cache, binder, rec, d = setup(kube, listed, calls, stats, view)
    await binder.bind(d.workload, d, [])
    p = pod(kube)
    assert p["spec"]["nodeName"] == "n0"
    assert json.loads(p["metadata"]["annotations"][annotations.ANN_GPUS]) == [
        {"index": 1, "uuid": "GPU-1", "milli": 1000}]
    assert p["metadata"]["annotations"][annotations.ANN_SHARING] == "exclusive"
    await wait_for(lambda: [e for e in kube.objects("events") if e["reason"] == "Scheduled"], what="the Event")
    (event,) = [e for e in kube.objects("events") if e["reason"] == "Scheduled"]
    assert event["involvedObject"]["name"] == "p" and "GPUs 1:1000m" in event["message"]
    (record,) = rec.published
    assert record.action == DecisionAction.PLACE and record.node == "n0"
    assert [a.gpu_uuid for a in record.assignments] == ["GPU-1"]
    assert rec.bound == ["default/p"] and rec.wakes == 0
    assert stats.decisions[("PLACE", "fits")] == 1 and stats.bind_latency.count == 1
    assert "default/p" in cache.running  # the reservation stands until the pod's watch event says bound


async def test_bound_elsewhere_keeps_the_apis_answer_and_releases_the_reservation(kube, listed, calls, stats):
    cache, binder, rec, d = setup(kube, listed, calls, stats)
    kube.api().bind("default", "p", "n0")  # e.g. by this scheduler before a restart
    await binder.bind(d.workload, d, [])
    assert stats.api_errors[("bind", 409)] == 1
    assert "default/p" not in cache.running and "default/p" not in cache.assumed
    assert "default/p" not in cache.pending  # not requeued: the API's answer stands
    assert rec.wakes == 1 and rec.bound == [] and rec.published == []


async def test_victims_not_gone_in_time_withdraw_the_placement_and_requeue_the_pod(kube, listed, calls, stats):
    kube.create("pods", make_pod("victim", gpus=1))
    cache, binder, rec, d = setup(kube, listed, calls, stats)
    await binder.bind(d.workload, d, ["default/victim"])  # the victim never leaves
    assert pod(kube)["spec"].get("nodeName") is None
    assert "default/p" in cache.pending and "default/p" not in cache.running
    assert rec.wakes == 1 and rec.published == []


async def test_bind_waits_for_its_victims_to_be_gone(kube, listed, calls, stats, wait_for):
    kube.create("pods", make_pod("victim", gpus=1))
    _cache, binder, _rec, d = setup(kube, listed, calls, stats)
    binder.departures.expect("default/victim")
    asked: list[str] = []
    call = calls.call

    async def recorded(fn, *args, **kwargs):
        asked.append(fn.__name__)
        return await call(fn, *args, **kwargs)

    calls.call = recorded
    task = asyncio.create_task(binder.bind(d.workload, d, ["default/victim"]))
    # One turn of the loop runs the task up to its first suspension. A binder that did not wait for the
    # victim would have asked for the Binding by then; no time has to pass for this check to mean it.
    await asyncio.sleep(0)
    assert not task.done() and asked == [] and pod(kube)["spec"].get("nodeName") is None
    binder.departures.left("default/victim")  # the pod watch saw it go
    await asyncio.wait_for(task, 5)
    assert pod(kube)["spec"]["nodeName"] == "n0"
    assert stats.decisions[("PLACE", "preempted")] == 1


async def test_a_pod_recreated_under_its_name_is_not_bound_to_the_old_pods_gpus(kube, listed, calls, stats):
    cache, binder, rec, d = setup(kube, listed, calls, stats)
    old_uid = pod(kube)["metadata"]["uid"]
    kube.delete("pods", "p")
    kube.create("pods", make_pod("p", gpus=1))  # same name, new UID
    await binder.bind(d.workload, d, [], old_uid)
    assert not pod(kube)["spec"].get("nodeName")  # the new pod stays pending for its own decision
    assert stats.decisions[("DROP", "pod-replaced")] == 1 and not stats.api_errors
    assert "default/p" not in cache.running and rec.bound == []


async def test_a_preemptor_waiting_for_its_victims_holds_no_bind_slot(kube, listed, calls, stats):
    kube.create("nodes", make_node("n0", gpus=2))
    kube.create("pods", make_pod("victim", gpus=1))
    kube.create("pods", make_pod("pre", gpus=1))
    kube.create("pods", make_pod("other", gpus=1))
    cache = listed()
    rec = Recorder()
    one_slot = SchedulerSettings(checkpoint_timeout_s=30.0, eviction_timeout_s=30.0, extender_port=0, bind_workers=1)
    binder = Binder(calls, cache, one_slot, stats, DecisionSink(rec.publish), Departures(), None,
                    on_bound=rec.on_bound, wake=rec.wake)

    def decided(name: str, gpu: int) -> Decision:
        w = cache.pending[f"default/{name}"].workload
        alloc = Allocation(w.id, 0, [gpu], [1000], w.cpu_milli, w.memory_mib)
        cache.pending.pop(w.id)
        cache.assume(w.id, Running(w, alloc, time.time(), 0.0, None))
        return Decision(w, alloc, [Reason(Code.SCHEDULED, "test", "fits")], 1.0, 0.001)

    pre, other = decided("pre", 0), decided("other", 1)
    waiting = asyncio.create_task(binder.bind(pre.workload, pre, ["default/victim"]))
    try:
        # The preemptor waits (its victim is still there) while an unrelated pod binds through the only slot.
        await asyncio.wait_for(binder.bind(other.workload, other, []), 5)
        assert rec.bound == ["default/other"] and not waiting.done()
    finally:
        waiting.cancel()


async def test_a_bind_the_apiserver_refuses_withdraws_the_placement_once_and_requeues_the_pod(kube, listed, stats):
    """A non-409 refusal (here 403: an identity without pods/binding) went through two clean-ups, the error
    branch's and requeue's, each withdrawing the placement."""
    from gpuaware.scheduler.kube.calls import ApiCalls

    forbidden = ApiCalls(kube.api("gpuaware-stream"), stats, workers=1)
    try:
        cache, binder, rec, d = setup(kube, listed, forbidden, stats)
        forgotten: list[str] = []
        real = cache.forget

        def counted(key: str) -> None:
            forgotten.append(key)
            real(key)

        cache.forget = counted
        await binder.bind(d.workload, d, [])
    finally:
        forbidden.shutdown()
    assert stats.api_errors[("bind", 403)] == 1
    assert forgotten == ["default/p"]
    assert "default/p" in cache.pending and "default/p" not in cache.running and rec.wakes == 1
