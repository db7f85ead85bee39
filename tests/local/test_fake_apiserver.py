"""The fake API server behaves like kube-apiserver where the scheduler relies on it: one binding per pod,
resourceVersion conflicts, evictions refused by a PodDisruptionBudget."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from gpuaware.local.kube_cluster import PODS
from gpuaware.plumbing.kube.api import KubeApi, connect
from tests.support import pods


def test_fake_api_server_refuses_a_second_binding_a_stale_update_and_a_pdb_violating_eviction():
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        fake.create("nodes", make_node("n1"))
        fake.create("pods", make_pod("p", labels={"app": "x"}))
        fake.create("pods", make_pod("q", labels={"app": "x"}))
        api.bind("default", "p", "n1")
        with pytest.raises(ApiException) as second:
            api.bind("default", "p", "n1")
        assert second.value.status == 409 and "already assigned to node" in json.loads(second.value.body)["message"]
        pod = api.read_pod("default", "p")
        stale = dict(pod, metadata={**pod["metadata"], "resourceVersion": "1"})
        with pytest.raises(ApiException) as conflict:
            api.core.replace_namespaced_pod("p", "default", stale, _preload_content=False)
        assert conflict.value.status == 409
        api.bind("default", "q", "n1")
        fake.create("poddisruptionbudgets", {"metadata": {"name": "x", "namespace": "default"},
                                             "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "x"}}}},
                    group="policy")
        with pytest.raises(ApiException) as blocked:
            api.evict("default", "p")
        body = json.loads(blocked.value.body)
        assert blocked.value.status == 429 and body["details"]["causes"][0]["reason"] == "DisruptionBudget"
        assert "p" in pods(fake)


def test_a_watch_sees_a_pod_leave_and_enter_its_field_selector_as_kube_apiserver_shows_it():
    """Succeeded: the pod watch (terminal pods left out) gets DELETED with the pod's previous, Running, state at
    the change's resourceVersion; the completions watch (Succeeded pods) gets ADDED with the final one."""
    with FakeApiServer() as fake:
        api = KubeApi(connect(fake.url))
        fake.create("pods", make_pod("p"))
        fake.store.patch(PODS, "default", "p", {"status": {"phase": "Running"}}, True)
        start = str(fake.store.rv)
        done = fake.store.patch(PODS, "default", "p", {"status": {"phase": "Succeeded"}}, True)
        fake.store.patch(PODS, "default", "p", {"metadata": {"labels": {"x": "1"}}})
        seen = {}
        for selector in ("status.phase!=Succeeded,status.phase!=Failed", "status.phase=Succeeded"):
            resp = api.core.list_pod_for_all_namespaces(field_selector=selector, watch=True, resource_version=start,
                                                        timeout_seconds=1, _preload_content=False)
            seen[selector] = [(e["type"], e["object"]["status"]["phase"], e["object"]["metadata"]["resourceVersion"])
                              for e in map(json.loads, resp.read().splitlines())]
        rv = done["metadata"]["resourceVersion"]
        assert seen["status.phase!=Succeeded,status.phase!=Failed"] == [("DELETED", "Running", rv)]
        assert seen["status.phase=Succeeded"] == [("ADDED", "Succeeded", rv),
                                                  ("MODIFIED", "Succeeded", str(int(rv) + 1))]
