"""Fixtures for the live scheduler's parts: the fake API server, a cache listed from it, API calls to it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest

from gpuaware.local.fake_apiserver import FakeApiServer
from plumbing.kube.api import KubeApi, connect
from scheduler.kube.cache import ClusterCache
from scheduler.kube.calls import ApiCalls
from scheduler.kube.tasks import Tasks
from scheduler.metrics import SchedulerStats
from tests import support

WaitFor = Callable[..., Awaitable[None]]


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def stats() -> SchedulerStats:
    return SchedulerStats()


@pytest.fixture
def calls(fake: FakeApiServer, stats: SchedulerStats) -> Iterator[ApiCalls]:
    api_calls = ApiCalls(KubeApi(connect(fake.url)), stats, workers=4)
    yield api_calls
    api_calls.shutdown()


@pytest.fixture
async def tasks() -> Tasks:
    return Tasks()


@pytest.fixture
def listed(fake: FakeApiServer) -> Callable[[], ClusterCache]:
    """A cache as the informers' first list leaves it: the fake's nodes, pods and GPUQueues."""

    def list_cache() -> ClusterCache:
        cache = ClusterCache(scheduler_name="gpuaware")
        cache.sync_nodes(fake.objects("nodes"))
        cache.sync_pods(fake.objects("pods"))
        cache.sync_queues(fake.objects("gpuqueues", group="gpuaware.io", version="v1alpha1"))
        return cache

    return list_cache


@pytest.fixture
def wait_for() -> WaitFor:
    async def wait(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
        await support.wait_for(cond, timeout, what, poll_s=0.02)

    return wait
