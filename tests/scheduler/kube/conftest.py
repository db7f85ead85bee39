"""Fixtures for the live scheduler's parts: a cache listed from the session's real apiserver (``kube``), and API
calls to it as the shipped gpuaware-scheduler ServiceAccount."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest

from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.tasks import Tasks
from gpuaware.scheduler.metrics import SchedulerStats
from tests import support
from tests.real_kube import Kube

WaitFor = Callable[..., Awaitable[None]]


@pytest.fixture
def stats() -> SchedulerStats:
    return SchedulerStats()


@pytest.fixture
def calls(kube: Kube, stats: SchedulerStats) -> Iterator[ApiCalls]:
    api_calls = ApiCalls(kube.api(), stats, workers=4)
    yield api_calls
    api_calls.shutdown()


@pytest.fixture
async def tasks() -> Tasks:
    return Tasks()


@pytest.fixture
def listed(kube: Kube) -> Callable[[], ClusterCache]:
    """A cache as the informers' first list leaves it: the apiserver's nodes, pods and GPUQueues."""

    def list_cache() -> ClusterCache:
        cache = ClusterCache(scheduler_name="gpuaware")
        cache.sync_nodes(kube.objects("nodes"))
        cache.sync_pods(kube.objects("pods"))
        cache.sync_queues(kube.objects("gpuqueues", group="gpuaware.io", version="v1alpha1"))
        return cache

    return list_cache


@pytest.fixture
def wait_for() -> WaitFor:
    async def wait(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
        await support.wait_for(cond, timeout, what, poll_s=0.02)

    return wait
