"""Helpers that several test files share; fixtures are in conftest.py.

Import it as ``tests.support`` (pyproject.toml puts the repository root on the path).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pytest
import yaml
from aiokafka import AIOKafkaConsumer

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


T = TypeVar("T")


def missing_part(reason: str) -> NoReturn:
    """Skip for a real part (binaries, jars, CRDs) that is not built here; under ``CI=true`` fail instead,
    so that CI cannot pass by testing nothing."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and a real part is missing: {reason}")
    pytest.skip(reason)


def need(locate: Callable[[], T], missing: type[Exception]) -> T:
    """``locate()``, or :func:`missing_part` with the message of the ``missing`` it raised."""
    try:
        return locate()
    except missing as exc:
        missing_part(str(exc))


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
