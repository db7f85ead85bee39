"""The scheduler's API calls reuse their connections to a real kube-apiserver (v1.36.3, TLS).

Writes whose answer the scheduler does not need (Binding, Event, Eviction, node and GPUQueue patches)
used to leave the response unread; urllib3 returns a connection to its pool only once the body is
read, so each such call opened a new TLS connection: a handshake per pod, twice, on both sides.

Skipped when the binaries are not built, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.api import KubeApi, api_error
from tests.support import need


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane() as plane:
        yield plane


def _api(cp: KubeControlPlane) -> KubeApi:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    return KubeApi(client.ApiClient(cfg))


def _connections_opened(api: KubeApi) -> int:
    return api.client.rest_client.pool_manager.connection_from_url(api.client.configuration.host).num_connections


def test_binds_and_events_one_after_another_share_one_connection(cp):
    api = _api(cp)
    cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "conn-node"}})
    pods = []
    for i in range(10):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"conn-{i}", "namespace": "default"},
               "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}
        created = api.core.create_namespaced_pod("default", pod, _preload_content=False)
        pods.append(json.loads(created.data))
    opened = _connections_opened(api)

    for pod in pods:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        api.bind("default", name, "conn-node", {"gpuaware.io/gpus": "0"}, uid)
        api.create_event(api.event_body(pod, "Scheduled", f"bound {name}"))

    # 20 writes, one after the other: the connection the creates used serves them all.
    assert _connections_opened(api) == opened, _connections_opened(api)
    bound = api.read_pod("default", "conn-9")
    assert bound["spec"]["nodeName"] == "conn-node"
    assert bound["metadata"]["annotations"]["gpuaware.io/gpus"] == "0"


def test_claim_writes_go_out_as_json_and_share_one_connection(cp):
    """The claim writes bypass the client's generated methods (``KubeApi._send``): the same answers, a refusal
    still an ``ApiException`` with the apiserver's status, and the connection still reused."""
    api = _api(cp)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "conn-claim", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    claim = json.loads(api.resource.create_namespaced_resource_claim("default", body, _preload_content=False).data)
    stale = claim
    opened = _connections_opened(api)

    claim = api.update_claim({**claim, "metadata": {**claim["metadata"], "finalizers": ["example.com/hold"]}})
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "conn-node", "device": "gpu-0"}
    claim = api.write_claim_status({**claim, "status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid-1"}]}})
    assert claim["status"]["allocation"]["devices"]["results"] == [result]
    claim = api.unreserve_claim("default", "conn-claim", claim["metadata"]["uid"], "pod-uid-1")
    assert not claim["status"].get("reservedFor") and claim["status"]["allocation"]
    with pytest.raises(ApiException) as refused:  # the resourceVersion of before the writes
        api.update_claim(stale)
    assert refused.value.status == 409 and api_error(refused.value)[1] == "Conflict"

    assert _connections_opened(api) == opened, _connections_opened(api)
    assert api.read_claim("default", "conn-claim")["metadata"]["finalizers"] == ["example.com/hold"]
