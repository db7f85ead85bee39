"""``KubeApi`` and ``Informer`` against the fake API server: the Binding carries the pod's UID as a precondition,
so a pod deleted and recreated under the same name never gets the placement (and GPUs) meant for the old one;
concurrent GPU cordons all stick; the informer re-lists after 410 Gone and follows bookmarks."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from contract import annotations
from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from plumbing.kube.api import Informer, KubeApi, PodReplaced, WatchSpec, connect

GPUS = {"gpuaware.io/gpus": "GPU-old-0"}


def test_a_binding_for_a_pod_deleted_and_recreated_under_its_name_is_refused_as_pod_replaced() -> None:
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        fake.create("nodes", make_node("n1"))
        old = fake.create("pods", make_pod("p"))["metadata"]["uid"]
        api.core.delete_namespaced_pod("p", "default", _preload_content=False)
        new = fake.create("pods", make_pod("p"))["metadata"]["uid"]
        with pytest.raises(PodReplaced) as refused:
            api.bind("default", "p", "n1", GPUS, uid=old)
        # As kube-apiserver answers (pkg/registry/core/pod/storage: the Binding's UID is a storage precondition).
        assert refused.value.status == 409
        body = json.loads(refused.value.body)
        assert body["reason"] == "Conflict" and body["details"] == {"name": "p", "kind": "pods"}
        assert body["message"].endswith(f"Precondition failed: UID in precondition: {old}, UID in object meta: {new}")
        pod = api.read_pod("default", "p")
        assert not pod["spec"].get("nodeName") and "gpuaware.io/gpus" not in pod["metadata"].get("annotations", {})
        api.bind("default", "p", "n1", GPUS, uid=new)
        assert api.read_pod("default", "p")["spec"]["nodeName"] == "n1"


def test_other_binding_conflicts_are_not_pod_replaced_and_no_uid_means_no_precondition() -> None:
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        uid = fake.create("pods", make_pod("p"))["metadata"]["uid"]
        api.bind("default", "p", "n1")  # no UID: no precondition, as before
        with pytest.raises(ApiException) as again:
            api.bind("default", "p", "n2", uid=uid)
        assert again.value.status == 409 and not isinstance(again.value, PodReplaced)
        assert "already assigned to node" in json.loads(again.value.body)["message"]


def test_informer_relists_after_410_gone_and_follows_bookmarks():
    with FakeApiServer(window=5, bookmark_every_s=0.2) as fake:
        core = k8s.CoreV1Api(connect(fake.url))
        seen: dict[str, str] = {}
        syncs: list[int] = []

        def on_sync(items):
            syncs.append(len(items))
            seen.clear()
            seen.update({i["metadata"]["name"]: "SYNC" for i in items})

        inf = Informer(WatchSpec("nodes", core.list_node), on_sync,
                       lambda kind, obj: seen.__setitem__(obj["metadata"]["name"], kind), watch_timeout_s=30).start()
        try:
            assert inf.synced.wait(5)
            fake.create("nodes", make_node("a"))
            deadline = time.monotonic() + 5
            while "a" not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert seen["a"] == "ADDED"
            deadline = time.monotonic() + 5  # a bookmark moves the informer's resourceVersion to the head
            while int(inf.resource_version) != fake.store.rv and time.monotonic() < deadline:
                time.sleep(0.02)
            assert int(inf.resource_version) == fake.store.rv
            for i in range(10):
                fake.create("nodes", make_node(f"b{i}"))
            # Drop the informer's position out of the retained window: the next watch gets 410 and re-lists.
            # An event or bookmark read between the two lines below moves the position back to the head, so
            # the drop is repeated until the re-list is seen.
            deadline = time.monotonic() + 10
            while len(syncs) < 2 and time.monotonic() < deadline:
                inf.resource_version = "1"
                inf._resp.close() if inf._resp is not None else None
                until = time.monotonic() + 1
                while len(syncs) < 2 and time.monotonic() < until:
                    time.sleep(0.02)
            assert len(syncs) >= 2 and syncs[-1] == 11 and inf.relists >= 2
        finally:
            inf.stop()


def test_gpus_cordoned_at_once_are_all_kept_with_an_operators_own_cordon():
    """Several GPUs of one node turning critical together are cordoned by concurrent writers; a
    read-modify-write without the resourceVersion precondition keeps only the last writer's GPU."""
    from concurrent.futures import ThreadPoolExecutor

    with FakeApiServer() as fake:
        node = make_node("n0", gpus=8)
        node["metadata"]["annotations"] = {annotations.ANN_CORDONED: "7"}
        fake.create("nodes", node)
        apis = [KubeApi(connect(fake.url)) for _ in range(6)]
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda a: a[1].cordon_gpu("n0", a[0]), enumerate(apis)))
        (node,) = fake.objects("nodes")
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
