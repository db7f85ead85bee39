"""The Kubernetes cluster of `gpuaware up`: the embedded fake API server, or the real control plane.

Both give ``PodLoad`` and ``StackScheduler`` the same few calls (create an object, list the pods, when
a pod was bound, delete a pod) and the scheduler its API. ``real`` is ``KubeControlPlane`` (etcd,
kube-apiserver, kwok for the nodes; gpuaware is the only scheduler) with gpuaware's CRDs installed and
the admin kubeconfig exported as ``KUBECONFIG`` for this process, so that ``kubectl --kubeconfig
<path> get nodes,pods -A`` shows what the scheduler does while `up` runs.

What the real apiserver holds us to that the fake does not: a pod may not set ``spec.priority``
itself (the Priority admission plugin computes it from ``priorityClassName``), so the tenants'
priorities are PriorityClasses here; a namespace needs its ``default`` ServiceAccount before a pod.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

from gpuaware.local.fake_apiserver import BY_PATH, FakeApiServer
from gpuaware.local.kube_control_plane import KWOK_NODE_ANNOTATION, BinariesMissing, KubeControlPlane, find_binaries

KUBE_MODES = ("real", "embedded")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CRDS = DEPLOY / "base" / "crds"
DEVICE_CLASSES = DEPLOY / "components" / "dra-deviceclasses" / "deviceclasses.yaml"
PODS = BY_PATH[("", "v1", "pods")]
NODES = BY_PATH[("", "v1", "nodes")]
# The priorities PodLoad gives pods, as PriorityClasses (the real apiserver computes spec.priority).
PRIORITY_CLASSES = {200_000: "gpuaware-latency-sensitive", 5_000: "gpuaware-standard"}


def default_kube() -> tuple[str, str | None]:
    """("real", None) when the control plane's binaries are built, else ("embedded", why not real)."""
    try:
        find_binaries()
    except BinariesMissing as exc:
        return "embedded", f"running on the embedded fake API server: {exc}"
    return "real", None


class LocalCluster(Protocol):
    api_server: str | None
    kubeconfig: Path | None

    def start(self, namespaces: list[str]) -> None: ...
    def stop(self) -> None: ...
    def create(self, plural: str, obj: dict[str, Any], group: str = "", version: str = "v1") -> Any: ...
    def pods(self) -> list[dict[str, Any]]: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def bound_at(self, key: str) -> float | None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...
    def succeed_pod(self, namespace: str, name: str, start_unix: float, end_unix: float) -> None: ...
    def annotate_node(self, name: str, values: dict[str, str | None]) -> None: ...


class EmbeddedCluster:
    """The fake API server (in this process); it stamps bindings itself."""

    kubeconfig = None

    def __init__(self) -> None:
        self.fake = FakeApiServer()

    @property
    def api_server(self) -> str:
        return self.fake.url

    def start(self, namespaces: list[str]) -> None:
        self.fake.start()

    def stop(self) -> None:
        self.fake.stop()

    def create(self, plural: str, obj: dict[str, Any], group: str = "", version: str = "v1") -> Any:
        return self.fake.create(plural, obj, group=group, version=version)

    def pods(self) -> list[dict[str, Any]]:
        return self.fake.store.list(PODS, None, None)[0]

    def nodes(self) -> list[dict[str, Any]]:
        return self.fake.store.list(NODES, None, None)[0]

    def bound_at(self, key: str) -> float | None:
        return self.fake.store.bound_at.get(key)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.fake.store.delete(PODS, namespace, name)

    def succeed_pod(self, namespace: str, name: str, start_unix: float, end_unix: float) -> None:
        self.fake.store.patch(PODS, namespace, name, succeeded(start_unix, end_unix), True)

    def annotate_node(self, name: str, values: dict[str, str | None]) -> None:
        self.fake.store.patch(NODES, "", name, {"metadata": {"annotations": values}})


class RealCluster:
    """etcd, kube-apiserver and kwok; bindings are seen (with the list's resolution) by ``pods()``."""

    api_server = None  # the scheduler connects through KUBECONFIG

    def __init__(self) -> None:
        self.cp = KubeControlPlane(kwok=True)
        self._bound: dict[str, float] = {}
        self._core: Any = None

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    def start(self, namespaces: list[str]) -> None:
        from kubernetes import client, config

        self.cp.start()
        for crd in ("gpuqueues", "gpuworkloads"):
            self.cp.kubectl("apply", "-f", str(CRDS / f"gpuaware.io_{crd}.yaml"))
            self.cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
        self.cp.kubectl("apply", "-f", str(DEVICE_CLASSES))  # as deploy/components/dra-deviceclasses ships them
        for ns in namespaces:
            self.cp.create_namespace(ns)
        for value, name in PRIORITY_CLASSES.items():
            self.cp.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                           "value": value})
        os.environ["KUBECONFIG"] = str(self.cp.kubeconfig)
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.cp.kubeconfig), client_configuration=cfg)
        self._core = client.CoreV1Api(client.ApiClient(cfg))

    def stop(self) -> None:
        self.cp.stop()

    def create(self, plural: str, obj: dict[str, Any], group: str = "", version: str = "v1") -> Any:
        if plural == "nodes":
            key, value = KWOK_NODE_ANNOTATION
            obj = {**obj, "apiVersion": "v1", "kind": "Node",
                   "metadata": {**obj["metadata"], "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"}},
                   "status": {k: v for k, v in obj["status"].items() if k != "conditions"}}  # kwok keeps them
            return self.cp.apply(obj)
        if plural == "gpuqueues":
            return self.cp.apply({**obj, "apiVersion": f"{group}/{version}", "kind": "GPUQueue"})
        assert plural == "pods", plural
        spec = dict(obj["spec"])
        priority = spec.pop("priority", 0)
        if priority in PRIORITY_CLASSES:
            spec["priorityClassName"] = PRIORITY_CLASSES[priority]
        return self._core.create_namespaced_pod(obj["metadata"]["namespace"], {**obj, "spec": spec},
                                                _preload_content=False)

    def pods(self) -> list[dict[str, Any]]:
        import json

        items = json.loads(self._core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
        now = time.monotonic()
        for p in items:
            if p["spec"].get("nodeName"):
                self._bound.setdefault(f"{p['metadata']['namespace']}/{p['metadata']['name']}", now)
        return items

    def nodes(self) -> list[dict[str, Any]]:
        import json

        return json.loads(self._core.list_node(_preload_content=False).data)["items"]

    def bound_at(self, key: str) -> float | None:
        return self._bound.get(key)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)

    def succeed_pod(self, namespace: str, name: str, start_unix: float, end_unix: float) -> None:
        self._core.patch_namespaced_pod_status(name, namespace, succeeded(start_unix, end_unix),
                                               _preload_content=False)

    def annotate_node(self, name: str, values: dict[str, str | None]) -> None:
        self._core.patch_node(name, {"metadata": {"annotations": values}}, _preload_content=False)


def succeeded(start_unix: float, end_unix: float) -> dict[str, Any]:
    """The status a kubelet writes when a pod's one container (``main``, as ``make_pod`` names it) exits 0."""
    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    return {"status": {"phase": "Succeeded", "startTime": stamp(start_unix), "containerStatuses": [{
        "name": "main", "image": "registry.example.com/job:1.0", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": stamp(start_unix),
                                 "finishedAt": stamp(end_unix)}}}]}}


def make_cluster(kube: str) -> LocalCluster:
    if kube not in KUBE_MODES:
        raise ValueError(f"--kube {kube!r}: use one of {', '.join(KUBE_MODES)}")
    return RealCluster() if kube == "real" else EmbeddedCluster()
