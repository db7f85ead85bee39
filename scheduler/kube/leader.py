"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

A replica leads while it holds the Lease: it takes a Lease that does not exist or whose holder
has not renewed within ``leaseDurationSeconds``, and renews it every ``renew_every_s``. Every write
carries the resourceVersion it read, so two replicas racing for the same Lease cannot both win
(the loser gets 409 Conflict). A leader that cannot renew before its lease would lapse stops
leading at once, before anyone else can take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from plumbing.kube.api import KubeApi, api_error

log = logging.getLogger(__name__)


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(ts: str | None) -> float:
    if not ts:
        return 0.0
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class LeaderElector:
    def __init__(self, api: KubeApi, namespace: str, name: str, identity: str, lease_duration_s: float = 15.0,
                 renew_every_s: float = 5.0, clock: Callable[[], float] = time.time):
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_duration_s, self.renew_every_s, self.clock = lease_duration_s, renew_every_s, clock
        self.leading = asyncio.Event()
        self.transitions = 0
        self._renewed_at = 0.0

    def _spec(self, now: float, acquired: float, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration_s),
                "acquireTime": _micro(acquired), "renewTime": _micro(now), "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> bool:
        """One round (blocking API calls); True while this replica holds the Lease."""
        now = self.clock()
        try:
            lease = self.api.read_lease(self.namespace, self.name)
            if lease is None:
                self.api.create_lease(self.namespace, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0)})
                self._renewed_at = now
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            expires = _parse(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
            if holder != self.identity and holder and now < expires:
                return False
            mine = holder == self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
            acquired = _parse(spec.get("acquireTime")) if mine else now
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": lease["metadata"],
                    "spec": self._spec(now, acquired, transitions)}
            self.api.replace_lease(self.namespace, self.name, body)
            self._renewed_at = now
            return True
        except ApiException as exc:
            code, reason, message = api_error(exc)
            if code in (409, 422):  # another replica wrote first
                return False
            log.warning("lease %s/%s: %s %s: %s", self.namespace, self.name, code, reason, message)
            # Keep leading only while the last renewal is still inside the lease.
            return self.leading.is_set() and now - self._renewed_at < self.lease_duration_s * 2 / 3

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            held = await asyncio.to_thread(self.try_acquire_or_renew)
            if held and not self.leading.is_set():
                self.transitions += 1
                log.info("leading as %s (lease %s/%s)", self.identity, self.namespace, self.name)
                self.leading.set()
            elif not held and self.leading.is_set():
                log.warning("lost the lease %s/%s: stopping scheduling", self.namespace, self.name)
                self.leading.clear()
            wait = self.renew_every_s if held else min(self.renew_every_s, self.lease_duration_s / 4)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
