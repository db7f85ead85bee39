"""agent.pod_uids: the UIDs of the node's pods fill PodResourcesWatcher.uids, from the informer's
callbacks and, end to end, from the real kube-apiserver through the client and Informer. These read as the
admin: the agent's own grant to list pods (the opt-in agent-pod-uids component) is proven on the same
apiserver in tests/deploy/test_rbac.py."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuaware.agent.main import follow_pod_uids
from gpuaware.agent.pod_uids import PodUids
from gpuaware.agent.podresources import PodRef, PodResourcesWatcher
from gpuaware.agent.settings import AgentSettings
from gpuaware.local.fake_apiserver import make_pod
from gpuaware.plumbing.kube.api import KubeApi


def _pod(name: str, uid: str, ns: str = "ml") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": uid}}


def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)  # polling interval of a condition with a deadline


def test_sync_add_modify_delete_keep_the_uids_of_the_pods():
    watcher = PodResourcesWatcher(socket_path="/nonexistent")
    uids = PodUids(watcher)
    uids.on_sync([_pod("a", "uid-a"), _pod("b", "uid-b")])
    assert watcher.uids == {("ml", "a"): "uid-a", ("ml", "b"): "uid-b"}
    before = watcher.uids
    uids.on_event("ADDED", _pod("c", "uid-c", ns="other"))
    assert watcher.uids[("other", "c")] == "uid-c"
    assert ("other", "c") not in before  # copy-on-write: a reader's dict never changes under it
    uids.on_event("MODIFIED", _pod("a", "uid-a"))
    uids.on_event("DELETED", _pod("b", "uid-b"))
    assert watcher.uids == {("ml", "a"): "uid-a", ("other", "c"): "uid-c"}
    # A pod recreated under the same name: the old one's deletion leaves the new one's UID.
    uids.on_event("ADDED", _pod("a", "uid-a2"))
    uids.on_event("DELETED", _pod("a", "uid-a"))
    assert watcher.uids[("ml", "a")] == "uid-a2"
    uids.on_sync([_pod("d", "uid-d")])  # a re-list replaces everything
    assert watcher.uids == {("ml", "d"): "uid-d"}
    watcher.owners = {"GPU-1": [("d", "ml", "main")]}
    assert watcher.pods("GPU-1") == [PodRef("d", "ml", "main", "uid-d")]


def test_the_informer_keeps_each_pods_labels_beside_its_uid():
    watcher = PodResourcesWatcher(socket_path="/nonexistent")
    uids = PodUids(watcher)
    labelled = {**_pod("a", "uid-a"), "metadata": {**_pod("a", "uid-a")["metadata"], "labels": {"app": "x"}}}
    uids.on_sync([labelled, _pod("b", "uid-b")])
    watcher.owners = {"GPU-1": [("a", "ml", "main"), ("b", "ml", "main")]}
    assert [p.labels for p in watcher.pods("GPU-1")] == [(("app", "x"),), ()]
    relabelled = {**labelled, "metadata": {**labelled["metadata"], "labels": {"app": "y", "team": "t"}}}
    uids.on_event("MODIFIED", relabelled)
    assert watcher.pods("GPU-1")[0].labels == (("app", "y"), ("team", "t"))
    uids.on_event("DELETED", relabelled)
    assert ("ml", "a") not in watcher.labels and watcher.pods("GPU-1")[0].labels == ()


def test_off_by_default_and_none_without_an_api(monkeypatch):
    assert AgentSettings().pod_uids is False
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert PodUids.from_settings(PodResourcesWatcher(socket_path="/nonexistent"), "n", None) is None


def test_the_informer_follows_only_the_pods_of_its_node(kube):
    watcher = PodResourcesWatcher(socket_path="/nonexistent")

    def on(name: str, node: str) -> str:
        pod = make_pod(name, "ml")
        pod["spec"]["nodeName"] = node
        return kube.create("pods", pod)["metadata"]["uid"]

    here = on("here", "node-a")
    on("elsewhere", "node-b")
    uids = PodUids.from_settings(watcher, "node-a", None, KubeApi(kube.admin))
    try:
        _until(lambda: watcher.uids == {("ml", "here"): here})
        later = on("later", "node-a")
        on("later-b", "node-b")
        _until(lambda: watcher.uids == {("ml", "here"): here, ("ml", "later"): later})
        # Deleted at once: a pod on a node no kubelet runs would otherwise stay Terminating for ever.
        kube.delete("pods", "here", "ml")
        _until(lambda: watcher.uids == {("ml", "later"): later})
    finally:
        uids.stop()
    assert not uids.informer._thread.is_alive()


def test_the_agent_follows_pod_uids_only_when_asked_and_only_for_the_kubelets_pods(kube, monkeypatch):
    from gpuaware.agent.collectors.sim import SimCluster, load_scenario

    watcher = PodResourcesWatcher(socket_path="/nonexistent")
    monkeypatch.setenv("KUBECONFIG", str(kube.cp.kubeconfig))  # an agent beside the cluster: its kubeconfig
    on = AgentSettings(pod_uids=True, node_name="node-a")
    assert follow_pod_uids(AgentSettings(), watcher, watcher) is None
    sim = SimCluster(load_scenario("baseline")).attribution()
    assert follow_pod_uids(on, watcher, sim) is None  # the simulator fills its own UIDs
    uids = follow_pod_uids(on, watcher, watcher)
    try:
        assert uids is not None and uids.informer.spec.field_selector == "spec.nodeName=node-a"
        assert uids.informer.synced.wait(10)
    finally:
        uids.stop()
