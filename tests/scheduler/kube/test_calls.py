"""ApiCalls: blocking client calls off the loop; failures counted by verb and code; Events best effort."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from gpuaware.local.fake_apiserver import make_node, make_pod
from plumbing.kube.api import KubeApi, connect
from scheduler.kube.calls import ApiCalls, NotLeading
from scheduler.metrics import SchedulerStats


async def test_call_runs_the_client_and_returns_its_answer(kube, calls):
    kube.create("nodes", make_node("n0", gpus=2))
    node = await calls.call(calls.api.read_node, "n0")
    assert node["metadata"]["name"] == "n0"


async def test_failed_counts_the_api_error_under_its_verb(kube, calls, stats):
    with pytest.raises(ApiException) as err:
        await calls.call(calls.api.read_node, "missing")
    assert calls.failed("read-node", err.value)[0] == 404
    assert stats.api_errors[("read-node", 404)] == 1


async def test_event_is_written_and_an_unreachable_api_only_counts(kube, calls):
    pod = kube.create("pods", make_pod("p"))
    await calls.event(pod, "Scheduled", "placed")
    assert [(e["reason"], e["involvedObject"]["name"]) for e in kube.objects("events")] == [("Scheduled", "p")]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stats = SchedulerStats()
    down = ApiCalls(KubeApi(connect(f"http://127.0.0.1:{port}")), stats, workers=1)
    try:
        await down.event(pod, "Scheduled", "placed")  # does not raise
    finally:
        down.shutdown()
    assert stats.api_errors[("create-event", 0)] == 1


async def test_no_call_reaches_the_api_once_the_replica_may_no_longer_act(kube, stats):
    kube.create("nodes", make_node("n0", gpus=2))
    kube.create("pods", make_pod("p"))
    leading = [True]
    gated = ApiCalls(kube.api(), stats, workers=1, may_act=lambda: leading[0])
    try:
        assert (await gated.call(gated.api.read_node, "n0"))["metadata"]["name"] == "n0"
        leading[0] = False  # the Lease's renew deadline passed: a bind queued before must not go out
        with pytest.raises(NotLeading):
            await gated.call(gated.api.bind, "default", "p", "n0", {})
        assert not [p for p in kube.objects("pods") if p["spec"].get("nodeName")]
    finally:
        gated.shutdown()


async def test_an_event_goes_out_while_every_api_thread_is_busy(kube, stats):
    pod = kube.create("pods", make_pod("p"))
    busy = ApiCalls(kube.api(), stats, workers=1)
    release = threading.Event()
    try:
        held = asyncio.ensure_future(busy.call(release.wait))  # the only API thread, taken (a slow Binding)
        await asyncio.wait_for(busy.event(pod, "Scheduled", "placed"), 30)  # would wait for the thread
        assert [e["reason"] for e in kube.objects("events")] == ["Scheduled"]
        assert not held.done()
    finally:
        release.set()
        busy.shutdown()


def test_start_threads_starts_every_api_thread_before_the_first_call(kube, stats):
    calls = ApiCalls(kube.api(), stats, workers=5, event_workers=2)
    try:
        assert len(calls._pool._threads) == len(calls._events._threads) == 0  # the executor starts them lazily
        calls.start_threads()
        assert len(calls._pool._threads) == 5 and len(calls._events._threads) == 2
        assert all(t.is_alive() for t in calls._pool._threads)
    finally:
        calls.shutdown()


async def test_events_past_the_burst_wait_their_turn_and_past_the_queue_are_dropped_and_counted(kube, stats,
                                                                                                  wait_for):
    pod = kube.create("pods", make_pod("p"))
    # one at once, then one per 4 s; three may be in the recorder: of five Events at once, two are dropped
    limited = ApiCalls(kube.api(), stats, workers=1, event_qps=0.25, event_burst=1, event_queue=3)
    try:
        writes = [asyncio.ensure_future(limited.event(pod, "Scheduled", f"placed {i}")) for i in range(5)]
        await wait_for(lambda: kube.objects("events"), what="the first Event")
        assert [e["message"] for e in kube.objects("events")] == ["placed 0"]  # the others wait for tokens
        assert stats.events_dropped == 2 and stats.events_waiting == 2
        await asyncio.wait_for(asyncio.gather(*writes), 60)
        assert sorted(e["message"] for e in kube.objects("events")) == ["placed 0", "placed 1", "placed 2"]
        assert stats.events_waiting == 0
    finally:
        limited.shutdown()
