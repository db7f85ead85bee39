"""The fake apiserver merges a strategic patch of node conditions on their type, as kube-apiserver does
(the scheduler's GPU health conditions must not wipe the kubelet's Ready)."""

from __future__ import annotations

from gpuaware.local.fake_apiserver import FakeApiServer, make_node
from gpuaware.plumbing.kube.api import KubeApi, connect


def test_a_strategic_patch_of_one_condition_keeps_the_others():
    with FakeApiServer() as server:
        server.create("nodes", make_node("n0", gpus=2))
        api = KubeApi(connect(server.url))
        api.set_node_conditions("n0", [{"type": "GPUUnhealthy", "status": "True", "reason": "GPUDrained"}])
        api.set_node_conditions("n0", [{"type": "GPUUnhealthy", "status": "False", "reason": "GPUsHealthy"}])
        (node,) = server.objects("nodes")
        assert [(c["type"], c["status"]) for c in node["status"]["conditions"]] == \
            [("Ready", "True"), ("GPUUnhealthy", "False")]
