"""UnschedulableReporter: one FailedScheduling Event and UNSCHEDULABLE decision per pod and reason."""

from __future__ import annotations

import asyncio
import time

from gpuaware.contract.events import DecisionAction, SchedulerDecision
from gpuaware.local.fake_apiserver import make_pod
from gpuaware.scheduler.core.status import Code, label_of
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.unschedulable import UnschedulableReporter
from gpuaware.scheduler.metrics import SchedulerStats


class Events:
    """Plays ``ApiCalls`` for the reporter: records the Events it would write."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, str, str]] = []
        self.full = False  # as ApiCalls.event when its lane is full: the Event is dropped

    def event(self, pod, reason: str, message: str, type_: str = "Normal") -> bool:
        if self.full:
            return False
        self.written.append((pod["metadata"]["name"], reason, message, type_))
        return True


def reporter(tasks, pods):
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_pods(pods)
    events, published = Events(), []

    async def publish(record: SchedulerDecision) -> None:
        published.append(record)

    stats = SchedulerStats()
    rep = UnschedulableReporter(events, cache.view(), stats, DecisionSink(publish), tasks)
    return rep, cache, events, published, stats


async def drain(tasks, timeout: float = 5.0) -> None:
    """Until the Events and decisions the reporter spawned are written."""
    deadline = time.monotonic() + timeout
    while len(tasks):
        assert time.monotonic() < deadline, "spawned tasks did not finish"
        await asyncio.sleep(0.01)


async def test_each_reason_is_reported_once_until_it_changes_or_is_forgotten(tasks):
    rep, cache, events, published, stats = reporter(tasks, [make_pod("p", gpus=9)])
    w = cache.pending["default/p"].workload
    rep.unschedulable(w, "no node has 9 free GPUs", "gpus")
    rep.unschedulable(w, "no node has 9 free GPUs", "gpus")
    await drain(tasks)
    assert events.written == [("p", "FailedScheduling", "no node has 9 free GPUs", "Warning")]
    assert [(r.action, r.reasons) for r in published] == [(DecisionAction.UNSCHEDULABLE, ["no node has 9 free GPUs"])]
    rep.unschedulable(w, "GPU health below the threshold on every node", "health")
    rep.forget("default/p")  # placed, then back: a failure is news again
    rep.unschedulable(w, "GPU health below the threshold on every node", "health")
    await drain(tasks)
    assert len(events.written) == 3
    assert stats.decisions[("UNSCHEDULABLE", "health")] == 2


async def test_a_reason_whose_event_was_dropped_is_reported_on_a_later_pass(tasks):
    rep, cache, events, published, stats = reporter(tasks, [make_pod("p", gpus=9)])
    w = cache.pending["default/p"].workload
    events.full = True
    rep.unschedulable(w, "no node has 9 free GPUs", "gpus")
    await drain(tasks)
    assert events.written == [] and published == [] and not stats.decisions
    events.full = False
    rep.unschedulable(w, "no node has 9 free GPUs", "gpus")
    await drain(tasks)
    assert events.written == [("p", "FailedScheduling", "no node has 9 free GPUs", "Warning")]
    assert stats.decisions[("UNSCHEDULABLE", "gpus")] == 1 and len(published) == 1


async def test_a_pod_no_longer_known_is_not_reported(tasks):
    rep, cache, events, published, _ = reporter(tasks, [make_pod("p")])
    w = cache.pending["default/p"].workload
    cache.pods.clear()
    rep.unschedulable(w, "anything", "other")
    await drain(tasks)
    assert events.written == [] and published == []


async def test_invalid_requests_are_reported_once(tasks):
    bad = make_pod("bad", annotations={"gpuaware.io/gpu-milli": "lots"})
    rep, cache, events, _, stats = reporter(tasks, [bad])
    assert "default/bad" in cache.rejected
    rep.report_rejected()
    rep.report_rejected()
    await drain(tasks)
    ((name, reason, message, type_),) = events.written
    assert (name, reason, type_) == ("bad", "FailedScheduling", "Warning")
    assert message.startswith("invalid gpuaware request: ")
    assert stats.decisions[("UNSCHEDULABLE", "invalid-request")] == 1


def test_the_label_comes_from_the_reason_code_not_the_message():
    assert label_of(Code.GANG_INCOMPLETE) == "gang-incomplete"
    assert label_of(Code.INSUFFICIENT_CPU_MEMORY) == "cpu-memory"
    assert label_of(Code.INSUFFICIENT_WHOLE_GPUS) == "gpus"
