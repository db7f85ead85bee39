"""The cache as its readers see it: read-only mappings over ``ClusterCache``'s state.

kube-scheduler's plugins read a snapshot of its cache and never write it; the parts here that only read (the
gauges, GPUQueue status, power caps, ``FailedScheduling`` reports) are handed a ``CacheView``. Each property
wraps the cache's map of the moment (the cache replaces its maps on a re-list), so a view taken once
follows the cache and nothing is copied per pass. The model (``cluster``) is the cache's own: readers
read it; only the cache and the pass change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuaware.scheduler.core.cluster import ClusterState
from gpuaware.scheduler.core.preemption import Running
from gpuaware.scheduler.kube.objects import PodWorkload
from gpuaware.scheduler.kube.podgroups import PodGroups
from gpuaware.scheduler.kube.queues import Queue
from gpuaware.scheduler.kube.scheduling_queue import Rejected

if TYPE_CHECKING:
    from gpuaware.scheduler.kube.cache import Assumed, ClusterCache


class CacheView:
    def __init__(self, cache: ClusterCache):
        self._cache = cache

    @property
    def cluster(self) -> ClusterState:
        return self._cache.cluster

    @property
    def nodes(self) -> Mapping[str, dict[str, Any]]:
        return MappingProxyType(self._cache.nodes)

    @property
    def pods(self) -> Mapping[str, dict[str, Any]]:
        return MappingProxyType(self._cache.pods)

    @property
    def running(self) -> Mapping[str, Running]:
        return MappingProxyType(self._cache.running)

    @property
    def assumed(self) -> Mapping[str, Assumed]:
        return MappingProxyType(self._cache.assumed)

    @property
    def pending(self) -> Mapping[str, PodWorkload]:
        return MappingProxyType(self._cache.queue.pending)

    @property
    def rejected(self) -> Mapping[str, Rejected]:
        return MappingProxyType(self._cache.queue.rejected)

    @property
    def cordoned(self) -> Mapping[str, set[int]]:
        return MappingProxyType(self._cache.cordoned)

    @property
    def podgroups(self) -> PodGroups:
        """Read it, never call its ``sync``/``event``: only the cache's informer handlers do."""
        return self._cache.podgroups

    @property
    def scheduler_name(self) -> str:
        return self._cache.scheduler_name

    @property
    def queues(self) -> Mapping[str, Queue]:
        return MappingProxyType(self._cache.tenancy.queues)
