"""The runtime's tasks at the function level, with fakes in place of the broker."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import yaml
from aiokafka.errors import KafkaConnectionError
from aiokafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from gpuaware.agent import runtime as runtime_module
from gpuaware.agent.collectors.sim import Scenario, SimCluster
from gpuaware.agent.exporter import AgentCollector, render
from gpuaware.agent.runtime import AgentRuntime
from gpuaware.agent.sampling import SamplingPolicy
from gpuaware.contract import events
from gpuaware.contract.events import AgentControl, ControlKind
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.agent.conftest import fill, wait_until
from tests.agent.metrics_support import families


@dataclass
class FakeRecord:
    value: bytes
    offset: int
    key: bytes | None = b"n"
    partition: int = 0
    headers: list = field(default_factory=list)


class FakeConsumer:
    """Hands out its records in one ``getmany``, then reports nothing new and stops the runtime."""

    records: list[FakeRecord] = []
    stop: asyncio.Event
    kwargs: dict = {}  # what the last one was built with

    def __init__(self, **kwargs):
        self.calls = 0
        FakeConsumer.kwargs = kwargs

    async def start(self):
        pass

    async def stop(self):
        pass

    def assign(self, tps):
        self.tps = tps

    async def seek_to_beginning(self, *tps):
        pass

    async def getmany(self, timeout_ms=0):
        self.calls += 1
        if self.calls == 1:
            return {self.tps[0]: list(self.records)}
        FakeConsumer.stop.set()
        return {}


def _fake_control_topic(monkeypatch) -> None:
    """FakeConsumer for the consumer; one control partition for the topic's metadata."""

    async def partitions(settings, topic):
        return [TopicPartition(topic, 0)]

    monkeypatch.setattr(runtime_module, "AIOKafkaConsumer", FakeConsumer)
    monkeypatch.setattr(runtime_module, "topic_partitions", partitions)


def _runtime(tmp_path) -> AgentRuntime:
    scenario = Scenario(name="t", seed=1, duration_s=600, nodes=1, gpus_per_node=2, models=["H100"], node_prefix="rt")
    return AgentRuntime(SimCluster(scenario).collectors(), KafkaSettings(), SamplingPolicy(), tmp_path / "spool")


def _policy(node: str, command_id: str, text: str) -> bytes:
    return events.encode(AgentControl(command_id, 1, node, ControlKind.SAMPLING_POLICY, sampling_policy_yaml=text))


async def test_a_poisoned_control_record_is_counted_and_the_next_one_is_applied(tmp_path, monkeypatch):
    rt = _runtime(tmp_path)
    node = rt.cores[0].node
    nested = "".join("  " * i + f"k{i}:\n" for i in range(500))  # RecursionError in the YAML composer
    FakeConsumer.records = [
        FakeRecord(_policy(node, "bad", nested), 0),
        FakeRecord(b"not an avro record", 1),
        FakeRecord(_policy(node, "good", yaml.safe_dump({"floor_s": 2.0, "ceiling_s": 20.0})), 2),
    ]
    FakeConsumer.stop = asyncio.Event()
    _fake_control_topic(monkeypatch)
    await asyncio.wait_for(rt.consume_control(FakeConsumer.stop), 10)
    assert rt.cores[0].policy.floor_s == 2.0 and rt.cores[0].policy.ceiling_s == 20.0
    assert rt.stats.policy_errors == 1  # the nested policy, rejected with a PolicyError
    assert rt.stats.control_rejected == {"undecodable": 1}
    assert rt.spool.depth == 0  # nothing dead-lettered: the agent has no grant on agent.control.v1.dlq


async def test_an_unexpected_error_while_applying_a_control_record_does_not_stop_the_consumer(tmp_path, monkeypatch):
    rt = _runtime(tmp_path)
    node = rt.cores[0].node
    FakeConsumer.records = [
        FakeRecord(events.encode(AgentControl("cap", 1, node, ControlKind.POWER_CAP, power_cap_w=200)), 0),
        FakeRecord(_policy(node, "good", "floor_s: 3\n"), 1),
    ]
    FakeConsumer.stop = asyncio.Event()

    def explode(index, watts):
        raise KeyError("driver went away")

    monkeypatch.setattr(rt.cores[0].collector, "set_power_limit", explode)
    _fake_control_topic(monkeypatch)
    await asyncio.wait_for(rt.consume_control(FakeConsumer.stop), 10)
    assert rt.cores[0].policy.floor_s == 3.0
    assert rt.stats.control_rejected == {"error": 1}


async def test_a_nested_policy_file_is_rejected_and_the_watcher_keeps_going(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("floor_s: 1\n")
    scenario = Scenario(name="t", seed=1, duration_s=600, nodes=1, gpus_per_node=1, models=["H100"], node_prefix="pf")
    rt = AgentRuntime(SimCluster(scenario).collectors(), KafkaSettings(), SamplingPolicy(), tmp_path / "spool", path)
    stop = asyncio.Event()
    task = asyncio.create_task(rt.watch_policy_file(stop, every_s=0.01))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10

    async def rewrite_until(text: str, done) -> None:
        # Bump the mtime until the watcher has seen a change (its first stat is only a baseline).
        stamp = 0
        while not done() and loop.time() < deadline and not task.done():
            stamp += 1
            path.write_text(text)
            os.utime(path, ns=(stamp * 10**9, stamp * 10**9))
            await asyncio.sleep(0.02)

    await rewrite_until("".join("  " * i + f"k{i}:\n" for i in range(500)), lambda: rt.stats.policy_errors > 0)
    assert rt.stats.policy_errors >= 1 and not task.done()
    await rewrite_until("floor_s: 2\n", lambda: rt.cores[0].policy.floor_s == 2.0)
    assert rt.cores[0].policy.floor_s == 2.0 and not task.done()
    stop.set()
    await task


async def test_the_publisher_is_restarted_after_an_unexpected_exception(tmp_path, fake_producer):
    scenario = Scenario(name="t", seed=1, duration_s=600, nodes=1, gpus_per_node=2, models=["H100"], node_prefix="sv")
    rt = AgentRuntime(SimCluster(scenario).collectors(), KafkaSettings(), SamplingPolicy(floor_s=0.2, flush_s=0.2),
                      tmp_path / "spool")
    rt.publisher_restart_s = 0.01
    bugs = [1]

    def fail_once(topic, value):
        if bugs[0]:
            bugs[0] -= 1
            return ValueError("a bug, not a broker error")
        return None

    fake_producer.fail = staticmethod(fail_once)
    stop = asyncio.Event()
    task = asyncio.create_task(rt.run(stop, control=False))
    try:
        await wait_until(lambda: len(fake_producer.sent) > 0 or task.done(), 20, "delivery after the restart")
        assert fake_producer.sent and rt.stats.task_restarts == {"publisher": 1}
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def test_the_idle_control_consumer_asks_the_broker_for_a_long_fetch_wait(tmp_path, monkeypatch):
    # kafka.fetch_max_wait_ms (100 ms) for every agent's consumer of this idle one-partition topic would be ~10 empty
    # fetches a second per node at one broker: ~62,500/s for 6,250 nodes (review).
    rt = _runtime(tmp_path)
    FakeConsumer.records, FakeConsumer.stop = [], asyncio.Event()
    _fake_control_topic(monkeypatch)
    await asyncio.wait_for(rt.consume_control(FakeConsumer.stop), 10)
    assert FakeConsumer.kwargs["fetch_max_wait_ms"] == 500 and rt.settings.fetch_max_wait_ms == 100


async def test_the_agent_keeps_sampling_and_serving_metrics_on_a_full_disk_and_delivers_once_it_frees(
        small_fs, fake_producer):
    scenario = Scenario(name="t", seed=1, duration_s=600, nodes=1, gpus_per_node=2, models=["H100"], node_prefix="fd")
    rt = AgentRuntime(SimCluster(scenario).collectors(), KafkaSettings(), SamplingPolicy(floor_s=0.1, flush_s=0.1),
                      small_fs / "spool")
    fake_producer.fail = staticmethod(lambda topic, value: KafkaConnectionError())  # the broker is down too
    registry = CollectorRegistry()
    registry.register(AgentCollector(rt.cores, rt.stats))
    filler = fill(small_fs)
    stop = asyncio.Event()
    task = asyncio.create_task(rt.run(stop, control=False))
    try:
        await wait_until(lambda: rt.spool.write_errors > 0 or task.done(), 20, "a refused spool write")
        published = rt.samples_published
        await wait_until(lambda: rt.samples_published > published + 10 or task.done(), 20, "sampling to go on")
        assert not task.done()
        metrics = families(render(registry).decode())
        assert metrics["gpuaware_agent_spool_write_errors"].samples[0].value > 0
        assert metrics["gpuaware_agent_spool_held"].samples[0].value > 0
        held = rt.spool.held
        filler.unlink()
        fake_producer.fail = staticmethod(lambda topic, value: None)
        await wait_until(lambda: (rt.spool.held == 0 and len(fake_producer.sent) >= held) or task.done(), 20,
                         "the held records to be spooled and sent")
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
