"""Records must come from the node they name: the agent's node token, checked with the apiserver.

``NodeVerifier.check(node, headers)`` passes a record whose ``gpuaware.contract.identity`` token the apiserver
authenticates (TokenReview, audience ``gpuaware-stream``) as one of the agent ServiceAccounts, issued to
a pod on ``node``; anything else raises ``IdentityRejected`` (an ``InvalidRecord``: dead-lettered,
counted, processing goes on). Verdicts are cached by the token's hash (a token is reused for every
record of its ~hour), accepted ones for ``accept_s``, refused ones for ``refuse_s`` so that a flood of
bad tokens costs the apiserver one review per token. While the apiserver cannot answer, a token seen
before keeps its last verdict; an unseen one is retried with back-off, holding its partition (no
record is dropped for the apiserver's outage).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from gpuaware.contract.identity import NODE_NAME_EXTRA, NODE_TOKEN_HEADER, TOKEN_AUDIENCE, node_token
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.processor import InvalidRecord

log = logging.getLogger(__name__)

AGENT_USERS = ("system:serviceaccount:gpuaware:gpuaware-agent",)


class IdentityRejected(InvalidRecord):
    """A record whose node is not proven by its token."""


class ReviewUnavailable(Exception):
    """The apiserver could not answer a TokenReview (a transient failure, retried)."""


# token -> (authenticated username, node of the pod it was issued to), or None when not authenticated.
Review = Callable[[str], tuple[str, str] | None]


def kube_review(api) -> Review:  # api: gpuaware.plumbing.kube.api.KubeApi
    """A ``Review`` through the apiserver's TokenReview API."""
    from kubernetes.client.exceptions import ApiException

    from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS

    def review(token: str) -> tuple[str, str] | None:
        try:
            status = api.review_token(token, TOKEN_AUDIENCE)
        except ApiException as exc:
            if exc.status in (429,) or (exc.status or 500) >= 500:
                raise ReviewUnavailable(str(exc)) from exc
            raise
        except TRANSPORT_ERRORS as exc:
            raise ReviewUnavailable(str(exc)) from exc
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        nodes = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or []
        return (user.get("username", ""), nodes[0]) if len(nodes) == 1 else (user.get("username", ""), "")

    return review


class NodeVerifier:
    def __init__(self, review: Review, stats: StreamStats | None = None, users: Iterable[str] = AGENT_USERS,
                 accept_s: float = 300.0, refuse_s: float = 30.0, cache_size: int = 50_000,
                 clock: Callable[[], float] = time.monotonic, backoff_s: float = 0.5, max_backoff_s: float = 10.0):
        self.review, self.stats = review, stats or StreamStats()
        self.users = frozenset(users)
        self.accept_s, self.refuse_s, self.cache_size = accept_s, refuse_s, cache_size
        self.clock, self.backoff_s, self.max_backoff_s = clock, backoff_s, max_backoff_s
        self._cache: OrderedDict[bytes, tuple[tuple[str, str] | None, float]] = OrderedDict()

    async def _verdict(self, token: str) -> tuple[str, str] | None:
        key = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > self.clock():
            self._cache.move_to_end(key)
            return hit[0]
        wait = self.backoff_s
        while True:
            try:
                verdict = await asyncio.to_thread(self.review, token)
                break
            except ReviewUnavailable as exc:
                self.stats.identity_review_errors += 1
                if hit is not None:  # stale-if-error: the apiserver said so before
                    log.warning("TokenReview unavailable (%s): keeping a cached verdict", exc)
                    return hit[0]
                log.warning("TokenReview unavailable (%s): retrying in %.1fs", exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, self.max_backoff_s)
        self._cache[key] = (verdict, self.clock() + (self.accept_s if verdict else self.refuse_s))
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return verdict

    async def check(self, node: str, headers: list[tuple[str, bytes]]) -> None:
        token = node_token(headers)
        try:
            if not token:
                raise IdentityRejected(f"record for node {node!r} carries no {NODE_TOKEN_HEADER} header")
            verdict = await self._verdict(token)
            if verdict is None:
                raise IdentityRejected(f"record for node {node!r}: the apiserver does not accept its node token")
            user, proven = verdict
            if user not in self.users:
                raise IdentityRejected(f"record for node {node!r}: its token belongs to {user!r}, not an agent")
            if proven != node:
                raise IdentityRejected(f"record claims node {node!r} but its token was issued to a pod on "
                                       f"{proven or 'no node'!r}")
        except IdentityRejected:
            self.stats.identity_rejected += 1
            raise


def without_token(headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Headers to forward: the token has been checked and is not copied to internal topics."""
    return [(k, v) for k, v in headers if k != NODE_TOKEN_HEADER]
