"""The control plane's own ceiling for ``gpuaware bench scheduler``: a "scheduler" that decides nothing.

It watches its pods (``schedulerName: gpuaware-ceiling``) and binds each to the next node in turn that still
has a whole GPU by count, with the same API client, the same number of Bindings in flight as gpuaware's
binder (``bind_workers``) and the pod's UID as precondition, and writes nothing else (no Event). What it
reaches is the most pods/s any scheduler binding one pod per Binding can get from this apiserver, etcd and
kwok on this machine under its load at that moment; ``gpuaware``'s ``pods_per_s`` next to it, in the same
run, says how much of that gpuaware's decisions and writes cost. A 2-core box running the apiserver, etcd,
kwok and the pod-creating driver beside the scheduler cannot be judged against an absolute pods/s target
otherwise. ``DraCeilingBinder`` is the same for pods with ResourceClaims (``bench scheduler --dra``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuaware.plumbing.kube.api import TRANSPORT_ERRORS, Informer, KubeApi, WatchSpec, wait_synced
from gpuaware.scheduler.kube.dra.claims import FINALIZER

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
        plan = self._plan(pod)
        if plan is None:
            self.failed += 1
            return
        node = self._node(plan[0])
        if node is None:
            return  # nothing fits by count: it stays pending, as under a scheduler
        self._pool.submit(self._bind, pod, node, plan[1])

    def _plan(self, pod: dict[str, Any]) -> tuple[int, Any] | None:
        """(whole GPUs it takes by count, what ``_write`` needs), or None when it cannot be bound here."""
        return _gpus(pod), None

    def _node(self, gpus: int) -> str | None:
        with self._lock:
            for _ in range(len(self.free)):
                name = next(self._order)
                if self.free[name] >= gpus:
                    self.free[name] -= gpus
                    return name
        return None

    def _bind(self, pod: dict[str, Any], node: str, plan: Any) -> None:
        meta = pod["metadata"]
        try:
            self._write(pod, node, plan)
            self.api.bind(meta["namespace"], meta["name"], node, uid=meta["uid"])
            self.bound += 1
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            self.failed += 1
            log.warning("ceiling: binding %s/%s to %s failed: %s", meta["namespace"], meta["name"], node, exc)

    def _write(self, pod: dict[str, Any], node: str, plan: Any) -> None:
        """What goes before the Binding (nothing here)."""


class DraCeilingBinder(CeilingBinder):
    """The ceiling for pods with ResourceClaims (``bench scheduler --dra``): each claim gets the next free devices
    of the node in turn, by count (its requests' ``count``; selectors not read), and the writes gpuaware and
    kube-scheduler make per pod: the claim's delete-protection finalizer (PUT), its allocation and reservation
    (PUT of the status), then the Binding. ``slices``: the nodes' ResourceSlices as published."""

    def __init__(self, api: KubeApi, slices: list[dict[str, Any]], workers: int):
        self.devices: dict[str, list[tuple[str, str]]] = {}  # node -> free (driver, device), in order
        for sl in slices:
            spec = sl["spec"]
            self.devices.setdefault(spec["nodeName"], []).extend((spec["driver"], d["name"]) for d in spec["devices"])
        super().__init__(api, [(n, len(d)) for n, d in self.devices.items()], workers)
        self.claims: dict[str, dict[str, Any]] = {}
        self._claims = Informer(WatchSpec("resourceclaims", api.resource.list_resource_claim_for_all_namespaces),
                                self._claims_sync, self._claim_event)

    def start(self, sync_timeout_s: float = 120.0) -> None:
        self._claims.start()
        wait_synced([self._claims], sync_timeout_s)  # the bench creates the claims before the pods
        super().start(sync_timeout_s)

    def stop(self) -> None:
        self._claims.stop()
        super().stop()

    def _claims_sync(self, items: list[dict[str, Any]]) -> None:
        self.claims = {_key(c): c for c in items}

    def _claim_event(self, kind: str, claim: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.claims.pop(_key(claim), None)
        else:
            self.claims[_key(claim)] = claim

    def _plan(self, pod: dict[str, Any]) -> tuple[int, Any] | None:
        """Its claims with the devices each takes by count, read once; None (counted as failed, not bound) when
        a claim of it is not in the informer."""
        ns = pod["metadata"]["namespace"]
        claims = []
        for ref in pod["spec"].get("resourceClaims") or []:
            claim = self.claims.get(f"{ns}/{ref.get('resourceClaimName')}")
            if claim is None:
                log.warning("ceiling: %s/%s names claim %s, which is not there", ns, pod["metadata"]["name"],
                            ref.get("resourceClaimName"))
                return None
            claims.append((claim, sum(int(r.get("exactly", {}).get("count", 1))
                                      for r in claim["spec"]["devices"]["requests"])))
        return sum(n for _, n in claims), claims

    def _write(self, pod: dict[str, Any], node: str, plan: Any) -> None:
        meta = pod["metadata"]
        for claim, wanted in plan:
            with self._lock:
                picked, self.devices[node] = self.devices[node][:wanted], self.devices[node][wanted:]
            request = claim["spec"]["devices"]["requests"][0]["name"]
            protected = self.api.update_claim({**claim, "metadata": {
                **claim["metadata"], "finalizers": [*claim["metadata"].get("finalizers", []), FINALIZER]}})
            self.api.write_claim_status({**protected, "status": {
                "allocation": {"devices": {"results": [{"request": request, "driver": driver, "pool": node,
                                                        "device": device} for driver, device in picked]},
                               "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                   {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "reservedFor": [{"resource": "pods", "name": meta["name"], "uid": meta["uid"]}]}})


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _gpus(pod: dict[str, Any]) -> int:
    """Whole GPUs the pod holds by count: its nvidia.com/gpu limit, else one for a fraction (gpu-milli)."""
    n = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in pod["spec"]["containers"])
    if not n and "gpuaware.io/gpu-milli" in (pod["metadata"].get("annotations") or {}):
        return 1
    return n
