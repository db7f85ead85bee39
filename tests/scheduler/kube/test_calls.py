"""ApiCalls: blocking client calls off the loop; failures counted by verb and code; Events best effort."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.plumbing.kube.api import KubeApi, connect
from gpuaware.scheduler.kube.calls import ApiCalls, NotLeading
from gpuaware.scheduler.metrics import SchedulerStats


async def test_call_runs_the_client_and_returns_its_answer(kube, calls):
    kube.create("nodes", make_node("n0", gpus=2))
    node = await calls.call(calls.api.read_node, "n0")
    assert node["metadata"]["name"] == "n0"


async def test_failed_counts_the_api_error_under_its_verb(kube, calls, stats):
    with pytest.raises(ApiException) as err:
        await calls.call(calls.api.read_node, "missing")
    assert calls.failed("read-node", err.value)[0] == 404
    assert stats.api_errors[("read-node", 404)] == 1


async def test_event_is_queued_then_written_and_an_unreachable_api_only_counts(kube, calls, wait_for):
    pod = kube.create("pods", make_pod("p"))
    assert calls.event(pod, "Scheduled", "placed")  # returns at once: a writer task writes it
    await wait_for(lambda: [(e["reason"], e["involvedObject"]["name"]) for e in kube.objects("events")]
                   == [("Scheduled", "p")], what="the Event")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stats = SchedulerStats()
    down = ApiCalls(KubeApi(connect(f"http://127.0.0.1:{port}")), stats, workers=1)
    try:
        assert down.event(pod, "Scheduled", "placed")  # does not raise
        await wait_for(lambda: stats.api_errors[("create-event", 0)] == 1, what="the failed write counted")
    finally:
        down.shutdown()


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


async def test_an_event_goes_out_while_every_api_thread_is_busy(kube, stats, wait_for):
    pod = kube.create("pods", make_pod("p"))
    busy = ApiCalls(kube.api(), stats, workers=1)
    release = threading.Event()
    try:
        held = asyncio.ensure_future(busy.call(release.wait))  # the only API thread, taken (a slow Binding)
        busy.event(pod, "Scheduled", "placed")
        await wait_for(lambda: [e["reason"] for e in kube.objects("events")] == ["Scheduled"], what="the Event")
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


async def test_events_past_the_burst_wait_their_turn_past_the_queue_are_dropped_and_others_go_first(kube, stats,
                                                                                                      wait_for):
    pod = kube.create("pods", make_pod("p"))
    # one token at once, the next in 1,000 s; three Events of a lane may wait
    limited = ApiCalls(kube.api(), stats, workers=1, event_qps=0.001, event_burst=1, event_queue=3)
    try:
        assert [limited.event(pod, "Scheduled", f"placed {i}") for i in range(5)] == [True] * 3 + [False] * 2
        assert stats.events_dropped == {"Scheduled": 2} and stats.events_waiting == 3
        # A Warning has a lane of its own: queued though the Scheduled lane is full, and written first.
        assert limited.event(pod, "FailedScheduling", "no GPU fits", "Warning")
        await wait_for(lambda: [e["reason"] for e in kube.objects("events")] == ["FailedScheduling"],
                       what="the Warning")
        await asyncio.sleep(0.5)
        assert [e["reason"] for e in kube.objects("events")] == ["FailedScheduling"]  # the rest wait for tokens
        assert stats.events_waiting == 2  # "placed 0" holds the writer, waiting for its token
    finally:
        limited.shutdown()


async def test_the_writer_hands_out_the_next_event_without_waiting_for_the_last_write(stats, wait_for):
    class SlowApi:  # every write blocks its thread until released
        event_body = staticmethod(KubeApi.event_body)

        def __init__(self) -> None:
            self.started, self.release = 0, threading.Event()

        def create_event(self, body) -> None:
            self.started += 1
            self.release.wait(30)

    api = SlowApi()
    calls = ApiCalls(api, stats, workers=1, event_workers=1)  # type: ignore[arg-type]
    pod = make_pod("p")
    try:
        for i in range(3):
            assert calls.event(pod, "Scheduled", f"placed {i}")
        # all three handed to the event thread while its first write blocks: a writer that awaited each write
        # took a turn of the loop per Event (and a pass holds the loop for tens of ms during a burst)
        await wait_for(lambda: stats.events_waiting == 0, what="every Event handed out")
        assert api.started == 1
        api.release.set()
        await wait_for(lambda: api.started == 3, what="the other writes")
    finally:
        api.release.set()
        calls.shutdown()
