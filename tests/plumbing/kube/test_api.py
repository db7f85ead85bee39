"""``KubeApi`` and ``Informer`` against the real kube-apiserver: the Binding carries the pod's UID as a precondition,
so a pod deleted and recreated under the same name never gets the placement (and GPUs) meant for the old one;
concurrent GPU cordons all stick; the informer follows bookmarks and re-lists after 410 Gone once etcd compacted
the history its watch would resume from."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpuaware.contract import annotations
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.api import Informer, KubeApi, PodReplaced, WatchSpec, connect
from tests.real_kube import api_client
from tests.support import need

GPUS = {"gpuaware.io/gpus": "GPU-old-0"}


def _until(cond, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling interval of a condition with a deadline


def test_a_binding_for_a_pod_deleted_and_recreated_under_its_name_is_refused_as_pod_replaced(kube) -> None:
    api = kube.api()  # as the scheduler
    kube.create("nodes", make_node("n1"))
    old = kube.create("pods", make_pod("p"))["metadata"]["uid"]
    kube.delete("pods", "p")
    new = kube.create("pods", make_pod("p"))["metadata"]["uid"]
    with pytest.raises(PodReplaced) as refused:
        api.bind("default", "p", "n1", GPUS, uid=old)
    # pkg/registry/core/pod/storage: the Binding's UID is a storage precondition.
    assert refused.value.status == 409
    body = json.loads(refused.value.body)
    assert body["reason"] == "Conflict" and body["details"] == {"name": "p", "kind": "pods"}
    assert body["message"].endswith(f"Precondition failed: UID in precondition: {old}, UID in object meta: {new}")
    pod = KubeApi(kube.admin).read_pod("default", "p")  # the scheduler may not get a pod; it lists and watches
    assert not pod["spec"].get("nodeName") and "gpuaware.io/gpus" not in pod["metadata"].get("annotations", {})
    api.bind("default", "p", "n1", GPUS, uid=new)
    assert kube.get("pods", "p")["spec"]["nodeName"] == "n1"


def test_other_binding_conflicts_are_not_pod_replaced_and_no_uid_means_no_precondition(kube) -> None:
    api = kube.api()
    uid = kube.create("pods", make_pod("p"))["metadata"]["uid"]
    api.bind("default", "p", "n1")  # no UID: no precondition, as before
    with pytest.raises(ApiException) as again:
        api.bind("default", "p", "n2", uid=uid)
    assert again.value.status == 409 and not isinstance(again.value, PodReplaced)
    assert "already assigned to node" in json.loads(again.value.body)["message"]


def test_informer_follows_bookmarks(kube):
    """The apiserver sends a bookmark shortly before a watch's timeout: the informer's resourceVersion moves
    to it without a node event. A pod write moves the store's revision on; a consistent list brings the
    node watch cache up to that revision (etcd's progress notification), and the next bookmark carries it."""
    core = k8s.CoreV1Api(kube.admin)
    inf = Informer(WatchSpec("nodes", core.list_node), lambda items: None, lambda kind, obj: None,
                   watch_timeout_s=4).start()
    try:
        assert inf.synced.wait(10)
        listed = int(inf.resource_version)
        kube.create("pods", make_pod("elsewhere"))  # the store moves on; the node watch sees no event
        core.list_node()
        _until(lambda: int(inf.resource_version) > listed, "a bookmark")
    finally:
        inf.stop()


def test_informer_relists_after_410_gone_once_etcd_compacted_its_history():
    """The apiserver's watch cache serves a watch from its own window, even from a resourceVersion etcd has
    compacted away (seen on v1.36: no 410), so this control plane runs without it: the watch goes to etcd,
    which answers a compacted revision with 410 Expired, and the informer re-lists. Its own control plane,
    as the session's keeps the watch cache production runs with."""
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(apiserver_args=["--watch-cache=false"]) as cp:
        core = k8s.CoreV1Api(api_client(cp.kubeconfig))
        seen: dict[str, str] = {}
        syncs: list[int] = []

        def on_sync(items):
            syncs.append(len(items))
            seen.clear()
            seen.update({i["metadata"]["name"]: "SYNC" for i in items})

        inf = Informer(WatchSpec("nodes", core.list_node), on_sync,
                       lambda kind, obj: seen.__setitem__(obj["metadata"]["name"], kind), watch_timeout_s=2).start()
        try:
            assert inf.synced.wait(10)
            core.create_node({"metadata": {"name": "a"}})
            _until(lambda: seen.get("a") == "ADDED", "the watch event")
            old = inf.resource_version
            for i in range(10):
                core.create_node({"metadata": {"name": f"b{i}"}})
            cp.compact_etcd()
            # Resume from before the compaction, as a watch broken off then would: the current watch ends within
            # its 2 s timeout (nothing else is written, so nothing moves the position back), the next one starts
            # from there and gets 410, then the informer re-lists.
            inf.resource_version = old
            _until(lambda: len(syncs) >= 2, "the re-list after 410")
            assert syncs[-1] == 11 and inf.relists >= 2
        finally:
            inf.stop()


def test_gpus_cordoned_at_once_are_all_kept_with_an_operators_own_cordon(kube):
    """Several GPUs of one node turning critical together are cordoned by concurrent writers; a
    read-modify-write without the resourceVersion precondition keeps only the last writer's GPU."""
    from concurrent.futures import ThreadPoolExecutor

    node = make_node("n0", gpus=8)
    node["metadata"]["annotations"] = {annotations.ANN_CORDONED: "7"}
    kube.create("nodes", node)
    apis = [kube.api() for _ in range(6)]  # six scheduler clients, as the shipped ServiceAccount
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda a: a[1].cordon_gpu("n0", a[0]), enumerate(apis)))
    node = kube.get("nodes", "n0", None)
    assert annotations.cordoned_gpus(node) == {0, 1, 2, 3, 4, 5, 7}
    assert node["metadata"]["annotations"][annotations.ANN_CORDONED] == "0,1,2,3,4,5,7"


def test_informer_stop_returns_at_once_while_its_watch_waits_for_a_silent_server():
    """A watch blocked reading (the real apiserver sends nothing for up to a minute between bookmarks):
    stop() shuts its socket down instead of waiting for the read's lock (it took ~2 min per informer)."""
    import socket
    import threading

    import urllib3

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []

    def serve() -> None:  # answers the watch's headers, then stays silent
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    pool = urllib3.PoolManager()

    class Listed:
        data = b'{"metadata": {"resourceVersion": "1"}, "items": []}'

    def list_fn(**kw):
        if not kw.get("watch"):
            return Listed()
        return pool.request("GET", f"http://127.0.0.1:{port}/api/v1/nodes?watch=1", preload_content=False,
                            timeout=urllib3.Timeout(connect=5, read=None))

    informer = Informer(WatchSpec("nodes", list_fn), lambda items: None, lambda kind, obj: None).start()
    try:
        deadline = time.monotonic() + 10
        while informer._resp is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert informer._resp is not None, "the watch did not start"
        stopping = threading.Thread(target=informer.stop, daemon=True)  # without the fix it blocks for good
        t0 = time.monotonic()
        stopping.start()
        stopping.join(timeout=5)
        assert not stopping.is_alive() and time.monotonic() - t0 < 2.0 and not informer._thread.is_alive()
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def test_connect_reads_kubeconfig_as_set_now_not_at_import(tmp_path, monkeypatch):
    """`gpuaware up` exports the real control plane's KUBECONFIG after the client library was imported
    (which reads the variable once, at import)."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert connect().configuration.host == "https://127.0.0.1:6443"
