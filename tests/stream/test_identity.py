"""Node identity in the stream (docs/security.md): a record must carry a token proving the node it names,
and one node cannot take over another's GPU. The TokenReview itself is exercised on a real kube-apiserver in
tests/deploy/test_node_identity.py; here the apiserver's answers are a table."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gpuaware.contract.events import EventKind, GpuEvent, Severity
from gpuaware.contract.identity import NODE_TOKEN_HEADER, node_token
from gpuaware.stream.identity import IdentityRejected, NodeVerifier, ReviewUnavailable, without_token
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.processor import GpuClaimedElsewhere, StreamProcessor
from tests.support import telemetry_batch, wait_for

AGENT = "system:serviceaccount:gpuaware:gpuaware-agent"
ANSWERS = {"tok-a": (AGENT, "node-a"), "tok-b": (AGENT, "node-b"),
           "tok-user": ("system:serviceaccount:ml:job", "node-a")}


def hdr(token: str) -> list[tuple[str, bytes]]:
    return [("traceparent", b"00-x"), (NODE_TOKEN_HEADER, token.encode())]


class Reviews:
    def __init__(self):
        self.calls: list[str] = []
        self.down = False

    def __call__(self, token: str):
        self.calls.append(token)
        if self.down:
            raise ReviewUnavailable("apiserver unreachable")
        return ANSWERS.get(token)


def test_a_record_passes_only_with_a_token_of_an_agent_on_the_node_it_names():
    reviews, stats = Reviews(), StreamStats()
    v = NodeVerifier(reviews, stats)

    async def main():
        await v.check("node-a", hdr("tok-a"))
        cases = {"node-b": hdr("tok-a"), "node-a": [], "node-c": hdr("forged"), "node-x": hdr("tok-user")}
        for node, headers in cases.items():
            with pytest.raises(IdentityRejected) as err:
                await v.check(node, headers)
            assert node in str(err.value)
        with pytest.raises(IdentityRejected, match="issued to a pod on 'node-a'"):
            await v.check("node-b", hdr("tok-a"))

    asyncio.run(main())
    assert stats.identity_rejected == 5
    assert reviews.calls.count("tok-a") == 1  # verdicts are cached per token


def test_a_refused_verdict_expires_sooner_than_an_accepted_one():
    now = [0.0]
    reviews = Reviews()
    v = NodeVerifier(reviews, accept_s=300, refuse_s=30, clock=lambda: now[0])

    async def main():
        for _ in range(3):
            await v.check("node-a", hdr("tok-a"))
            with pytest.raises(IdentityRejected):
                await v.check("node-a", hdr("forged"))
            now[0] += 31

    asyncio.run(main())
    assert reviews.calls.count("tok-a") == 1 and reviews.calls.count("forged") == 3


def test_an_apiserver_outage_keeps_known_verdicts_and_holds_unknown_tokens_until_it_answers():
    now = [0.0]
    reviews, stats = Reviews(), StreamStats()
    v = NodeVerifier(reviews, stats, clock=lambda: now[0], backoff_s=0.01, max_backoff_s=0.02)

    async def main():
        await v.check("node-a", hdr("tok-a"))
        reviews.down = True
        now[0] += 10_000  # past the cache: the stale verdict is still the apiserver's last word
        await v.check("node-a", hdr("tok-a"))
        with pytest.raises(IdentityRejected):
            await v.check("node-b", hdr("tok-a"))
        waiting = asyncio.create_task(v.check("node-b", hdr("tok-b")))  # never seen: held, not dropped
        await wait_for(lambda: stats.identity_review_errors >= 5, what="retries")
        assert not waiting.done()
        reviews.down = False
        await asyncio.wait_for(waiting, 5)

    asyncio.run(main())


def test_the_token_is_not_forwarded_and_a_bad_header_is_no_token():
    assert without_token(hdr("tok-a")) == [("traceparent", b"00-x")]
    assert node_token([(NODE_TOKEN_HEADER, b"\xff\xfe")]) == ""
    assert node_token([(NODE_TOKEN_HEADER, b"one"), (NODE_TOKEN_HEADER, b"two")]) == "two"
    assert node_token([("other", b"x")]) is None


def test_a_node_cannot_report_a_gpu_another_node_reports():
    stats = StreamStats()
    p = StreamProcessor({}, stats=stats)
    t0 = 1_000_000
    p.on_telemetry(telemetry_batch("node-b", 1, t0), 0, t0)
    forged = telemetry_batch("node-a", 1, t0 + 1000)
    forged = dataclasses.replace(forged, gpus=[dataclasses.replace(forged.gpus[0], uuid="GPU-node-b-0")])
    with pytest.raises(GpuClaimedElsewhere, match="node 'node-b'"):
        p.on_telemetry(forged, 0, t0 + 1000)
    event = GpuEvent("e1", t0 + 1000, "node-a", "GPU-node-b-0", EventKind.HEALTH_CHANGE, Severity.CRITICAL,
                     "health_score", 5.0)
    with pytest.raises(GpuClaimedElsewhere):
        p.on_event(event, 0, t0 + 1000)
    assert p.trackers["GPU-node-b-0"].node == "node-b" and stats.gpu_claimed_elsewhere == 2
    # A board moved to another host: accepted once its old node has been silent for rehome_after_ms.
    later = t0 + p.settings.rehome_after_ms + 1
    forged = dataclasses.replace(forged, base_ts_ms=later)
    p.on_telemetry(forged, 0, later)
    assert p.trackers["GPU-node-b-0"].node == "node-a"
