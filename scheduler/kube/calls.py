"""Calls to the Kubernetes API from the event loop: threads of their own, failures counted, Events best effort."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from plumbing.kube.api import TRANSPORT_ERRORS, KubeApi, api_error
from plumbing.kube.ratelimit import TokenBucket
from scheduler.kube import objects
from scheduler.metrics import SchedulerStats

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEDULED = "Scheduled"  # the Event of every placement: thousands in a burst, the lane that may wait and drop


class NotLeading(ApiException):
    """A write refused here because this replica may no longer act (its Lease's renew deadline passed)."""

    def __init__(self) -> None:
        super().__init__(status=503, reason="not leading")


def _always() -> bool:
    return True


class ApiCalls:
    def __init__(self, api: KubeApi, stats: SchedulerStats, workers: int, may_act: Callable[[], bool] = _always,
                 event_workers: int = 2, *, events_api: KubeApi | None = None, event_qps: float = 0.0,
                 event_burst: int = 100, event_queue: int = 5000):
        """Events go to ``events_api`` (default: ``api``), at most ``event_qps`` a second after a burst of
        ``event_burst`` (0: no limit), with at most ``event_queue`` waiting for their turn."""
        self.api, self.stats = api, stats
        # Checked before every call, not only between passes: a bind or eviction already queued when the
        # Lease is lost must not reach the API once another replica may be acting (client-go's renew deadline).
        self.may_act = may_act
        # The official client is synchronous: its calls block, so they run on threads of their own.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        # Events have threads of their own: under a burst they queue behind each other, never in front of
        # a Binding (kube-scheduler's event broadcaster is likewise asynchronous to its binding cycle).
        self._events = ThreadPoolExecutor(max_workers=event_workers, thread_name_prefix="kube-events")
        self._workers, self._event_workers = workers, event_workers
        # kube-scheduler writes its Events through a client of their own, limited by its clientConnection qps.
        # Unlimited, a burst's Events took the apiserver's CPU from its Bindings: one write each, as many.
        self.events_api = events_api or api
        self._event_bucket = TokenBucket(event_qps, event_burst) if event_qps > 0 else None
        self._event_queue = event_queue
        # Two lanes, each up to ``event_queue``: the rest (FailedScheduling, evictions, GPU health) is written
        # first, so it neither waits nor drops behind a burst's Scheduled Events.
        self._urgent: deque[dict[str, Any]] = deque()
        self._scheduled: deque[dict[str, Any]] = deque()
        self._queued = asyncio.Event()
        self._writers: list[asyncio.Task] = []
        self._dropped_said_at = float("-inf")

    def start_threads(self) -> None:
        """Start every API thread now (blocks until they run). The executor starts a thread per call until it has
        them all, on the calling thread, the event loop: a first pass's burst of Bindings would wait for them."""
        for pool, n in ((self._pool, self._workers), (self._events, self._event_workers)):
            hold = threading.Event()
            started = [pool.submit(hold.wait) for _ in range(n)]  # each holds its thread: the next needs a new one
            hold.set()
            for f in started:
                f.result()

    async def call(self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None) -> T:
        if not self.may_act():
            raise NotLeading()
        return await asyncio.get_running_loop().run_in_executor(pool or self._pool, functools.partial(fn, *args))

    def failed(self, verb: str, exc: ApiException) -> tuple[int, str, str]:
        """Count an API error under its verb and status code; (code, reason, message)."""
        code, reason, message = api_error(exc)
        self.stats.api_errors[(verb, code)] += 1
        return code, reason, message

    def event(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> bool:
        """Queue an Event about ``obj``, stamped now, and return at once (as client-go's ``Eventf``): the writers
        write it in its turn under the event rate limit. False: dropped, ``event_queue`` of its lane waiting.

        Best effort, as in kube-scheduler: a failed write is counted, never retried. Call it on the event loop."""
        lane = self._scheduled if reason == SCHEDULED else self._urgent
        if len(lane) >= self._event_queue:
            self.stats.events_dropped[reason] += 1
            now = time.monotonic()
            if now - self._dropped_said_at > 60:  # one line a minute, not one per Event of a burst
                self._dropped_said_at = now
                log.warning("%d Events waiting to be written: %s %s on %s dropped (%d so far)", self._event_queue,
                            reason, type_, objects.key(obj), sum(self.stats.events_dropped.values()))
            return False
        lane.append(self.events_api.event_body(obj, reason, message, type_))
        self.stats.events_waiting += 1
        if not self._writers:
            loop = asyncio.get_running_loop()
            self._writers = [loop.create_task(self._write_events(), name=f"kube-events-{i}")
                             for i in range(self._event_workers)]
        self._queued.set()
        return True

    async def _write_events(self) -> None:
        """One of ``event_workers`` writers: the urgent lane first, a token each, then the write."""
        while True:
            if not (self._urgent or self._scheduled):
                self._queued.clear()
                await self._queued.wait()
                continue
            body = (self._urgent or self._scheduled).popleft()
            self.stats.events_waiting -= 1
            if self._event_bucket is not None:
                await asyncio.sleep(self._event_bucket.reserve())
            obj = body["involvedObject"]
            try:
                await self.call(self.events_api.create_event, body, pool=self._events)
            except NotLeading:  # another replica may be acting: it writes its own Events
                self.stats.events_dropped[body["reason"]] += 1
            except ApiException as exc:
                self.failed("create-event", exc)
            except TRANSPORT_ERRORS as exc:
                self.stats.api_errors[("create-event", 0)] += 1
                log.warning("event %s on %s/%s not written: %s", body["reason"], obj["namespace"], obj["name"], exc)
            except Exception:  # the writer outlives any one Event
                self.stats.api_errors[("create-event", 0)] += 1
                log.exception("event %s on %s/%s not written", body["reason"], obj["namespace"], obj["name"])

    def shutdown(self) -> None:
        for writer in self._writers:
            writer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._events.shutdown(wait=False, cancel_futures=True)
