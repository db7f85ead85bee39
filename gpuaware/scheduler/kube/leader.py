"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Three rules make two leaders impossible without trusting any other replica's clock:

- Expiry is judged by when THIS replica saw the Lease last change (its own monotonic clock),
  never by the holder's ``renewTime``: a follower takes the Lease only once it has seen the same
  record (resourceVersion and spec) for a whole lease duration. Wall clocks may be skewed by any
  amount; only clock rates have to agree, to within lease duration / renew deadline.
- Every write carries the resourceVersion it read: of two replicas racing, one gets 409 Conflict.
- A leader leads only until the renew deadline after the start of its last successful renewal.
  Renewals are tried every retry period under a timeout that ends at that deadline, whatever the
  failure (an error answer, a broken connection, a call that never returns), and ``is_leader()``
  reads the clock, so it turns False at the deadline even before the loop notices. A follower sees
  a renewal only after it started, so the leader has stopped at least lease - renew deadline
  before any follower may take over.

Nothing ends the loop but ``stop`` or cancellation: each failed try is counted in ``errors`` and
tried again. ``on_started_leading`` / ``on_stopped_leading`` run on the event loop, in pairs, the
latter as soon as the loop sees the loss; a process should exit then (kube-scheduler:
``klog.Fatalf("leaderelection lost")``) rather than go on with work it started as leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, KubeApi, api_error
from gpuaware.scheduler.settings import LEASE_JITTER, check_lease_timings

log = logging.getLogger(__name__)


class LeadershipLost(RuntimeError):
    """What a process raises once its replica lost the Lease: it exits non-zero and restarts as a follower."""


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _version(lease: dict[str, Any]) -> tuple[Any, Any]:
    return lease["metadata"].get("resourceVersion"), lease.get("spec")


class LeaderElector:
    """One replica's side of the election for the Lease ``namespace/name``; ``run`` it as a task.

    ``clock`` is monotonic and must advance with the event loop's clock (tests shift its origin);
    ``wall_clock`` only stamps renewTime/acquireTime for people reading the Lease."""

    def __init__(self, api: KubeApi, namespace: str, name: str, identity: str, lease_duration_s: float = 15.0,
                 renew_deadline_s: float = 10.0, retry_period_s: float = 2.0, *,
                 on_started_leading: Callable[[], None] | None = None,
                 on_stopped_leading: Callable[[], None] | None = None, release_on_cancel: bool = False,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        check_lease_timings(lease_duration_s, renew_deadline_s, retry_period_s)
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_duration_s, self.renew_deadline_s = lease_duration_s, renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started_leading, self.on_stopped_leading = on_started_leading, on_stopped_leading
        # Only safe when everything done as leader has finished by the time ``run`` returns.
        self.release_on_cancel = release_on_cancel
        self.clock, self.wall_clock = clock, wall_clock
        self.leading = asyncio.Event()
        self.lost = False  # leadership ended other than by ``stop`` or cancellation
        self.transitions = 0  # times this replica started leading
        self.errors: Counter[str] = Counter()  # failed tries (and callbacks) by cause
        self._lease: dict[str, Any] | None = None  # the Lease as last read or written
        self._observed_at = -math.inf  # when it was seen to change, on ``clock``
        self._renewed_at = -math.inf  # start of the last successful acquire or renew
        self._pool: ThreadPoolExecutor | None = None

    @property
    def holder(self) -> str | None:
        """The holder in the Lease as last seen (None: nobody)."""
        return ((self._lease or {}).get("spec") or {}).get("holderIdentity") or None

    def is_leader(self) -> bool:
        """Leading, and the renew deadline has not passed since the last successful renewal.

        Callable from any thread: what a binder or evictor checks right before each write."""
        return self.leading.is_set() and self.clock() < self._renewed_at + self.renew_deadline_s

    # ------------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        """Acquire, lead and renew until ``stop`` or cancellation; raises nothing else."""
        # Calls that hang must not take threads from anyone else: a pool of our own, abandoned on exit.
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"lease-{self.name}")
        try:
            while not stop.is_set():
                if await self._acquire(stop):
                    self._started()
                    stopped = await self._renew(stop)
                    self._stopped(lost=not stopped)
        finally:
            if self.leading.is_set():  # cancelled while leading
                self._stopped(lost=False)
            try:
                if self.release_on_cancel:
                    await self._release()
            finally:
                self._pool.shutdown(wait=False, cancel_futures=True)

    async def _acquire(self, stop: asyncio.Event) -> bool:
        """Try every retry period (jittered, so followers spread out) until it works; False on ``stop``."""
        while not stop.is_set():
            if await self._attempt(self.renew_deadline_s):
                return True
            if await self._wait(stop, self.retry_period_s * random.uniform(1.0, LEASE_JITTER)):
                return False
        return False

    async def _renew(self, stop: asyncio.Event) -> bool:
        """Renew a retry period after each success until ``stop`` (True); False once leadership is lost:
        the renew deadline passed without a successful renewal, or another holder was seen."""
        while True:
            if await self._wait(stop, self._renewed_at + self.retry_period_s - self.clock()):
                return True
            deadline = self._renewed_at + self.renew_deadline_s
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    log.error("lease %s/%s: not renewed within %.1fs", self.namespace, self.name,
                              self.renew_deadline_s)
                    return False
                if await self._attempt(remaining):
                    break
                if self.holder not in (None, self.identity):
                    log.error("lease %s/%s: now held by %s", self.namespace, self.name, self.holder)
                    return False
                if await self._wait(stop, min(self.retry_period_s, deadline - self.clock())):
                    return True

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds`` unless ``stop`` comes first; whether it came."""
        if seconds > 0 and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)
        return stop.is_set()

    async def _attempt(self, timeout: float) -> bool:
        """One try, abandoned after ``timeout``; whatever goes wrong is counted and logged, never raised."""
        started = self.clock()
        try:
            return await asyncio.wait_for(self._try_acquire_or_renew(started), timeout)
        except TimeoutError:  # ours, or the client's socket timeout
            cause, detail = "timeout", f"no answer within {timeout:.1f}s"
        except ApiException as exc:
            code, reason, message = api_error(exc)
            cause, detail = f"api {code}", f"{code} {reason}: {message}"
        except TRANSPORT_ERRORS as exc:
            cause, detail = "transport", repr(exc)
        except Exception as exc:
            log.exception("lease %s/%s: unexpected error", self.namespace, self.name)
            cause, detail = "unexpected", repr(exc)
        self.errors[cause] += 1
        log.warning("lease %s/%s: %s", self.namespace, self.name, detail)
        return False

    # ------------------------------------------------------------------ one try
    async def _try_acquire_or_renew(self, started: float) -> bool:
        lease = await self._call(self.api.read_lease, self.namespace, self.name)
        now = _micro(self.wall_clock())
        if lease is None:
            return await self._write(started, self.api.create_lease, self.namespace, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(now, now, 0)})
        if self._lease is None or _version(lease) != _version(self._lease):
            self._lease, self._observed_at = lease, self.clock()
        spec = lease.get("spec") or {}
        mine = spec.get("holderIdentity") == self.identity
        if spec.get("holderIdentity") and not mine and self._observed_valid():
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        acquired = (spec.get("acquireTime") or now) if mine else now
        return await self._write(started, self.api.replace_lease, self.namespace, self.name, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
            "spec": self._spec(now, acquired, transitions)})

    def _observed_valid(self) -> bool:
        """The holder seen may still be acting: a lease duration has not passed, on this replica's clock,
        since the record last changed (the longer of its duration and ours: ours may be sub-second)."""
        spec = (self._lease or {}).get("spec") or {}
        duration = max(float(spec.get("leaseDurationSeconds") or 0), self.lease_duration_s)
        return self.clock() < self._observed_at + duration

    def _spec(self, now: str, acquired: str, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, math.ceil(self.lease_duration_s)),
                "acquireTime": acquired, "renewTime": now, "leaseTransitions": transitions}

    async def _write(self, started: float, fn: Callable[..., dict[str, Any]], *args: Any) -> bool:
        try:
            lease = await self._call(fn, *args)
        except ApiException as exc:
            if exc.status == 409:  # written by another replica since we read it: it won
                self.errors["conflict"] += 1
                return False
            raise
        # Dated from before the read: whoever sees this record sees it later than that.
        self._lease, self._observed_at, self._renewed_at = lease, started, started
        return True

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._pool is not None
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------------ transitions
    def _started(self) -> None:
        self.transitions += 1
        self.leading.set()
        log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
        self._callback(self.on_started_leading)

    def _stopped(self, lost: bool) -> None:
        self.leading.clear()
        if lost:
            self.lost = True
            log.error("leaderelection lost: %s no longer holds %s/%s", self.identity, self.namespace, self.name)
        else:
            log.info("stopped leading (lease %s/%s)", self.namespace, self.name)
        self._callback(self.on_stopped_leading)

    def _callback(self, fn: Callable[[], None] | None) -> None:
        if fn is None:
            return
        try:
            fn()
        except Exception:
            self.errors["callback"] += 1
            log.exception("lease %s/%s: leadership callback failed", self.namespace, self.name)

    async def _release(self) -> None:
        """Clear the holder (resourceVersion-guarded) so that a follower takes over on its next try."""
        lease = self._lease
        if lease is None or self.holder != self.identity:
            return
        now = _micro(self.wall_clock())
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
                "spec": {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1,
                         "acquireTime": now, "renewTime": now}}
        try:
            self._lease = await asyncio.wait_for(
                self._call(self.api.replace_lease, self.namespace, self.name, body), self.renew_deadline_s)
            log.info("released the lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # it lapses on its own
            self.errors["release"] += 1
            log.warning("lease %s/%s: could not release: %r", self.namespace, self.name, exc)
