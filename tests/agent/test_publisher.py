"""The publisher with a fake producer: ordering through a full spool, authorization errors."""

from __future__ import annotations

import asyncio

from aiokafka.errors import TopicAuthorizationFailedError

from gpuaware.agent.exporter import AgentStats
from gpuaware.agent.publisher import Publisher
from gpuaware.agent.spool import DiskSpool
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.agent.conftest import wait_until


async def test_records_pushed_while_a_batch_is_in_flight_survive_a_drop_of_the_head(tmp_path, fake_producer):
    spool = DiskSpool(tmp_path, max_bytes=4096, segment_bytes=1024)
    pub = Publisher(KafkaSettings(), spool, AgentStats(), batch=5)
    for i in range(10):
        pub.enqueue("t", f"k{i}".encode(), f"v{i:04d}".encode().ljust(60, b"x"))
    pushed = [10]

    def keep_sampling(topic, value):  # the sampling loop pushes past the bound while a batch is sent
        if pushed[0] < 90:
            for i in range(pushed[0], pushed[0] + 80):
                pub.enqueue("t", f"k{i}".encode(), f"v{i:04d}".encode().ljust(60, b"x"))
            pushed[0] += 80

    fake_producer.hook = staticmethod(keep_sampling)
    await pub.send_pending()
    sent = [int(v[1:5]) for v in fake_producer.sent]
    lost = set(range(90)) - set(sent)
    assert spool.depth == 0 and spool.dropped > 0
    # The bound dropped whole segments, the first one with the 5 records then in flight (they were
    # still delivered). Acknowledging those 5 must not remove 5 newer, unsent records instead.
    assert sent[:5] == [0, 1, 2, 3, 4]
    assert len(lost) == spool.dropped - 5
    assert max(lost) < min(i for i in sent if i >= 10)  # only the oldest went


async def test_an_authorization_error_backs_off_to_its_cap_and_keeps_spooling_within_the_bound(tmp_path,
                                                                                             fake_producer):
    spool = DiskSpool(tmp_path, max_bytes=4096, segment_bytes=1024)
    stats = AgentStats()
    pub = Publisher(KafkaSettings(), spool, stats, backoff_s=0.01, max_backoff_s=0.02, auth_backoff_s=0.08)
    denied = [True]
    fake_producer.fail = staticmethod(
        lambda topic, value: TopicAuthorizationFailedError(topic) if denied[0] else None)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    for i in range(200):  # the agent keeps sampling while the broker refuses it
        pub.enqueue("gpu.telemetry.v1", f"k{i}".encode(), f"v{i:04d}".encode().ljust(60, b"x"))
        await asyncio.sleep(0)
    await wait_until(lambda: stats.publish_auth_errors >= 4, what="auth errors counted")
    assert pub.backoff == 0.08  # the authorization back-off cap, not the transient one
    assert fake_producer.attempts <= stats.publish_errors + 1  # one try per back-off: no spinning
    assert spool.bytes <= 4096 and spool.dropped > 0 and not task.done()
    denied[0] = False  # the ACL is fixed
    await wait_until(lambda: spool.depth == 0, what="backlog delivered")
    sent = [int(v[1:5]) for v in fake_producer.sent]
    assert sent == sorted(sent) and sent[-1] == 199 and len(sent) + spool.dropped == 200
    stop.set()
    await task
