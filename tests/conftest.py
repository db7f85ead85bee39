"""Shared fixtures: a real Kafka-protocol broker for the whole session.

``kafka_settings`` is the broker the broker-facing tests run against, in order of preference:

1. ``KAFKA_BOOTSTRAP_SERVERS`` (any broker you run; set ``GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT=true``
   if it is a Tansu);
2. ``GPUAWARE_TEST_BROKER``: ``apache`` (Apache Kafka from the realparts cache, KRaft, SCRAM and the
   StandardAuthorizer, clients as its super user with the production settings: no compat layer,
   idempotent producers, acks=all), ``tansu`` (the embedded broker) or ``testcontainers`` (a Kafka
   container, with Docker);
3. unset: ``apache`` under ``CI=true``, else ``tansu`` (it starts in about a second; Apache Kafka
   takes 10-20 s on a busy machine).

Tests of the embedded broker and of its compatibility layer ask for ``tansu_settings`` instead;
tests of Apache Kafka itself (SCRAM users, ACLs, compaction) ask for ``apache_kafka``. Each broker
is started at most once per session and shared.
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
from gpuaware.plumbing import kafka_admin as admin
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.support import OPENB_NODES, OVERLAYS, REPO, chosen_broker, in_ci

if TYPE_CHECKING:
    from gpuaware.deploy.checks import Doc
    from gpuaware.local.apache_kafka import ApacheKafka
    from gpuaware.local.kube_control_plane import KubeControlPlane
    from tests.real_kube import Kube

def _docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafka]:
    """Apache Kafka, started once per session; skipped outside CI when it cannot run here, failed under CI."""
    from gpuaware.local import apache_kafka as apache

    reason = apache.available()
    if reason:
        if in_ci():
            pytest.fail(f"CI=true and no Apache Kafka to test against: {reason}")
        pytest.skip(reason)
    with apache.ApacheKafka() as broker:
        yield broker


@pytest.fixture(scope="session")
def tansu_settings() -> Iterator[KafkaSettings]:
    """The embedded Tansu broker with its compatibility layer, started once per session."""
    with LocalBroker(BrokerSettings(port=0)) as broker:
        # A short session timeout makes Tansu's JoinGroup answer in ~1 s instead of ~5 s.
        yield broker.kafka_settings(session_timeout_ms=2000)


@pytest.fixture(scope="session")
def kafka_settings(request: pytest.FixtureRequest) -> Iterator[KafkaSettings]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    compat = os.environ.get("GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT", "").lower() in ("1", "true", "yes")
    if external:
        settings = KafkaSettings(bootstrap_servers=external, embedded_broker_compat=compat)
        asyncio.run(admin.ensure_topics(settings))
        yield settings
        return
    try:
        broker = chosen_broker()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if broker == "apache":
        kafka: ApacheKafka = request.getfixturevalue("apache_kafka")
        # The admin (the one super user): production client settings, compat off.
        settings = kafka.kafka_settings()
        asyncio.run(admin.ensure_topics(settings))
        yield settings
        return
    if broker == "testcontainers" and _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            settings = KafkaSettings(bootstrap_servers=container.get_bootstrap_server())
            asyncio.run(admin.ensure_topics(settings))
            yield settings
        return
    yield request.getfixturevalue("tansu_settings")


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


@pytest.fixture(scope="session")
def kube_cp() -> Iterator[KubeControlPlane]:
    """The session's one real control plane (etcd, kube-apiserver, kwok), with our CRDs and the shipped
    RBAC installed; skipped when it is not built, failed under ``CI=true``. Tests take ``kube``."""
    from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
    from tests.real_kube import prepare
    from tests.support import need, shipped_rbac

    need(find_binaries, BinariesMissing)
    with KubeControlPlane(kwok=True) as cp:
        prepare(cp, shipped_rbac(cp))
        yield cp


@pytest.fixture(scope="session")
def kube_accounts(kube_cp: KubeControlPlane) -> dict[str, Path]:
    """A kubeconfig per shipped ServiceAccount, each with its own TokenRequest token."""
    from tests.real_kube import NS

    return {sa: kube_cp.serviceaccount_kubeconfig(NS, sa, create=False)
            for sa in ("gpuaware-scheduler", "gpuaware-agent", "gpuaware-stream")}


@pytest.fixture
def kube(kube_cp: KubeControlPlane, kube_accounts: dict[str, Path]) -> Iterator[Kube]:
    """The shared control plane for one test, emptied of the test's pods, nodes and queues afterwards."""
    from tests.real_kube import Kube

    handle = Kube(kube_cp, kube_accounts)
    yield handle
    handle.clean()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    """Each deploy/ overlay as ``kubectl kustomize`` renders it (the deploy tests skip without kubectl)."""
    from gpuaware.deploy import checks as mc

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
