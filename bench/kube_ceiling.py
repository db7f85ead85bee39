"""The control plane's own ceiling for ``gpuaware bench scheduler``: a "scheduler" that decides nothing.

It watches its pods (``schedulerName: gpuaware-ceiling``) and binds each to the next node in turn that still
has a whole GPU by count, with the same API client, the same number of Bindings in flight as gpuaware's
binder (``bind_workers``) and the pod's UID as precondition, and writes nothing else (no Event). What it
reaches is the most pods/s any scheduler binding one pod per Binding can get from this apiserver, etcd and
kwok on this machine under its load at that moment; ``gpuaware``'s ``pods_per_s`` next to it, in the same
run, says how much of that gpuaware's decisions and writes cost. A 2-core box running the apiserver, etcd,
kwok and the pod-creating driver beside the scheduler cannot be judged against an absolute pods/s target
otherwise.
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from plumbing.kube.api import TRANSPORT_ERRORS, Informer, KubeApi, WatchSpec, wait_synced

SCHEDULER_NAME = "gpuaware-ceiling"
log = logging.getLogger(__name__)


class CeilingBinder:
    """Binds every pending pod of ``SCHEDULER_NAME`` round-robin over ``nodes`` ((name, whole GPUs))."""

    def __init__(self, api: KubeApi, nodes: list[tuple[str, int]], workers: int):
        self.api = api
        self.free = {name: gpus for name, gpus in nodes}
        self._order = itertools.cycle([name for name, _ in nodes])
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ceiling-bind")
        self.bound = 0
        self.failed = 0
        spec = WatchSpec("pods", api.core.list_pod_for_all_namespaces,
                         f"spec.schedulerName={SCHEDULER_NAME},spec.nodeName=")
        self._informer = Informer(spec, self._on_sync, self._on_event)

    def start(self, sync_timeout_s: float = 120.0) -> None:
        self._informer.start()
        wait_synced([self._informer], sync_timeout_s)

    def stop(self) -> None:
        self._informer.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _on_sync(self, items: list[dict[str, Any]]) -> None:
        for pod in items:
            self._on_event("ADDED", pod)

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if kind != "ADDED" or pod["spec"].get("nodeName") or meta["uid"] in self._seen:
            return
        self._seen.add(meta["uid"])
        node = self._node(_gpus(pod))
        if node is None:
            return  # nothing fits by count: it stays pending, as under a scheduler
        self._pool.submit(self._bind, meta["namespace"], meta["name"], meta["uid"], node)

    def _node(self, gpus: int) -> str | None:
        with self._lock:
            for _ in range(len(self.free)):
                name = next(self._order)
                if self.free[name] >= gpus:
                    self.free[name] -= gpus
                    return name
        return None

    def _bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        try:
            self.api.bind(namespace, name, node, uid=uid)
            self.bound += 1
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            self.failed += 1
            log.warning("ceiling: binding %s/%s to %s failed: %s", namespace, name, node, exc)


def _gpus(pod: dict[str, Any]) -> int:
    """Whole GPUs the pod holds by count: its nvidia.com/gpu limit, else one for a fraction (gpu-milli)."""
    n = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in pod["spec"]["containers"])
    if not n and "gpuaware.io/gpu-milli" in (pod["metadata"].get("annotations") or {}):
        return 1
    return n
