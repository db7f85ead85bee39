"""build_scheduler: the one wiring of ``gpuaware scheduler``, ``up`` and the bench — ready only once listed,
binds, serves metrics and the extender, holds a Lease when asked, publishes decisions, stops cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer

from gpuaware.contract import topics
from gpuaware.contract.events import DecisionAction, SchedulerDecision, decode
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.processes import free_port
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.wiring import SchedulerRuntime, build_scheduler
from tests.real_kube import Kube
from tests.support import wait_for as _wait_for

FAST = {"pass_interval_s": 0.02, "extender_port": 0}


async def wait_for(cond, timeout: float = 15.0, what: str = "condition") -> None:
    await _wait_for(cond, timeout, what)


@contextlib.asynccontextmanager
async def running(runtime: SchedulerRuntime) -> AsyncIterator[SchedulerRuntime]:
    stop = asyncio.Event()
    task: asyncio.Task | None = None
    try:
        await runtime.start()
        task = asyncio.create_task(runtime.run(stop))
        yield runtime
    finally:
        stop.set()
        if task is not None:
            await task
        await runtime.stop()


def bound(kube: Kube) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in kube.objects("pods")}


@pytest.fixture
def as_scheduler(kube: Kube, monkeypatch) -> None:
    """The process reads its API from KUBECONFIG, as in its pod: the shipped ServiceAccount's credentials."""
    monkeypatch.setenv("KUBECONFIG", str(kube.accounts["gpuaware-scheduler"]))


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


async def test_without_kafka_it_lists_binds_and_serves_metrics_and_the_extender(kube, as_scheduler):
    kube.create("nodes", make_node("n0", gpus=2))
    kube.create("pods", make_pod("p", gpus=1))
    port, metrics = free_port(), free_port()
    runtime = build_scheduler(SchedulerSettings(**{**FAST, "extender_port": port}))
    assert runtime.view is None and runtime.feed is None and runtime.publishers is None
    runtime.serve_metrics("127.0.0.1", metrics)
    assert not runtime.ready.is_set()
    async with running(runtime):
        assert runtime.ready.is_set()
        assert (await asyncio.to_thread(get, f"http://127.0.0.1:{port}/readyz"))[0] == 200
        await wait_for(lambda: bound(kube)["p"] == "n0", what="pod bound")
        await wait_for(lambda: runtime.stats.decisions[("PLACE", "fits")] == 1, what="decision counted")
        text = (await asyncio.to_thread(get, f"http://127.0.0.1:{metrics}/metrics"))[1]
        assert 'gpuaware_scheduler_decisions_total{action="PLACE",reason="fits"} 1.0' in text
        assert "gpuaware_scheduler_leader 1.0" in text


async def test_with_leader_election_it_schedules_once_it_holds_the_lease(kube, as_scheduler):
    kube.create("nodes", make_node("n0", gpus=1))
    kube.create("pods", make_pod("p", gpus=1))
    settings = SchedulerSettings(leader_elect=True, lease_namespace="gpuaware",
                                 lease_duration_s=2.0, renew_deadline_s=1.5, renew_every_s=0.5, **FAST)
    async with running(build_scheduler(settings)) as runtime:
        await wait_for(lambda: bound(kube)["p"] == "n0", what="pod bound by the leader")
        assert runtime.live.leading.is_set()
        lease = kube.get("leases", settings.lease_name, "gpuaware")
        assert lease is not None and lease["spec"]["holderIdentity"]


async def test_a_failed_start_stops_cleanly():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    runtime = build_scheduler(SchedulerSettings(api_server=url, **FAST))
    with pytest.raises(TimeoutError):
        await runtime.start(sync_timeout_s=0.5)
    await runtime.stop()
    assert not runtime.ready.is_set()


async def test_with_kafka_decisions_are_published_unless_asked_not_to(kafka_settings: KafkaSettings, unique: str,
                                                                   kube: Kube, as_scheduler: None):
    for name, publish in ((f"quiet-{unique}", False), (f"pub-{unique}", True)):  # quiet first: see below
        kube.clean()  # the node and the first run's pod go: each run starts on an empty cluster
        kube.create("nodes", make_node("n0", gpus=1))
        kube.create("pods", make_pod(name, gpus=1))
        runtime = build_scheduler(SchedulerSettings(**FAST), kafka_settings, publish=publish)
        assert runtime.feed is not None and (runtime.publishers is not None) == publish
        async with running(runtime):
            await wait_for(lambda n=name, f=kube: bound(f)[n] == "n0", what=f"{name} bound")
    # Read until the published one, then to the end: a record of the quiet run would be there by then.
    records = await decisions(kafka_settings, until=f"default/pub-{unique}")
    assert [r.action for r in records if r.workload_id == f"default/pub-{unique}"] == [DecisionAction.PLACE]
    assert not [r for r in records if r.workload_id == f"default/quiet-{unique}"]


async def decisions(kafka: KafkaSettings, until: str, timeout_s: float = 20.0) -> list[SchedulerDecision]:
    consumer = AIOKafkaConsumer(topics.DECISIONS, **kafka.consumer_kwargs(None))
    await consumer.start()
    found: list[SchedulerDecision] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            if not batch and any(r.workload_id == until for r in found):
                return found
            for msgs in batch.values():
                found += [r for m in msgs if isinstance(r := decode(m.value), SchedulerDecision)]
    finally:
        await consumer.stop()
    raise AssertionError(f"no decision for {until} on {topics.DECISIONS}")
