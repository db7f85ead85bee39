"""The UIDs of the pods on this node, for per-pod values on shared GPUs (``agent.pod_uids``), and their labels
(for ``agent.metrics_pod_labels``).

The kubelet's PodResources API names the pods holding a GPU but carries no UID, while a GPU
process is tied to its pod only by the UID in its cgroup; ``PodResourcesWatcher.uids`` joins the
two. This fills it from a pod informer limited to this node (field selector
``spec.nodeName=<node>``), exactly as dcgm-exporter does with ``kubernetes.enablePodUID``.

Least privilege: it is off by default. Reading pods needs ``list``/``watch`` of pods cluster-wide
(RBAC cannot limit a grant to one node's pods; the selector is the client's restraint, not the
server's), i.e. every pod's spec, so the base RBAC does not grant it and the opt-in component
``deploy/components/agent-pod-uids`` adds it together with turning this on (docs/security.md).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuaware.agent.podresources import PodResourcesWatcher
from gpuaware.plumbing.kube.reach import api_configured

log = logging.getLogger(__name__)


def _key(pod: dict[str, Any]) -> tuple[tuple[str, str], str]:
    meta = pod["metadata"]
    return (meta.get("namespace", ""), meta["name"]), meta["uid"]


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("labels") or {})


class PodUids:
    """Informer callbacks that keep ``watcher.uids`` equal to the node's pods.

    Copy-on-write: each change builds a new dict and swaps it in with one assignment, so the scrape
    thread reading ``uids`` never sees a dict being changed (the callbacks run in the informer's
    one thread, so writers never race each other).
    """

    def __init__(self, watcher: PodResourcesWatcher):
        self.watcher = watcher
        self.informer: Any = None  # gpuaware.plumbing.kube.api.Informer, once started

    def on_sync(self, items: list[dict[str, Any]]) -> None:
        self.watcher.labels = {_key(p)[0]: _labels(p) for p in items}
        self.watcher.uids = dict(_key(p) for p in items)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        key, uid = _key(obj)
        uids, labels = dict(self.watcher.uids), dict(self.watcher.labels)
        if kind in ("ADDED", "MODIFIED"):
            uids[key], labels[key] = uid, _labels(obj)
        elif kind == "DELETED":
            if uids.get(key) != uid:  # a pod of the same name already replaced it
                return
            del uids[key]
            labels.pop(key, None)
        else:
            return
        self.watcher.labels = labels
        self.watcher.uids = uids

    def start(self, api: Any, node: str) -> PodUids:
        """Follow the pods of ``node`` through ``api`` (a ``gpuaware.plumbing.kube.api.KubeApi``)."""
        from gpuaware.plumbing.kube.api import Informer, WatchSpec

        spec = WatchSpec("pods-on-node", api.core.list_pod_for_all_namespaces, f"spec.nodeName={node}")
        self.informer = Informer(spec, self.on_sync, self.on_event).start()
        log.info("following the UIDs of the pods on %s (agent.pod_uids)", node)
        return self

    def stop(self) -> None:
        if self.informer is not None:
            self.informer.stop()

    @classmethod
    def from_settings(cls, watcher: PodResourcesWatcher, node: str, api_server: str | None,
                      api: Any = None) -> PodUids | None:
        """Started on ``api`` (else a client of ``api_server`` or the in-cluster config); None without an API."""
        if api is None:
            if not api_configured(api_server):
                log.warning("agent.pod_uids is on but there is no Kubernetes API to read pods from")
                return None
            from gpuaware.plumbing.kube.api import KubeApi, connect

            api = KubeApi(connect(api_server, pool_size=2))
        return cls(watcher).start(api, node)
