"""A placement's devices written to its ResourceClaims, before the Binding (what kube-scheduler's
DynamicResources plugin does in PreBind).

Each claim first gets the delete-protection finalizer kube-scheduler puts on the claims it allocates (a
metadata PUT, as kube-scheduler does: the status subresource ignores metadata), so a claim deleted while
its pod runs keeps its allocation, and its devices stay taken, until it is deallocated. Then it gets
``status.allocation`` (the devices, and a node selector for the node) and
``status.reservedFor`` the pod, in one PUT of the status subresource with the claim's
resourceVersion as the precondition. A 409 Conflict (the claim changed since it was read) reads it
again and tries again, up to ``CONFLICT_RETRIES`` times, as kube-scheduler's PreBind does (client-go's
``RetryOnConflict``): a claim someone else allocated meanwhile is refused, and the placement is
withdrawn and the pod requeued — never a device handed out twice. A claim already allocated for this
very pod alone (written before a restart or a lost answer) is left as it is. Claims already written
for a placement that fails are released again, allocation first, then the finalizer this placement
added (best effort: a claim left allocated is charged as a hold, so its devices stay taken, as they
are in the API).

A pod whose claims are allocated already (shared) only joins their ``reservedFor`` (``share``), with the
same precondition and retries, while they are allocated on its node; a placement of it that fails takes
only its own reservation back (the strategic merge patch kube-scheduler's Unreserve sends), never the
allocation the other pods hold.

The writes are blocking calls made on one of the API threads (``ApiCalls``), one after the other, with no
turn of the event loop between them: a pass holds the loop for tens of milliseconds, and a claim's
finalizer, its status and the pod's Binding each waiting for the loop made every placement wait that
long per write. Each public method is one hop onto an API thread (``*_now``: already on one; the binder
makes the claims' writes and the Binding in a single hop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, api_error
from gpuaware.scheduler.kube.calls import ApiCalls, NotLeading
from gpuaware.scheduler.kube.dra.claims import (
    DeviceRequest,
    allocated_nodes,
    allocation_status,
    released_status,
    reserved_status,
    with_finalizer,
)
from gpuaware.scheduler.kube.dra.inventory import Device

log = logging.getLogger(__name__)

# client-go's retry.DefaultRetry (5 steps), which kube-scheduler's PreBind retries a claim's status write with.
CONFLICT_RETRIES = 5


class ClaimsRefused(Exception):
    """The apiserver did not take a claim's allocation: ``conflict`` when it changed since it was read;
    ``lasting`` when the answer will not change by asking again (403 Forbidden, 422 Invalid, ...)."""

    def __init__(self, message: str, conflict: bool, lasting: bool = False):
        super().__init__(message)
        self.conflict, self.lasting = conflict, lasting


@dataclass
class Written:
    """Claims a placement wrote: allocated by it (``uid`` None), or joined by the pod ``uid`` (shared)."""

    claims: list[dict[str, Any]] = field(default_factory=list)
    uid: str | None = None


Write = Callable[[dict[str, Any]], dict[str, Any] | None]


class ClaimWriter:
    def __init__(self, calls: ApiCalls):
        self.calls = calls

    async def allocate(self, claims: dict[str, dict[str, Any]], node: str,
                       picks: list[tuple[DeviceRequest, Device]], pod: dict[str, Any]) -> Written:
        """Write every claim of the placement; the claims as written, or ``ClaimsRefused`` (none left written)."""
        return await self.calls.call(self.allocate_now, claims, node, picks, pod, checked=False)

    def allocate_now(self, claims: dict[str, dict[str, Any]], node: str,
                     picks: list[tuple[DeviceRequest, Device]], pod: dict[str, Any]) -> Written:
        """``allocate`` on an API thread."""
        written, uid = Written(), pod["metadata"].get("uid")
        for key in sorted({r.claim for r, _ in picks}):
            protected: list[dict[str, Any]] = []  # the claim as the finalizer write left it, if this placement added it

            def one(claim: dict[str, Any], key: str = key,
                    protected: list[dict[str, Any]] = protected) -> dict[str, Any] | None:
                if claim["metadata"].get("deletionTimestamp"):
                    raise ClaimsRefused(f"ResourceClaim {key} is being deleted", conflict=True)
                status = claim.get("status") or {}
                if status.get("allocation"):
                    if [r.get("uid") for r in status.get("reservedFor") or []] == [uid] \
                            and allocated_nodes(status["allocation"]) == {node}:
                        return None  # this pod's own, written before (a restart, a lost answer): as it is
                    raise ClaimsRefused(f"ResourceClaim {key} got allocated elsewhere in the meantime", conflict=True)
                guard = with_finalizer(claim, True)
                if guard is not None:
                    claim = self._call("update-claim", self.calls.api.update_claim, guard)
                    protected[:] = [claim]
                return self._call("update-claim-status", self.calls.api.write_claim_status,
                                  allocation_status(claim, node, picks, pod))

            try:
                done = self._retrying(key, claims.get(key), one)
            except (ApiException, *TRANSPORT_ERRORS, ClaimsRefused) as exc:
                self.release_now(written)
                if protected:
                    self._unprotect(protected[-1])
                raise _refused(key, exc) from exc
            if done is not None:
                written.claims.append(done)
        return written

    async def share(self, claims: dict[str, dict[str, Any]], keys: list[str], node: str,
                    pod: dict[str, Any]) -> Written:
        """The pod joins ``reservedFor`` of its claims, allocated already on ``node`` (shared); ``ClaimsRefused``
        as ``allocate`` (a claim deallocated, or allocated elsewhere, since it was read: the pod is read again)."""
        return await self.calls.call(self.share_now, claims, keys, node, pod, checked=False)

    def share_now(self, claims: dict[str, dict[str, Any]], keys: list[str], node: str,
                  pod: dict[str, Any]) -> Written:
        """``share`` on an API thread."""
        written = Written(uid=pod["metadata"]["uid"])
        for key in sorted(keys):
            def one(claim: dict[str, Any], key: str = key) -> dict[str, Any] | None:
                alloc = (claim.get("status") or {}).get("allocation")
                if claim["metadata"].get("deletionTimestamp") or not alloc or allocated_nodes(alloc) != {node}:
                    raise ClaimsRefused(f"ResourceClaim {key} is no longer allocated on {node}", conflict=True)
                body = reserved_status(claim, pod)
                return None if body is None else self._call("update-claim-status",
                                                            self.calls.api.write_claim_status, body)

            try:
                done = self._retrying(key, claims.get(key), one)
            except (ApiException, *TRANSPORT_ERRORS, ClaimsRefused) as exc:
                self.release_now(written)
                raise _refused(key, exc) from exc
            if done is not None:
                written.claims.append(done)
        return written

    def _retrying(self, key: str, claim: dict[str, Any] | None, one: Write) -> dict[str, Any] | None:
        """``one(claim)``; on 409 Conflict the claim is read again and ``one`` tried again."""
        for attempt in range(CONFLICT_RETRIES):
            if claim is None:
                raise ClaimsRefused(f"ResourceClaim {key} is gone", conflict=True)
            try:
                return one(claim)
            except ApiException as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
            namespace, name = key.split("/", 1)
            try:
                claim = self._call("get-claim", self.calls.api.read_claim, namespace, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                claim = None
        raise AssertionError("unreachable")

    def _call(self, verb: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One API call on this API thread, its failure counted under ``verb``; none once this replica may no
        longer act (checked before every write, as ``ApiCalls.call`` does)."""
        if not self.calls.may_act():
            raise NotLeading()
        try:
            return fn(*args)
        except ApiException as exc:
            self.calls.failed(verb, exc)
            raise
        except TRANSPORT_ERRORS:
            self.calls.stats.api_errors[(verb, 0)] += 1
            raise

    def _unprotect(self, claim: dict[str, Any]) -> None:
        """Take the finalizer off a claim that is not allocated (what kube-controller-manager does once it
        deallocates); a claim left with it is only slower to delete."""
        body = with_finalizer(claim, False)
        if body is None:
            return
        try:
            self._call("update-claim", self.calls.api.update_claim, body)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            log.warning("ResourceClaim %s/%s keeps its finalizer (%s)", claim["metadata"].get("namespace"),
                        claim["metadata"]["name"], _said(exc))

    async def release(self, written: Written | None) -> None:
        """Take back what a placement wrote (its Binding failed, or a later claim was refused): allocations it
        wrote, then the delete-protection finalizer; of claims it joined, only its pod's reservation. A claim
        it allocated that changed since (409) is read again: still reserved for its pod alone, it is released;
        joined by another pod meanwhile, only the reservation goes."""
        if written is not None and written.claims:
            await self.calls.call(self.release_now, written, checked=False)

    def release_now(self, written: Written | None) -> None:
        """``release`` on an API thread."""
        for claim in written.claims if written is not None else []:
            meta = claim["metadata"]
            try:
                if written.uid is not None:
                    self._unreserve(meta, written.uid)
                    continue
                ours = [r.get("uid") for r in (claim.get("status") or {}).get("reservedFor") or []]

                def one(now: dict[str, Any], ours: list[str | None] = ours) -> dict[str, Any] | None:
                    status = now.get("status") or {}
                    if not status.get("allocation"):
                        return None  # deallocated already
                    if [r.get("uid") for r in status.get("reservedFor") or []] != ours:
                        self._unreserve(now["metadata"], str(ours[0]))
                        return None
                    released = self._call("update-claim-status", self.calls.api.write_claim_status,
                                          released_status(now))
                    self._unprotect(released)
                    return released

                self._retrying(f"{meta['namespace']}/{meta['name']}", claim, one)
            except (ApiException, *TRANSPORT_ERRORS, ClaimsRefused) as exc:
                log.warning("ResourceClaim %s/%s stays as written (%s); its devices stay taken",
                            meta.get("namespace"), meta["name"], _said(exc))

    async def deallocate(self, claims: list[dict[str, Any]], uid: str) -> None:
        """kube-scheduler's DRA PostFilter: claims allocated on a node their pod (``uid``) cannot go to, and
        reserved for nobody or for that pod alone, are deallocated so that it can go elsewhere; a claim another
        pod uses meanwhile is left as it is. Best effort: the pod waits, and is asked again, until it is done."""
        await self.calls.call(self._deallocate_now, claims, uid, checked=False)

    def _deallocate_now(self, claims: list[dict[str, Any]], uid: str) -> None:
        for claim in claims:
            meta = claim["metadata"]

            def one(now: dict[str, Any]) -> dict[str, Any] | None:
                status = now.get("status") or {}
                if not status.get("allocation") or {r.get("uid") for r in status.get("reservedFor") or []} - {uid}:
                    return None
                released = self._call("update-claim-status", self.calls.api.write_claim_status,
                                      released_status(now))
                self._unprotect(released)
                return released

            try:
                self._retrying(f"{meta['namespace']}/{meta['name']}", claim, one)
            except (ApiException, *TRANSPORT_ERRORS, ClaimsRefused) as exc:
                log.warning("ResourceClaim %s/%s not deallocated (%s)", meta.get("namespace"), meta["name"],
                            _said(exc))

    def _unreserve(self, meta: dict[str, Any], pod_uid: str) -> None:
        self._call("patch-claim-status", self.calls.api.unreserve_claim, meta["namespace"], meta["name"],
                         meta["uid"], pod_uid)


def _said(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        code, reason, message = api_error(exc)
        return f"{code} {reason}: {message}"
    return str(exc)


def _refused(key: str, exc: Exception) -> ClaimsRefused:
    """The placement's claims not written, as the binder acts on it (the call's failure is counted already)."""
    if isinstance(exc, ClaimsRefused):
        return exc
    if isinstance(exc, ApiException):
        code, reason, message = api_error(exc)
        return ClaimsRefused(f"ResourceClaim {key}: {code} {reason}: {message}", conflict=code == 409,
                             lasting=400 <= code < 500 and code not in (409, 429))
    return ClaimsRefused(f"ResourceClaim {key}: {exc}", conflict=False)
