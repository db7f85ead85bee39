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

from gpuaware.plumbing.kube.api import KubeApi, api_error
from gpuaware.plumbing.kube.ratelimit import TokenBucket
from gpuaware.scheduler.kube import objects
from gpuaware.scheduler.metrics import SchedulerStats

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
        self._writer: asyncio.Task | None = None
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

    async def call(self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None,
                   checked: bool = True) -> T:
        """``fn(*args)`` on an API thread; ``checked``: refused (``NotLeading``) once this replica may no longer
        act. A caller making several writes in one ``fn`` checks before each itself (``checked=False``)."""
        if checked and not self.may_act():
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
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_events(), name="kube-events")
        self._queued.set()
        return True

    async def _write_events(self) -> None:
        """The writer: the urgent lane first, a token each, the writes handed to the event threads without
        waiting for them. Waiting for each write took a turn of the loop per Event, and during a burst a pass
        holds the loop for tens of ms: Events went out at ~25 a second whatever the limit."""
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Future] = set()
        while True:
            if not (self._urgent or self._scheduled):
                self._queued.clear()
                await self._queued.wait()
                continue
            if len(in_flight) >= 4 * self._event_workers:  # the threads are behind: no unbounded queue of writes
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            body = (self._urgent or self._scheduled).popleft()
            self.stats.events_waiting -= 1
            if self._event_bucket is not None and (wait := self._event_bucket.reserve()) > 0:
                await asyncio.sleep(wait)  # a late wake finds the tokens saved meanwhile: those go out at once
            if not self.may_act():  # another replica may be acting: it writes its own Events
                self.stats.events_dropped[body["reason"]] += 1
                continue
            write = loop.run_in_executor(self._events, self.events_api.create_event, body)
            in_flight.add(write)
            write.add_done_callback(functools.partial(self._written, in_flight, body))

    def _written(self, in_flight: set[asyncio.Future], body: dict[str, Any], write: asyncio.Future) -> None:
        """On the loop, once a write ended: count what failed (best effort: never retried)."""
        in_flight.discard(write)
        if write.cancelled():
            return
        exc = write.exception()
        if exc is None:
            return
        obj = body["involvedObject"]
        if isinstance(exc, ApiException):
            self.failed("create-event", exc)
        else:
            self.stats.api_errors[("create-event", 0)] += 1
            log.warning("event %s on %s/%s not written: %r", body["reason"], obj["namespace"], obj["name"], exc)

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._events.shutdown(wait=False, cancel_futures=True)
