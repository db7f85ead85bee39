"""``KubeApi`` against the fake API server: the Binding carries the pod's UID as a precondition, so a
pod deleted and recreated under the same name never gets the placement (and GPUs) meant for the old one."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from plumbing.kube.api import KubeApi, PodReplaced, connect

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
