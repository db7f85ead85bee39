"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, kwok) built by realparts/build-kube.sh.

Skipped when the binaries are not built, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpuaware.local.fake_apiserver import FakeApiServer
from gpuaware.local.kube_control_plane import (
    KWOK_NODE_ANNOTATION,
    BinariesMissing,
    KubeControlPlane,
    find_binaries,
)
from gpuaware.local.processes import pid_alive
from gpuaware.local.realparts import pinned_versions
from gpuaware.plumbing.kube.api import KubeApi, PodReplaced, connect
from tests.support import REPO, need

CRDS = REPO / "deploy" / "base" / "crds"
PINS = pinned_versions()


def _need_binaries() -> None:
    need(find_binaries, BinariesMissing)  # skipped without them, failed under CI=true


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    _need_binaries()
    with KubeControlPlane(scheduler=True, kwok=True) as plane:
        yield plane


def _eventually(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not so after {timeout_s:.0f}s (last: {last!r})")


def _get(cp: KubeControlPlane, *args: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _kwok_node(cp: KubeControlPlane) -> str:
    name = _name("kwok-node")
    key, value = KWOK_NODE_ANNOTATION
    cp.apply({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    })
    return name


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


def _pod(name: str, *, scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/none:0",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def test_missing_binaries_name_the_build_script(tmp_path: Path) -> None:
    with pytest.raises(BinariesMissing, match=r"realparts/build-kube\.sh"):
        find_binaries(tmp_path)


def test_version_is_the_pinned_one(cp: KubeControlPlane) -> None:
    served = json.loads(cp.kubectl("get", "--raw", "/version").stdout)
    assert served["gitVersion"] == PINS["KUBERNETES_VERSION"]
    versions = cp.versions()
    assert versions["kube-apiserver"] == versions["kube-scheduler"] == versions["kubectl"] == PINS["KUBERNETES_VERSION"]
    assert versions["etcd"] == PINS["ETCD_VERSION"].removeprefix("v")
    assert versions["kwok"] == PINS["KWOK_VERSION"]
    assert all(cp.running().values()), cp.running()


def test_crd_applies_and_the_server_validates_its_objects(cp: KubeControlPlane) -> None:
    cp.kubectl("apply", "-f", str(CRDS / "gpuaware.io_gpuqueues.yaml"))
    cp.kubectl("wait", "--for=condition=Established", "crd/gpuqueues.gpuaware.io", "--timeout=60s")
    path = "/apis/gpuaware.io/v1alpha1/gpuqueues"

    def post(obj: dict[str, Any]) -> Any:
        return cp.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(obj), check=False)

    good = {"apiVersion": "gpuaware.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": _name("queue")},
            "spec": {"tenant": "team-a", "namespaces": ["team-a"]}}
    created = post(good)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["weight"] == 1  # the schema's default, applied by the server

    bad = {**good, "metadata": {"name": _name("queue")},
           "spec": {"tenant": "Team_A!", "namespaces": [], "weight": 0.001}}
    rejected = post(bad)
    assert rejected.returncode != 0
    assert "Invalid" in rejected.stderr, rejected.stderr
    for field in ("spec.tenant", "spec.namespaces", "spec.weight"):
        assert field in rejected.stderr, rejected.stderr
    assert cp.kubectl("get", "gpuqueue", bad["metadata"]["name"], check=False).returncode != 0


def test_kwok_node_becomes_ready_and_a_bound_pod_runs(cp: KubeControlPlane) -> None:
    node = _kwok_node(cp)
    _eventually(lambda: _ready(_get(cp, "node", node)), f"node {node} Ready through kwok")

    pod = _name("bound")
    cp.apply(_pod(pod, scheduler="nobody-schedules-this"))  # kube-scheduler leaves it alone
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod, "namespace": "default"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    cp.kubectl("create", "--raw", f"/api/v1/namespaces/default/pods/{pod}/binding", "-f", "-",
                input=json.dumps(binding))
    got = _eventually(lambda: (p := _get(cp, "pod", pod))["status"].get("phase") == "Running" and p,
                      f"pod {pod} Running through kwok")
    assert got["spec"]["nodeName"] == node


def test_kube_scheduler_schedules_onto_the_kwok_node(cp: KubeControlPlane) -> None:
    node = _kwok_node(cp)
    _eventually(lambda: _ready(_get(cp, "node", node)), f"node {node} Ready through kwok")
    pod = _name("scheduled")
    manifest = _pod(pod)
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    cp.apply(manifest)
    got = _eventually(lambda: (p := _get(cp, "pod", pod))["status"].get("phase") == "Running" and p,
                      f"pod {pod} scheduled by kube-scheduler and Running")
    assert got["spec"]["nodeName"] == node
    events = _get(cp, "events", "--field-selector", f"involvedObject.name={pod},reason=Scheduled")["items"]
    assert any((e.get("reportingComponent") or e.get("source", {}).get("component")) == "default-scheduler"
               for e in events), events


def _bind_with_the_uid_of_a_deleted_pod(api: KubeApi, name: str) -> dict[str, Any]:
    """Create a pod, delete it, create one of the same name, bind with the first one's UID: the Status, UIDs
    replaced by <old>/<new>. Then the binding with the new UID must land."""
    def create() -> str:
        made = api.core.create_namespaced_pod("default", _pod(name, scheduler="nobody-schedules-this"),
                                              _preload_content=False)
        return json.loads(made.data)["metadata"]["uid"]

    old = create()
    api.core.delete_namespaced_pod(name, "default", grace_period_seconds=0, _preload_content=False)
    new = _eventually(lambda: _try(create), f"pod {name} created again")
    with pytest.raises(PodReplaced) as refused:
        api.bind("default", name, "some-node", {"gpuaware.io/gpus": "GPU-old-0"}, uid=old)
    assert not api.read_pod("default", name)["spec"].get("nodeName")
    api.bind("default", name, "some-node", uid=new)
    assert api.read_pod("default", name)["spec"]["nodeName"] == "some-node"
    status = json.loads(refused.value.body)
    status["message"] = status["message"].replace(old, "<old>").replace(new, "<new>")
    return {"code": refused.value.status, **{k: status.get(k) for k in ("reason", "message", "details")}}


def _try(create: Callable[[], str]) -> str | None:
    try:
        return create()
    except Exception as exc:  # AlreadyExists while the first one is still going
        if getattr(exc, "status", None) != 409:
            raise
        return None


def test_a_binding_with_the_uid_of_a_deleted_pod_is_refused_and_the_fake_answers_the_same(cp) -> None:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    name = _name("replaced")
    real = _bind_with_the_uid_of_a_deleted_pod(KubeApi(client.ApiClient(cfg)), name)
    assert real["code"] == 409 and real["reason"] == "Conflict", real
    assert real["message"].endswith("Precondition failed: UID in precondition: <old>, UID in object meta: <new>"), real
    with FakeApiServer() as fake:
        faked = _bind_with_the_uid_of_a_deleted_pod(KubeApi(connect(fake.url)), name)
    assert faked == real


def test_dra_resource_slice_is_served(cp: KubeControlPlane) -> None:
    resources = cp.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout.split()
    assert {"resourceslices.resource.k8s.io", "resourceclaims.resource.k8s.io",
            "deviceclasses.resource.k8s.io"} <= set(resources), resources
    node = _kwok_node(cp)
    name = _name("gpus")
    cp.apply({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.gpuaware.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": {"model": {"string": "H100"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for i in range(2)],
        },
    })
    got = _get(cp, "resourceslice", name)
    assert got["apiVersion"] == "resource.k8s.io/v1"
    assert [d["name"] for d in got["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": _name("gpu")},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.gpuaware.io'"}}]}})


def test_serviceaccount_kubeconfig_acts_as_the_serviceaccount(cp: KubeControlPlane) -> None:
    cp.create_namespace("sa-test")
    kubeconfig = cp.serviceaccount_kubeconfig("sa-test", "reader")
    who = json.loads(cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == "system:serviceaccount:sa-test:reader"
    denied = cp.kubectl("get", "pods", "-n", "sa-test", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    cp.kubectl("create", "role", "pod-reader", "-n", "sa-test", "--verb=get,list", "--resource=pods")
    cp.kubectl("create", "rolebinding", "pod-reader", "-n", "sa-test", "--role=pod-reader",
               "--serviceaccount=sa-test:reader")
    _eventually(lambda: cp.kubectl("get", "pods", "-n", "sa-test", kubeconfig=kubeconfig, check=False).returncode == 0,
                "the ServiceAccount may list pods once bound", timeout_s=10)


def test_stop_leaves_no_process_and_no_files() -> None:
    _need_binaries()
    plane = KubeControlPlane()
    t0 = time.monotonic()
    plane.start()
    started = time.monotonic() - t0
    pids = list(plane.pids().values())
    assert len(pids) == 2
    workdir = plane.workdir
    assert workdir is not None and workdir.exists()
    assert set(plane.timings) >= {"pki", "etcd", "kube-apiserver", "total"}
    plane.stop()
    assert not any(pid_alive(pid) for pid in pids if pid)
    assert not workdir.exists()
    print(f"etcd + kube-apiserver ready in {started:.1f}s: {plane.timings}")


def test_an_apiserver_port_taken_before_it_binds_is_replaced_by_a_free_one(monkeypatch):
    """free_port() only finds a port free at that moment; one taken before kube-apiserver binds it ended a test
    run ("bind: address already in use"): the control plane starts the apiserver again on a new port."""
    import socket

    from gpuaware.local import kube_control_plane as kcp

    _need_binaries()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real, handed = kcp.free_port, []

    def first_one_taken() -> int:
        handed.append(port if not handed else real())
        return handed[-1]

    monkeypatch.setattr(kcp, "free_port", first_one_taken)
    try:
        with KubeControlPlane(scheduler=False, kwok=False) as plane:
            assert plane.port != port
            assert str(plane.port) in plane.kubeconfig.read_text()
            from tests.real_kube import api_client

            assert KubeApi(api_client(plane.kubeconfig)).core.list_namespace().items
    finally:
        taken.close()
