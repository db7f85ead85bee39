"""No node speaks for another, end to end (issue 17, item 8; docs/security.md): a stream worker with
``stream.node_identity: required`` asks the real kube-apiserver v1.36.3 (TokenReview, as the shipped
``gpuaware-stream`` ServiceAccount) about each record's node token. A batch from node A with A's agent token
becomes state; the same token on a batch naming node B, and a batch without a token, go to the DLQ with the
reason. On the session's control plane; skipped when it is not built (failed under CI=true)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuaware.contract import topics
from gpuaware.contract.events import DLQ_ERROR_HEADER, GpuState, encode
from gpuaware.contract.identity import NODE_TOKEN_HEADER
from gpuaware.local.stream_workers import StreamWorkerProcess
from tests.deploy.test_rbac import NS, _bound_token, _node, _pod_on
from tests.support import fleet_batch, produce, watch

pytestmark = [pytest.mark.broker, pytest.mark.timeout(400)]


def test_the_stream_turns_only_proven_records_into_state(kafka_settings, tmp_path, unique, monkeypatch, kube):
    node_a, node_b = f"ida-{unique}", f"idb-{unique}"
    cp = kube.cp  # the session's control plane: the shipped RBAC is in place
    for node in (node_a, node_b):
        _node(cp, node)
    _pod_on(cp, "agent-ida", node_a, "gpuaware-agent")
    token_a = _bound_token(cp, "gpuaware-agent", "agent-ida").encode()
    monkeypatch.setenv("KUBECONFIG", str(cp.serviceaccount_kubeconfig(NS, "gpuaware-stream", create=False)))
    worker = StreamWorkerProcess(kafka_settings, f"test-identity-{unique}", tmp_path, "w",
                                 node_identity="required", max_publish_interval_ms=1000)
    worker.start()
    try:
        now = int(time.time() * 1000)
        proven = fleet_batch(node_a, 1, now)
        forged = fleet_batch(node_b, 1, now)
        bare = fleet_batch(node_b, 2, now)
        asyncio.run(produce(kafka_settings, [(topics.TELEMETRY, node_a.encode(), encode(proven)),
                                             (topics.TELEMETRY, node_b.encode(), encode(forged))],
                            headers=[(NODE_TOKEN_HEADER, token_a)]))
        asyncio.run(produce(kafka_settings, [(topics.TELEMETRY, node_b.encode(), encode(bare))]))
        states = asyncio.run(watch(kafka_settings, topics.GPU_STATE, bool,
                                   lambda s: isinstance(s, GpuState) and s.node in (node_a, node_b)))
        assert {s.node for s in states} == {node_a}
        dead = asyncio.run(watch(kafka_settings, topics.dlq_name(topics.TELEMETRY), lambda seen: len(seen) == 2,
                                 lambda m: m.key == node_b.encode(), raw=True))
        reasons = sorted(dict(m.headers)[DLQ_ERROR_HEADER].decode() for m in dead)
        assert any(f"issued to a pod on '{node_a}'" in r for r in reasons), reasons
        assert any("carries no gpuaware-node-token" in r for r in reasons), reasons
        # A new worker reads the telemetry topic from its start: on the session's shared broker that holds
        # earlier tests' records too, carrying no token, so they are refused as well (the DLQ check above is
        # the one for this test's two records).
        assert worker.counter("gpuaware_stream_identity_rejected_total") >= 2
    finally:
        worker.stop()
