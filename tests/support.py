"""Helpers that several test files share; fixtures are in conftest.py.

Import it as ``tests.support`` (pyproject.toml puts the repository root on the path).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from contract import topics
from contract.events import GpuInfo, GpuSample, TelemetryBatch, decode
from plumbing.kafka_settings import KafkaSettings
from scheduler.core.cluster import ClusterState, NodeSpec
from scheduler.core.framework import Profile, Scheduler
from scheduler.core.plugins.health import HealthFilter
from scheduler.core.plugins.model_affinity import ModelAffinity

if TYPE_CHECKING:
    from deploy.checks import Doc

REPO = Path(__file__).resolve().parents[1]
# The real traces sit beside the checkout, in the workspace's shared/ folder.
TRACES = REPO.parent / "shared" / "traces"
OPENB_NODES = TRACES / "alibaba-openb" / "openb_node_list_gpu_node.csv"
OPENB_PODS = TRACES / "alibaba-openb" / "openb_pod_list_default.csv"
GAVEL = TRACES / "gavel" / "simulation_throughputs.json"
RULES = REPO / "dashboards" / "prometheus" / "rules.yml"
OVERLAYS = ("dev", "production", "existing-kafka")


TEST_BROKERS = ("apache", "tansu", "testcontainers")


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("CI", "").lower() == "true"


def chosen_broker(environ: Mapping[str, str] | None = None) -> str:
    """The broker ``kafka_settings`` runs on when ``KAFKA_BOOTSTRAP_SERVERS`` is not set:
    ``GPUAWARE_TEST_BROKER``, else Apache Kafka under ``CI=true`` and Tansu outside it."""
    environ = os.environ if environ is None else environ
    name = environ.get("GPUAWARE_TEST_BROKER") or ("apache" if in_ci(environ) else "tansu")
    if name not in TEST_BROKERS:
        raise ValueError(f"GPUAWARE_TEST_BROKER={name!r}: use one of {', '.join(TEST_BROKERS)}")
    return name


async def consume(settings: KafkaSettings, topic: str, group: str, want: int, timeout_s: float = 20.0):
    """``want`` records of ``topic`` read as member of ``group``, whose offsets are then committed."""
    consumer = AIOKafkaConsumer(topic, **settings.consumer_kwargs(group))
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < want:
                batches = await consumer.getmany(timeout_ms=500, max_records=want - len(got))
                for records in batches.values():
                    got.extend(records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def telemetry_batch(node: str, seq: int, ts_ms: int, gpus: int = 2, util: int = 60) -> TelemetryBatch:
    """A batch of ``gpus`` A100 samples from ``node``, sequence ``seq``, stamped ``ts_ms``."""
    return TelemetryBatch(
        node, seq, ts_ms, [GpuInfo(f"GPU-{node}-{i}", i, "NVIDIA A100-SXM4-80GB", 81920) for i in range(gpus)],
        [GpuSample(i, seq, 0, min(100, util + 5 * i + seq % 7), 20, 20_000 + 10 * seq, 2500, 60) for i in range(gpus)],
    )


async def produce(settings: KafkaSettings, records: list[tuple[str, bytes, bytes]],
                   headers: list[tuple[str, bytes]] | None = None) -> None:
    """Send (topic, key, value) records in order and wait until all are acknowledged."""
    producer = AIOKafkaProducer(**settings.producer_kwargs())
    await producer.start()
    try:
        for topic, key, value in records:
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def watch(settings: KafkaSettings, topic: str, done: Callable[[list], bool], keep: Callable[[object], bool],
                 timeout_s: float = 90.0, raw: bool = False) -> list:
    """Read ``topic`` from the beginning, collecting what ``keep`` accepts, until ``done`` says so."""
    consumer = AIOKafkaConsumer(**settings.consumer_kwargs(None))
    await consumer.start()
    seen: list = []
    try:
        parts = [TopicPartition(topic, p) for p in range(topics.spec(topic).partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=300)).values():
                for m in msgs:
                    item = m if raw else decode(m.value)
                    if keep(item):
                        seen.append(item)
            if done(seen):
                return seen
        raise AssertionError(f"{topic}: condition not met in {timeout_s}s; kept {len(seen)}: {seen[-3:]}")
    finally:
        await consumer.stop()


def prometheus_rules() -> list[dict]:
    """Every alerting and recording rule of dashboards/prometheus/rules.yml."""
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def crds_and_examples(rendered) -> tuple[list[Doc], list[Doc]]:
    """The production overlay's CRDs, and the custom resources under deploy/examples/."""
    crds = [d for d in rendered["production"] if d["kind"] == "CustomResourceDefinition"]
    files = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
    return crds, [d for p in files for d in yaml.safe_load_all(p.read_text())]


def cluster(*gpus_per_node: int, model: str = "V100", cpu: int = 32000) -> ClusterState:
    """Nodes ``n0``, ``n1``, ... with that many GPUs each."""
    return ClusterState([NodeSpec(f"n{i}", cpu, 262144, g, model, 16384) for i, g in enumerate(gpus_per_node)])


def scheduler_with(*scores, filters=None) -> Scheduler:
    """The score plugins given, weighted 1, behind the model and health filters unless ``filters`` is given."""
    return Scheduler(Profile("t", filters or [ModelAffinity(), HealthFilter()], [(s, 1.0) for s in scores]))
