"""The session's real Kubernetes control plane as the Kubernetes tests use it.

One ``KubeControlPlane`` (etcd, kube-apiserver v1.36, kwok) runs for the whole session (the
``kube_cp`` fixture in conftest.py): it carries our CRDs (schemas and CEL validated by the server) and
the production overlay's RBAC exactly as it ships. Each test gets a :class:`Kube` (the ``kube``
fixture): it creates and reads objects as the admin, hands out clients that act as the shipped
ServiceAccounts (the live scheduler runs as ``gpuaware-scheduler``, so a missing or excess permission
shows), and on the way out deletes what the test left, so the next test's scheduler sees an empty
cluster (there is no kube-controller-manager: nothing else would collect them).

Nodes whose Ready condition is True are handed to kwok, which keeps them Ready, runs the pods bound to
them and finishes their graceful deletion (an evicted pod is gone only once kwok, the "kubelet", says so).
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuaware.local.kube_control_plane import KWOK_NODE_ANNOTATION, KubeControlPlane
from gpuaware.plumbing.kube.api import KubeApi

NS = "gpuaware"  # where the components run and hold their Leases (the shipped Roles are there)
CRD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "base" / "crds"
# The plurals the tests create that are not namespaced.
CLUSTER_SCOPED = frozenset({"nodes", "namespaces", "gpuqueues", "priorityclasses"})
_KINDS = {"pods": "Pod", "nodes": "Node", "namespaces": "Namespace", "events": "Event", "leases": "Lease",
          "poddisruptionbudgets": "PodDisruptionBudget", "priorityclasses": "PriorityClass",
          "gpuqueues": "GPUQueue", "gpuworkloads": "GPUWorkload", "podgroups": "PodGroup", "workloads": "Workload"}
_GROUPS = {"priorityclasses": ("scheduling.k8s.io", "v1"), "leases": ("coordination.k8s.io", "v1"),
           "poddisruptionbudgets": ("policy", "v1")}


def api_client(kubeconfig: Path, pool_size: int = 32) -> client.ApiClient:
    """A client that acts as whoever ``kubeconfig`` names (binds and events run in parallel: a pool)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def prepare(cp: KubeControlPlane, rbac: list[dict[str, Any]]) -> None:
    """Our CRDs (established) and the shipped RBAC, once per control plane."""
    cp.create_namespace(NS)
    for path in sorted(CRD_DIR.glob("*.yaml")):
        cp.kubectl("apply", "--server-side", "-f", str(path))
    cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    cp.apply(yaml.safe_dump_all(rbac))


class Kube:
    """One test's hold on the shared control plane: create/read/delete as the admin, act as a ServiceAccount."""

    def __init__(self, cp: KubeControlPlane, accounts: dict[str, Path]):
        self.cp = cp
        self.accounts = accounts  # ServiceAccount name (in NS) -> its kubeconfig
        self.admin = api_client(cp.kubeconfig)
        self._namespaces: set[str] = set()

    # -- raw REST as the admin ------------------------------------------------------------------------
    @staticmethod
    def path(plural: str, group: str = "", version: str = "v1", namespace: str | None = None,
             name: str | None = None) -> str:
        group, version = _GROUPS.get(plural, (group, version)) if not group else (group, version)
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        ns = f"/namespaces/{namespace}" if namespace and plural not in CLUSTER_SCOPED else ""
        return f"{base}{ns}/{plural}" + (f"/{name}" if name else "")

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        url = self.admin.configuration.host + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        resp = self.admin.rest_client.request(method, url, headers=headers, body=body, _request_timeout=30)
        data = resp.read()
        if resp.status >= 400:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = data
            raise exc
        return json.loads(data or b"{}")

    # -- what the fake's tests called -----------------------------------------------------------------
    def create(self, plural: str, obj: dict[str, Any], group: str = "", version: str = "v1") -> dict[str, Any]:
        """Create ``obj`` as the admin; kinds and apiVersions are filled in, namespaces made on first use.

        A pod's ``spec.priority`` becomes a PriorityClass of that value: the apiserver's Priority
        admission refuses a pod that sets the integer itself (the fake took it as given)."""
        obj = json.loads(json.dumps(obj))
        group, version = _GROUPS.get(plural, (group, version)) if not group else (group, version)
        obj.setdefault("apiVersion", f"{group}/{version}" if group else version)
        obj.setdefault("kind", _KINDS[plural])
        namespace = obj.get("metadata", {}).get("namespace") or ("default" if plural not in CLUSTER_SCOPED else None)
        if namespace:
            obj["metadata"]["namespace"] = namespace
            self.namespace(namespace)
        if plural == "nodes":
            self._kwok(obj)
        if plural == "pods":
            self._priority_class(obj)
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return self.request("POST", self.path(plural, group, version, namespace), obj)
            except ApiException as exc:
                # The Priority admission plugin reads PriorityClasses from an informer: one created a moment
                # ago may not be in it yet ("no PriorityClass with name ... was found").
                if exc.status != 403 or b"no PriorityClass with name" not in (exc.body or b"") \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def objects(self, plural: str, group: str = "", version: str = "v1") -> list[dict[str, Any]]:
        return self.request("GET", self.path(plural, group, version)).get("items") or []

    def get(self, plural: str, name: str, namespace: str | None = "default", group: str = "",
            version: str = "v1") -> dict[str, Any] | None:
        try:
            return self.request("GET", self.path(plural, group, version, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, plural: str, name: str, namespace: str | None = "default", group: str = "",
               version: str = "v1", grace_s: int | None = 0) -> None:
        """Delete now (grace 0: no kubelet to wait for) or, with ``grace_s=None``, as a user would."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        self.request("DELETE", self.path(plural, group, version, namespace, name), body)

    def end_pod(self, name: str, phase: str, start: str, end: str, namespace: str = "default") -> None:
        """What the kubelet writes when the pod's one container exits (0: ``Succeeded``), through the status
        subresource; on a conflict (kwok writes the status too) it reads the pod again."""
        path = self.path("pods", namespace=namespace, name=name)
        for _ in range(20):
            pod = self.request("GET", path)
            container = pod["spec"]["containers"][0]
            pod["status"].update(phase=phase, startTime=start, containerStatuses=[{
                "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1,
                                                            "startedAt": start, "finishedAt": end}}}])
            try:
                self.request("PUT", path + "/status", pod)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise AssertionError(f"could not end pod {namespace}/{name}")

    def namespace(self, name: str) -> str:
        """``name`` and its ``default`` ServiceAccount (no controller-manager makes it), once."""
        if name not in self._namespaces:
            for path, body in (("/api/v1/namespaces", {"metadata": {"name": name}}),
                               (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}})):
                try:
                    self.request("POST", path, body)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            self._namespaces.add(name)
        return name

    # -- acting as a component ------------------------------------------------------------------------
    def api(self, account: str = "gpuaware-scheduler") -> KubeApi:
        """The API as ServiceAccount ``gpuaware/account`` sees it, with exactly the shipped RBAC."""
        return KubeApi(api_client(self.accounts[account]))

    def agent_api(self, node: str) -> KubeApi:
        """The API as the agent on ``node`` sees it: the gpuaware-agent token the kubelet mounts in its pod,
        bound to that pod and so to the node (the admission policy keys the agent's writes on that claim)."""
        name = f"gpuaware-agent-{node}"[:63]
        pod = self.create("pods", {"metadata": {"name": name, "namespace": NS}, "spec": {
            "nodeName": node, "serviceAccountName": "gpuaware-agent",
            "containers": [{"name": "agent", "image": "registry.invalid/gpuaware:1"}]}})
        review = self.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/gpuaware-agent/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name,
                                   "uid": pod["metadata"]["uid"]}}})
        cfg = yaml.safe_load(self.cp.kubeconfig.read_text())
        cfg["users"] = [{"name": name, "user": {"token": review["status"]["token"]}}]
        for ctx in cfg["contexts"]:
            ctx["context"]["user"] = name
        assert self.cp.workdir is not None
        path = self.cp.workdir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return KubeApi(api_client(path))

    # -- helpers ----------------------------------------------------------------------------------------
    @staticmethod
    def _kwok(node: dict[str, Any]) -> None:
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in node.get("status", {}).get("conditions", []))
        if ready:  # kwok would make a NotReady node Ready: those stay the test's own
            node["metadata"].setdefault("annotations", {})[KWOK_NODE_ANNOTATION[0]] = KWOK_NODE_ANNOTATION[1]

    def _priority_class(self, pod: dict[str, Any]) -> None:
        priority = pod.get("spec", {}).pop("priority", None)
        if not priority or pod["spec"].get("priorityClassName"):
            return
        name = f"test-priority-{priority}"
        try:
            self.request("POST", self.path("priorityclasses"), {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": priority})
        except ApiException as exc:
            if exc.status != 409:
                raise
        pod["spec"]["priorityClassName"] = name

    def clean(self) -> None:
        """Delete what tests make (pods, events, PDBs, GPUQueues, GPUWorkloads, nodes, the scheduler's Lease)."""
        grace = {"gracePeriodSeconds": 0}
        # One list per kind across namespaces, then a collection delete only where something is left.
        for plural, group, version in (("pods", "", "v1"), ("events", "", "v1"),
                                       ("poddisruptionbudgets", "policy", "v1"),
                                       ("gpuworkloads", "gpuaware.io", "v1alpha1")):
            for ns in sorted({o["metadata"]["namespace"] for o in self.objects(plural, group, version)}):
                self.request("DELETE", self.path(plural, group, version, ns), None, grace)
        self.request("DELETE", self.path("leases", namespace=NS), None, grace)
        self.request("DELETE", self.path("gpuqueues", "gpuaware.io", "v1alpha1"), None, grace)
        self.request("DELETE", self.path("nodes"), None, grace)
