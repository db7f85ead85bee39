"""The live agent against a real Kafka-protocol broker: publishing, outages, policy, control."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import events, topics
from gpuaware.contract.events import AgentControl, ControlKind, EventKind
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing import kafka_admin as admin
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.support import wait_for

pytestmark = pytest.mark.broker


def _scenario(prefix: str, gpus: int = 4, faults: list[dict] | None = None) -> Scenario:
    return Scenario(name=prefix, seed=11, duration_s=3600, nodes=1, gpus_per_node=gpus, models=["H100"],
                    node_prefix=prefix, faults=faults or [])


async def _read_all(settings: KafkaSettings, topic: str, node_prefix: str | None = None, idle_s: float = 2.0):
    """Every record of a topic from the beginning (optionally only this test's node's)."""
    tps = await admin.topic_partitions(settings, topic)
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None))
    await consumer.start()
    out = []
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            batches = await consumer.getmany(timeout_ms=300)
            for records in batches.values():
                last = time.monotonic()
                out.extend(r for r in records if node_prefix is None or (r.key or b"").startswith(node_prefix.encode())
                           or node_prefix.encode() in (r.value or b""))
    finally:
        await consumer.stop()
    return out


def _runtime(settings, scenario, tmp_path, policy=None, policy_path=None) -> AgentRuntime:
    return AgentRuntime(SimCluster(scenario).collectors(), settings, policy or SamplingPolicy(flush_s=1.0),
                        tmp_path / "spool", policy_path)


async def test_agent_publishes_decodable_batches_and_events(kafka_settings, tmp_path):
    prefix = f"pub-{uuid.uuid4().hex[:6]}"
    scenario = _scenario(prefix, faults=[{"kind": "xid", "node": 0, "gpu": 1, "at_s": 2, "xid": 79},
                                         {"kind": "ecc_dbe", "node": 0, "gpu": 2, "at_s": 3}])
    observability.setup("agent-test")  # a real tracer provider, as `gpuaware agent` sets up
    runtime = _runtime(kafka_settings, scenario, tmp_path)
    await runtime.run(asyncio.Event(), duration_s=7)
    assert runtime.spool.depth == 0 and runtime.spool.dropped == 0

    telemetry = await _read_all(kafka_settings, topics.TELEMETRY, prefix)
    batches = [events.decode_for_topic(topics.TELEMETRY, r.value) for r in telemetry]
    assert batches and all(b.node == f"{prefix}-000" for b in batches)
    assert all(dict(r.headers).get("traceparent") for r in telemetry)
    seqs = sorted((b.gpus[s.gpu].uuid, s.seq) for b in batches for s in b.samples)
    assert len(seqs) == len(set(seqs)) == runtime.cores[0].samples_taken

    evs = [events.decode_for_topic(topics.EVENTS, r.value)
           for r in await _read_all(kafka_settings, topics.EVENTS, prefix)]
    uuids = [d.uuid for d in runtime.cores[0].devices]
    kinds = {(e.gpu_uuid, e.kind) for e in evs}
    assert (uuids[1], EventKind.XID) in kinds
    assert (uuids[2], EventKind.ECC_DBE) in kinds
    assert (uuids[2], EventKind.HEALTH_CHANGE) in kinds


@pytest.mark.durable
def test_a_broker_down_for_30s_loses_no_sample(tmp_path, seaweedfs):
    prefix = f"outage-{uuid.uuid4().hex[:6]}"
    with LocalBroker(BrokerSettings(port=0, storage="s3"), run_dir=tmp_path / "broker") as broker:
        settings = broker.kafka_settings(session_timeout_ms=2000)
        runtime = _runtime(settings, _scenario(prefix, gpus=4), tmp_path,
                           SamplingPolicy(flush_s=1.0, ceiling_s=2.0))

        async def scenario() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(runtime.run(stop, control=False))
            await wait_for(lambda: runtime.samples_published > 0 and runtime.spool.depth == 0, timeout=30,
                           what="the first samples delivered")
            await asyncio.to_thread(broker.child.stop)
            down_at = runtime.cores[0].samples_taken
            # The broker stays down until the agent has sampled 30 s more and spooled what it could not send.
            await wait_for(lambda: runtime.cores[0].samples_taken > down_at + 30 and runtime.spool.depth > 0
                           and runtime.stats.publish_errors > 0, timeout=90, what="sampling and spooling while down")
            spooled = runtime.spool.depth
            await asyncio.to_thread(broker.restart)
            await wait_for(lambda: runtime.spool.depth == 0, timeout=60, what="the backlog delivered")
            stop.set()
            await task
            assert runtime.cores[0].samples_taken > down_at + 30  # it kept sampling while the broker was down
            assert spooled > 0 and runtime.stats.publish_errors > 0

        asyncio.run(scenario())
        assert runtime.spool.depth == 0 and runtime.spool.dropped == 0
        telemetry = asyncio.run(_read_all(settings, topics.TELEMETRY, prefix, idle_s=3))
        got = {(b.gpus[s.gpu].uuid, s.seq) for b in (events.decode(r.value) for r in telemetry) for s in b.samples}
        want = {(t.device.uuid, seq) for t in runtime.cores[0].tracks for seq in range(1, t.seq + 1)}
        assert got == want, f"missing {len(want - got)} of {len(want)} samples"
        # Downstream, a stream worker applies each of them once, replays and resends included.
        worker = StreamWorkerProcess(settings, f"outage-{prefix}", tmp_path, "stream", node_identity="off")
        worker.start()
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and worker.counter("gpuaware_stream_samples_total") < len(want):
                time.sleep(0.5)
            # Anything beyond the expected count would show up by the time the worker has read every record
            # (its consumer lag back to 0), which is a condition, not a pause.
            def lag() -> float | None:
                lines = [x for x in worker.metrics().splitlines() if x.startswith("gpuaware_stream_consumer_lag{")]
                return sum(float(x.split()[-1]) for x in lines) if lines else None

            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and lag() != 0:
                time.sleep(0.5)
            assert worker.counter("gpuaware_stream_samples_total") == len(want)
        finally:
            worker.stop()


async def test_a_bad_policy_file_is_rejected_and_the_agent_keeps_running(kafka_settings, tmp_path):
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("floor_s: 1\nceiling_s: 30\n")
    runtime = _runtime(kafka_settings, _scenario(f"pol-{uuid.uuid4().hex[:6]}"), tmp_path,
                       policy_path=policy_file)
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop, control=False))
    await wait_for(lambda: runtime.cores[0].watch_reads > 0, what="sampling")
    policy_file.write_text("floor_s: 60\nceiling_s: 5\n")  # floor above ceiling
    await wait_for(lambda: runtime.stats.policy_errors == 1, what="the bad policy rejected")
    assert runtime.cores[0].policy.ceiling_s == 30
    before = runtime.cores[0].watch_reads
    await wait_for(lambda: runtime.cores[0].watch_reads > before, what="still sampling")
    policy_file.write_text("floor_s: 1\nceiling_s: 5\n")
    await wait_for(lambda: runtime.stats.policy_reloads == 1, what="the good policy applied")
    assert runtime.cores[0].policy.ceiling_s == 5 and runtime.stats.policy_errors == 1
    stop.set()
    await task


async def test_control_topic_sets_policy_and_power_caps_and_skips_garbage(kafka_settings, tmp_path):
    prefix = f"ctl-{uuid.uuid4().hex[:6]}"
    runtime = _runtime(kafka_settings, _scenario(prefix), tmp_path)
    node = runtime.cores[0].node
    gpu0 = runtime.cores[0].devices[0].uuid
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop))
    producer = AIOKafkaProducer(**kafka_settings.producer_kwargs())
    await producer.start()
    try:
        policy = AgentControl("c1", 1, node, ControlKind.SAMPLING_POLICY,
                              sampling_policy_yaml=yaml.safe_dump({"floor_s": 2.0, "ceiling_s": 20.0}))
        cap = AgentControl("c2", 2, node, ControlKind.POWER_CAP, gpu_uuid=gpu0, power_cap_w=200)
        other = AgentControl("c3", 3, "some-other-node", ControlKind.POWER_CAP, power_cap_w=150)
        for cmd in (policy, cap, other):
            await producer.send_and_wait(topics.CONTROL, events.encode(cmd), key=cmd.key())
        await producer.send_and_wait(topics.CONTROL, f"garbage for {prefix}".encode(), key=node.encode())
    finally:
        await producer.stop()
    gpus = runtime.cores[0].collector.cluster.gpus[0]
    # The garbage record is the last one sent: once it is counted, every command before it was handled.
    await wait_for(lambda: runtime.cores[0].policy.floor_s == 2.0 and gpus[0].power_limit == 200
                   and sum(runtime.stats.control_rejected.values()) >= 1, timeout=20, what="commands handled")
    stop.set()
    await task
    assert runtime.cores[0].policy.floor_s == 2.0 and runtime.cores[0].policy.ceiling_s == 20.0
    gpus = runtime.cores[0].collector.cluster.gpus[0]
    assert gpus[0].power_limit == 200 and all(g.power_limit > 200 for g in gpus[1:])
    # Garbage is counted and skipped, not dead-lettered: the agent has no grant on the control DLQ.
    assert runtime.stats.control_rejected.get("undecodable", 0) >= 1
    dlq = await _read_all(kafka_settings, topics.dlq_name(topics.CONTROL), prefix)
    assert not [r for r in dlq if r.value == f"garbage for {prefix}".encode()]
