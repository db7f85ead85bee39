"""The scheduler's GPU health writes on a Node, as its ServiceAccount on a real kube-apiserver with the
shipped RBAC and admission policies: its two conditions and its own taint, set and cleared; nothing else
of the Node (Ready, capacity, unschedulable, another taint). Skipped when the control plane is not built,
failed under ``CI=true``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpuaware.local.kube_control_plane import KubeControlPlane
from gpuaware.plumbing.kube.api import STRATEGIC_MERGE_PATCH, KubeApi, now_rfc3339
from gpuaware.scheduler.kube import node_conditions
from tests.real_kube import api_client

NS = "gpuaware"


@pytest.fixture(scope="module")
def api(cp) -> KubeApi:
    scheduler = KubeApi(api_client(cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False)))
    # An admission policy binds once the apiserver's policy informer has it, a moment after it is created (CI
    # saw a refused write go through): wait until a write it refuses is refused, on a node of its own.
    # Each probe changes the condition (a write the policy let through before it bound would make the next,
    # identical one a no-op, which the policy allows).
    _node(cp, "probe-node")
    deadline = time.monotonic() + 60
    for attempt in itertools.count():
        evil = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": f"Probe{attempt}",
                                           "message": "x"}]}}
        if _status(scheduler.core.patch_node_status, "probe-node", evil, _content_type=STRATEGIC_MERGE_PATCH) == 422:
            return scheduler
        assert time.monotonic() < deadline, "the shipped admission policies were not enforced within 60 s"
        time.sleep(0.2)  # polling interval of a condition with a deadline
    raise AssertionError("unreachable")


def _status(call: Any, *args: Any, **kwargs: Any) -> int:
    try:
        call(*args, **kwargs)
        return 200
    except ApiException as exc:
        return exc.status or 0


def _node(cp: KubeControlPlane, name: str) -> dict[str, Any]:
    cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
              "spec": {"taints": [{"key": "site.example/maintenance", "effect": "NoSchedule"}]}})
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
             "lastHeartbeatTime": now_rfc3339()[:19] + "Z", "lastTransitionTime": now_rfc3339()[:19] + "Z"}
    cp.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
               yaml.safe_dump({"status": {"conditions": [ready], "capacity": {"nvidia.com/gpu": "8"}}}))
    return _get(cp, name)


def _get(cp: KubeControlPlane, name: str) -> dict[str, Any]:
    return yaml.safe_load(cp.kubectl("get", "node", name, "-o", "yaml").stdout)


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"].get("conditions") or []}


def test_the_scheduler_sets_and_clears_its_gpu_conditions_and_taint_and_nothing_else(cp, api):
    node = _node(cp, "gpu-node")
    want = {node_conditions.GPU_UNHEALTHY: ("True", "GPUResetRecommended", "GPU 3 requested (reset_gpu): XID 48"),
            node_conditions.GPU_MAINTENANCE: ("True", "GPUResetRequired", "reset_gpu: GPU 3")}
    api.set_node_conditions("gpu-node", node_conditions.condition_objects(want, node, now_rfc3339()))
    taint = {"key": node_conditions.TAINT_KEY, "value": "reset_gpu", "effect": "PreferNoSchedule"}
    api.set_node_taint("gpu-node", node_conditions.TAINT_KEY, taint)
    node = _get(cp, "gpu-node")
    got = _conditions(node)
    assert got["Ready"]["status"] == "True"  # the kubelet's condition untouched
    assert (got["GPUMaintenanceRequired"]["status"], got["GPUMaintenanceRequired"]["reason"]) == \
        ("True", "GPUResetRequired")
    assert {t["key"] for t in node["spec"]["taints"]} == {"site.example/maintenance", node_conditions.TAINT_KEY}

    # Back in service: the conditions turn False (kept, NPD's way), the taint goes, the site's taint stays.
    healthy, _ = node_conditions.desired([])
    api.set_node_conditions("gpu-node", node_conditions.condition_objects(healthy, node, now_rfc3339()))
    api.set_node_taint("gpu-node", node_conditions.TAINT_KEY, None)
    node = _get(cp, "gpu-node")
    got = _conditions(node)
    assert got["GPUUnhealthy"]["status"] == "False" and got["GPUUnhealthy"]["reason"] == "GPUsHealthy"
    assert got["GPUMaintenanceRequired"]["status"] == "False"
    assert [t["key"] for t in node["spec"]["taints"]] == ["site.example/maintenance"]

    core = api.core
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Evil", "message": "x"}]}}
    assert _status(core.patch_node_status, "gpu-node", not_ready, _content_type=STRATEGIC_MERGE_PATCH) == 422
    more_gpus = {"status": {"capacity": {"nvidia.com/gpu": "16"}}}
    assert _status(core.patch_node_status, "gpu-node", more_gpus, _content_type=STRATEGIC_MERGE_PATCH) == 422
    other = {"key": "site.example/maintenance", "effect": "NoSchedule"}
    assert _status(api.set_node_taint, "gpu-node", "site.example/maintenance", None) == 422  # not its taint
    assert _status(api.set_node_taint, "gpu-node", "x", {**other, "key": "x"}) == 422
    assert _status(core.patch_node, "gpu-node", {"spec": {"unschedulable": True}}) == 422
    node = _get(cp, "gpu-node")
    assert _conditions(node)["Ready"]["status"] == "True" and node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert not node["spec"].get("unschedulable")
