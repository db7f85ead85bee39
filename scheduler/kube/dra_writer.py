"""A placement's devices written to its ResourceClaims, before the Binding (what kube-scheduler's
DynamicResources plugin does in PreBind).

Each claim first gets the delete-protection finalizer kube-scheduler puts on the claims it allocates (a
metadata PUT, as kube-scheduler does: the status subresource ignores metadata), so a claim deleted while
its pod runs keeps its allocation, and its devices stay taken, until it is deallocated. Then it gets
``status.allocation`` (the devices, and a node selector for the node) and
``status.reservedFor`` the pod, in one PUT of the status subresource with the claim's
resourceVersion as the precondition: a claim someone else allocated (or changed) since the cache
saw it answers 409 Conflict, and the placement is withdrawn and the pod requeued — never a device
handed out twice. Claims already written for a placement that fails are released again, allocation
first, then the finalizer this placement added (best effort: a claim left allocated is charged as a
hold, so its devices stay taken, as they are in the API).
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from plumbing.kube.api import TRANSPORT_ERRORS
from scheduler.kube.calls import ApiCalls
from scheduler.kube.dra_claims import DeviceRequest, allocation_status, released_status, with_finalizer
from scheduler.kube.dra_inventory import Device

log = logging.getLogger(__name__)


class ClaimsRefused(Exception):
    """The apiserver did not take a claim's allocation: ``conflict`` when it changed since it was read;
    ``lasting`` when the answer will not change by asking again (403 Forbidden, 422 Invalid, ...)."""

    def __init__(self, message: str, conflict: bool, lasting: bool = False):
        super().__init__(message)
        self.conflict, self.lasting = conflict, lasting


class ClaimWriter:
    def __init__(self, calls: ApiCalls):
        self.calls = calls

    async def allocate(self, claims: dict[str, dict[str, Any]], node: str,
                       picks: list[tuple[DeviceRequest, Device]], pod: dict[str, Any]) -> list[dict[str, Any]]:
        """Write every claim of the placement; the claims as written, or ``ClaimsRefused`` (none left written)."""
        written: list[dict[str, Any]] = []
        for key in sorted({r.claim for r, _ in picks}):
            claim = claims.get(key)
            protected = None  # the claim as the finalizer write left it, when this placement added it
            verb = "update-claim"
            try:
                if claim is None:
                    raise ClaimsRefused(f"ResourceClaim {key} is gone", conflict=True)
                guard = with_finalizer(claim, True)
                if guard is not None:
                    claim = protected = await self.calls.call(self.calls.api.update_claim, guard)
                verb = "update-claim-status"
                body = allocation_status(claim, node, picks, pod)
                written.append(await self.calls.call(self.calls.api.write_claim_status, body))
            except (ApiException, *TRANSPORT_ERRORS, ClaimsRefused) as exc:
                await self.release(written)
                if protected is not None:
                    await self._unprotect(protected)
                if isinstance(exc, ClaimsRefused):
                    raise
                if isinstance(exc, ApiException):
                    code, reason, message = self.calls.failed(verb, exc)
                    raise ClaimsRefused(f"ResourceClaim {key}: {code} {reason}: {message}", conflict=code == 409,
                                        lasting=400 <= code < 500 and code not in (409, 429)) from exc
                self.calls.stats.api_errors[(verb, 0)] += 1
                raise ClaimsRefused(f"ResourceClaim {key}: {exc}", conflict=False) from exc
        return written

    async def _unprotect(self, claim: dict[str, Any]) -> None:
        """Take the finalizer off a claim that is not allocated (what kube-controller-manager does once it
        deallocates); a claim left with it is only slower to delete."""
        body = with_finalizer(claim, False)
        if body is None:
            return
        try:
            await self.calls.call(self.calls.api.update_claim, body)
        except ApiException as exc:
            code, reason, message = self.calls.failed("update-claim", exc)
            log.warning("ResourceClaim %s/%s keeps its finalizer (%s %s: %s)", claim["metadata"].get("namespace"),
                        claim["metadata"]["name"], code, reason, message)
        except TRANSPORT_ERRORS as exc:
            self.calls.stats.api_errors[("update-claim", 0)] += 1
            log.warning("ResourceClaim %s keeps its finalizer (%s)", claim["metadata"]["name"], exc)

    async def release(self, written: list[dict[str, Any]]) -> None:
        """Take back allocations this placement wrote (its Binding failed, or a later claim was refused), and
        then the delete-protection finalizer."""
        for claim in written:
            try:
                await self._unprotect(await self.calls.call(self.calls.api.write_claim_status, released_status(claim)))
            except ApiException as exc:
                code, reason, message = self.calls.failed("update-claim-status", exc)
                log.warning("ResourceClaim %s/%s stays allocated (%s %s: %s); its devices stay taken",
                            claim["metadata"].get("namespace"), claim["metadata"]["name"], code, reason, message)
            except TRANSPORT_ERRORS as exc:
                self.calls.stats.api_errors[("update-claim-status", 0)] += 1
                log.warning("ResourceClaim %s stays allocated (%s); its devices stay taken",
                            claim["metadata"]["name"], exc)
