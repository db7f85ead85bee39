"""The agent's node token (gpuaware.agent.identity): read from the projected volume, re-read when the kubelet rotates
it, and attached when a record is sent, never spooled."""

from __future__ import annotations

import os

from gpuaware.agent.exporter import AgentStats
from gpuaware.agent.identity import NodeToken
from gpuaware.agent.publisher import Publisher
from gpuaware.agent.spool import DiskSpool
from gpuaware.contract.identity import NODE_TOKEN_HEADER
from gpuaware.plumbing.kafka_settings import KafkaSettings


def test_the_token_file_is_reread_when_rotated_and_absent_means_no_header(tmp_path):
    path = tmp_path / "node-token"
    token = NodeToken(path)
    assert token.headers() == []
    path.write_text("first\n")
    assert token.headers() == [(NODE_TOKEN_HEADER, b"first")]
    path.write_text("second")
    os.utime(path, (1, 1))  # a new mtime, as the kubelet's atomic swap gives
    assert token.headers() == [(NODE_TOKEN_HEADER, b"second")]


async def test_records_go_out_with_the_token_current_at_send_time_and_the_spool_holds_none(tmp_path, fake_producer):
    path = tmp_path / "node-token"
    path.write_text("old")
    spool = DiskSpool(tmp_path / "spool")
    pub = Publisher(KafkaSettings(), spool, AgentStats(), identity=NodeToken(path).headers)
    pub.enqueue("t", b"k", b"v1", [("traceparent", b"00-1")])
    path.write_text("rotated")
    os.utime(path, (2, 2))
    await pub.send_pending()
    assert fake_producer.headers == [[("traceparent", b"00-1"), (NODE_TOKEN_HEADER, b"rotated")]]
    assert not any(b"rotated" in f.read_bytes() or b"old" in f.read_bytes()
                   for f in (tmp_path / "spool").rglob("*") if f.is_file())
