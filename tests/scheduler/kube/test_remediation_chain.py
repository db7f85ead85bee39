"""The GPU remediation chain on a real kube-apiserver, acting as the scheduler's ServiceAccount with the
shipped RBAC and admission policies: cordon -> pods moved as their GPUQueue's evictionMode says -> reset
requested through the node condition -> validated -> back in service (uncordoned, taint lifted,
conditions False), with the MTTR sample. Skipped when the control plane is not built, failed under CI=true.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuaware.contract import annotations
from gpuaware.contract.events import (
    DecisionAction,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    NodeGpu,
    NodeState,
)
from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, KubeControlPlaneError, find_binaries
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.scheduler.core.remediation import Step
from gpuaware.scheduler.feed import StateView
from gpuaware.scheduler.kube import node_conditions
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.decisions import DecisionSink
from gpuaware.scheduler.kube.evictor import Evictor
from gpuaware.scheduler.kube.live_state import LiveGpuState
from gpuaware.scheduler.kube.quarantine import HealthReactions
from gpuaware.scheduler.kube.queues import Queue, QueueSpecError
from gpuaware.scheduler.settings import SchedulerSettings
from tests.real_kube import api_client, prepare
from tests.support import need, shipped_rbac

NS = "gpuaware"
SETTINGS = SchedulerSettings(checkpoint_timeout_s=0.0, eviction_retry_s=0.05, eviction_timeout_s=2.0,
                             extender_port=0, remediation_validate_s=0.3)


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=False, kwok=False) as plane:
        prepare(plane, shipped_rbac(plane))
        for ns in ("train", "serve", "keep"):
            plane.create_namespace(ns)
        yield plane


@pytest.fixture(scope="module")
def api(cp) -> KubeApi:
    return KubeApi(api_client(cp.serviceaccount_kubeconfig(NS, "gpuaware-scheduler", create=False)))


def _get(cp: KubeControlPlane, *args: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def _node(cp: KubeControlPlane, name: str, gpus: int) -> None:
    node = make_node(name, gpus=gpus)
    cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": node["metadata"]})
    cp.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": node["status"]}))


def _pod_on(cp: KubeControlPlane, name: str, ns: str, node: str, gpu: int) -> None:
    pod = make_pod(name, ns, annotations={annotations.ANN_GPUS: f'[{{"index":{gpu},"milli":300}}]'})
    del pod["spec"]["priority"]  # the Priority admission plugin sets it
    pod["spec"]["nodeName"] = node
    cp.apply({"apiVersion": "v1", "kind": "Pod", **pod})


def _queue(name: str, namespaces: list[str], mode: str) -> dict[str, Any]:
    return {"apiVersion": "gpuaware.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": name},
            "spec": {"tenant": name, "namespaces": namespaces, "quota": [{"model": "*", "gpus": 8}],
                     "evictionMode": mode}}


def _state(node: str, g: int, verdict: HealthVerdict, action: HealthAction, reasons: list[str]) -> GpuState:
    ts = int(time.time() * 1000)
    band = HealthBand.HEALTHY if verdict == HealthVerdict.PASS else HealthBand.CRITICAL
    state = GpuState(f"{node}-GPU-{g}", node, "H100", ts, ts, 50.0, 20.0, 1000.0, 81920, 300.0, 60.0, 90.0, band)
    state.verdict, state.verdict_reasons, state.recommended_action = verdict, reasons, action
    return state


def _conditions(node: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", ""))
            for c in node["status"].get("conditions") or []}


def _cache(cp: KubeControlPlane) -> ClusterCache:
    cache = ClusterCache(scheduler_name="gpuaware")
    cache.sync_nodes(_get(cp, "nodes")["items"])
    cache.sync_pods(_get(cp, "pods", "-A")["items"])
    cache.sync_queues(_get(cp, "gpuqueues")["items"])
    return cache


def _reactions(cp, api, stats, tasks, name: str):
    """HealthReactions over a cache listed from the apiserver, and ``update(verdict, action, reasons)`` feeding
    GPU 0 of node ``name`` a new state as the loop does."""
    cache = _cache(cp)
    view = StateView()
    view.learn(NodeState(name, int(time.time() * 1000), None, None,
                         [NodeGpu(f"{name}-GPU-{g}", g, "H100", 81920, 0, HealthBand.HEALTHY) for g in range(2)],
                         2000, 0))
    for g in range(2):
        view.learn(_state(name, g, HealthVerdict.PASS, HealthAction.NONE, []))
    published: list = []

    async def publish(record) -> None:
        published.append(record)

    calls = ApiCalls(api, stats, workers=4)
    state = LiveGpuState(view, cache)
    health = HealthReactions(view, calls, cache, stats, DecisionSink(publish),
                             Evictor(calls, cache, SETTINGS, stats), tasks)

    def update(verdict: HealthVerdict, action: HealthAction, reasons: list[str]) -> None:
        view.learn(_state(name, 0, verdict, action, reasons))
        if state.apply(time.time()):
            health.react(state.where)

    return cache, health, update, calls, published


def test_a_bad_eviction_mode_is_refused_with_its_field_and_reason(cp):
    with pytest.raises(KubeControlPlaneError) as refused:
        cp.apply(_queue("bad", ["x"], "sometimes"))
    assert "spec.evictionMode" in str(refused.value) and "Unsupported value" in str(refused.value)
    # One stored before the schema had the field (or by a server without it) is ignored, naming the field.
    with pytest.raises(QueueSpecError, match=r"spec.evictionMode: 'sometimes' is not an eviction mode"):
        Queue.of(_queue("bad", ["x"], "sometimes"))


async def test_cordon_move_request_validate_and_return_to_service(cp, api, stats, tasks, wait_for):
    _node(cp, "n0", gpus=2)
    for name, ns in (("a", "train"), ("b", "serve"), ("c", "keep")):
        _pod_on(cp, name, ns, "n0", 0)
    _pod_on(cp, "other", "train", "n0", 1)
    cp.apply(_queue("serve", ["serve"], "evict"))
    cp.apply(_queue("keep", ["keep"], "never"))
    cache, health, update, calls, published = _reactions(cp, api, stats, tasks, "n0")

    def node() -> dict[str, Any]:
        return _get(cp, "node", "n0")

    try:
        update(HealthVerdict.PASS, HealthAction.NONE, [])
        assert len(tasks) == 0 and health.chains == {}
        xid = ["XID 48: double-bit ECC error"]
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, xid)
        await wait_for(lambda: len(tasks) == 0, what="cordon and moves")
        n = node()
        assert annotations.cordoned_gpus(n) == {0}
        unhealthy, maintenance = (_conditions(n)[t] for t in node_conditions.CONDITION_TYPES)
        assert unhealthy[:2] == ("True", "GPUResetRecommended") and "XID 48" in unhealthy[2]
        assert maintenance[0] == "False"  # pod c (evictionMode never) still holds the GPU: no reset yet
        assert {"key": node_conditions.TAINT_KEY, "value": "reset_gpu", "effect": "PreferNoSchedule"} in \
            n["spec"]["taints"]
        pods = {p["metadata"]["name"]: p for p in _get(cp, "pods", "-A")["items"]}
        # No kubelet here: an evicted pod is marked for deletion and stays, terminating.
        assert {k for k, p in pods.items() if p["metadata"].get("deletionTimestamp")} == {"a", "b"}
        spared = [e for e in _get(cp, "events", "-n", "keep")["items"] if e["reason"] == "GpuUnhealthy"]
        assert [e["involvedObject"]["name"] for e in spared] == ["c"]

        cache.pod_event("DELETED", pods["c"])  # pod c ends on its own
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, xid)
        await wait_for(lambda: len(tasks) == 0, what="reset requested")
        maintenance = _conditions(node())[node_conditions.GPU_MAINTENANCE]
        assert maintenance == ("True", "GPUResetRequired", "reset_gpu: GPU 0")
        assert stats.decisions[("CORDON", "reset-gpu-requested")] == 1

        # A PASS from a GPU that stopped reporting (older than stale_after_s) validates nothing.
        stale = _state("n0", 0, HealthVerdict.PASS, HealthAction.NONE, [])
        stale.sample_ts_ms -= int(SETTINGS.stale_after_s * 1000) + 1000
        health.advance(health.chains[("n0", 0)], stale)
        assert health.chains[("n0", 0)].step == Step.REQUESTED

        # The cluster's tooling resets the GPU; it reads PASS: the hand-off is withdrawn, validation starts.
        update(HealthVerdict.PASS, HealthAction.NONE, [])
        await wait_for(lambda: len(tasks) == 0, what="validating")
        n = node()
        assert _conditions(n)[node_conditions.GPU_MAINTENANCE][0] == "False"
        assert _conditions(n)[node_conditions.GPU_UNHEALTHY][0] == "True"  # not back until validated
        assert annotations.cordoned_gpus(n) == {0}

        def validated() -> bool:
            update(HealthVerdict.PASS, HealthAction.NONE, [])
            return health.chains == {} and len(tasks) == 0

        await wait_for(validated, what="back in service")
        n = node()
        assert annotations.cordoned_gpus(n) == set()
        assert _conditions(n)[node_conditions.GPU_UNHEALTHY][:2] == ("False", "GPUsHealthy")
        assert all(t["key"] != node_conditions.TAINT_KEY for t in n["spec"].get("taints") or [])
        assert stats.mttr.count == 1 and published[-1].action == DecisionAction.RESUME
        steps = health.timeline[("n0", 0)]
        assert steps["cordoned"] <= steps["drained"] <= steps["requested"] <= steps["back_in_service"]
        assert pods["other"]["metadata"].get("deletionTimestamp") is None  # GPU 1's pod never moved
    finally:
        calls.shutdown()


async def test_a_reset_escalated_to_a_reboot_drains_the_whole_node_and_taints_it_no_schedule(cp, api, stats, tasks,
                                                                                            wait_for):
    _node(cp, "n1", gpus=2)
    _pod_on(cp, "r0", "train", "n1", 0)
    _pod_on(cp, "r1", "train", "n1", 1)
    _, _, update, calls, _ = _reactions(cp, api, stats, tasks, "n1")

    def deleting() -> set[str]:
        return {p["metadata"]["name"] for p in _get(cp, "pods", "-n", "train")["items"]
                if p["metadata"]["name"] in ("r0", "r1") and p["metadata"].get("deletionTimestamp")}

    try:
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, ["XID 95"])
        await wait_for(lambda: len(tasks) == 0, what="cordon and move")
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, ["XID 95"])
        await wait_for(lambda: len(tasks) == 0, what="reset requested")
        assert deleting() == {"r0"}
        assert _conditions(_get(cp, "node", "n1"))[node_conditions.GPU_MAINTENANCE][1] == "GPUResetRequired"
        update(HealthVerdict.CRITICAL, HealthAction.REBOOT_NODE, ["XID 79"])
        await wait_for(lambda: len(tasks) == 0, what="whole-node drain")
        assert deleting() == {"r0", "r1"}  # GPU 1's pod too: the reboot takes the node
        update(HealthVerdict.CRITICAL, HealthAction.REBOOT_NODE, ["XID 79"])
        await wait_for(lambda: len(tasks) == 0, what="reboot requested")
        n = _get(cp, "node", "n1")
        assert _conditions(n)[node_conditions.GPU_MAINTENANCE] == ("True", "NodeRebootRequired", "reboot_node: GPU 0")
        assert {"key": node_conditions.TAINT_KEY, "value": "reboot_node", "effect": "NoSchedule"} in n["spec"]["taints"]
    finally:
        calls.shutdown()


async def test_a_new_leader_takes_over_the_open_chain_and_leaves_an_operators_cordon(cp, api, stats, tasks, wait_for):
    """The chains live in memory; the node's condition is their record. A new leader (a fresh HealthReactions)
    finds GPU 0 cordoned and named by GPUUnhealthy: it validates and returns it. GPU 1, cordoned by an
    operator and named by no condition, stays cordoned."""
    _node(cp, "n2", gpus=2)
    cp.kubectl("annotate", "node", "n2", f"{annotations.ANN_CORDONED}=0,1")
    open_ = {node_conditions.GPU_UNHEALTHY: ("True", "GPUResetRecommended",
                                              "GPU 0 requested (reset_gpu): XID 48: double-bit ECC error"),
             node_conditions.GPU_MAINTENANCE: ("True", "GPUResetRequired", "reset_gpu: GPU 0")}
    api.set_node_conditions("n2", node_conditions.condition_objects(open_, None, "2026-01-01T00:00:00.000Z"))
    _, health, update, calls, _ = _reactions(cp, api, stats, tasks, "n2")
    try:
        def validated() -> bool:
            update(HealthVerdict.PASS, HealthAction.NONE, [])
            return ("n2", 0) not in health.chains and len(tasks) == 0

        update(HealthVerdict.PASS, HealthAction.NONE, [])
        assert ("n2", 0) in health.chains and ("n2", 1) not in health.chains
        assert health.chains[("n2", 0)].reasons == ["XID 48: double-bit ECC error"]
        await wait_for(validated, what="taken over, validated, back in service")
        update(HealthVerdict.PASS, HealthAction.NONE, [])  # this cache has no watch: it still shows the cordon
        assert ("n2", 0) not in health.chains and stats.mttr.count == 1  # not taken over again
        n = _get(cp, "node", "n2")
        assert annotations.cordoned_gpus(n) == {1}
        assert _conditions(n)[node_conditions.GPU_UNHEALTHY][0] == "False"
        assert _conditions(n)[node_conditions.GPU_MAINTENANCE][0] == "False"
        assert stats.mttr.sum > 86400  # out of service since the condition turned True, not since the takeover
    finally:
        calls.shutdown()


async def test_another_schedulers_pod_on_the_failing_gpu_is_evicted_before_the_reset_request(cp, api, stats, tasks,
                                                                                            wait_for):
    """Issue 19: the node's agent names which pods hold which GPU (gpuaware.io/gpu-pods); the cache alone would
    have guessed the first free GPUs (xa on GPU 0, xb on GPU 1): the agent says the opposite, and is believed."""
    _node(cp, "f0", gpus=2)
    for name in ("xa", "xb"):
        pod = make_pod(name, "train", scheduler="default-scheduler")
        del pod["spec"]["priority"]
        pod["spec"]["nodeName"] = "f0"
        cp.apply({"apiVersion": "v1", "kind": "Pod", **pod})
    cp.kubectl("annotate", "node", "f0", f"{annotations.ANN_GPU_PODS}="
               + annotations.gpu_pods_value({0: ["train/xb"], 1: ["train/xa"]}))
    cache, _, update, calls, _ = _reactions(cp, api, stats, tasks, "f0")
    xid = ["XID 48: double-bit ECC error"]
    try:
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, xid)
        await wait_for(lambda: len(tasks) == 0, what="cordon and moves")
        pods = {p["metadata"]["name"]: p for p in _get(cp, "pods", "-n", "train")["items"]}
        assert {k for k, p in pods.items() if k in ("xa", "xb") and p["metadata"].get("deletionTimestamp")} == {"xb"}
        # Evicted, still terminating (no kubelet here): not drained, no reset requested yet.
        assert _conditions(_get(cp, "node", "f0"))[node_conditions.GPU_MAINTENANCE][0] == "False"
        cache.pod_event("DELETED", pods["xb"])  # gone
        update(HealthVerdict.CRITICAL, HealthAction.RESET_GPU, xid)
        await wait_for(lambda: len(tasks) == 0, what="reset requested")
        maintenance = _conditions(_get(cp, "node", "f0"))[node_conditions.GPU_MAINTENANCE]
        assert maintenance == ("True", "GPUResetRequired", "reset_gpu: GPU 0")
        assert "xa" in {p["metadata"]["name"] for p in _get(cp, "pods", "-n", "train")["items"]
                        if not p["metadata"].get("deletionTimestamp")}
    finally:
        calls.shutdown()


def test_a_malformed_gpu_pods_annotation_is_logged_with_field_and_reason_once_and_ignored(cp, api, stats, tasks,
                                                                                         caplog):
    _node(cp, "f1", gpus=2)
    cp.kubectl("annotate", "node", "f1", f"{annotations.ANN_GPU_PODS}={{\"0\": \"train/x\"}}")
    _, health, _, calls, _ = _reactions(cp, api, stats, tasks, "f1")
    try:
        with caplog.at_level("WARNING", logger="gpuaware.scheduler.kube.quarantine"):
            assert health.gpu_pods("f1") is None  # ignored: the cache's charge decides, as without it
            assert health.gpu_pods("f1") is None
        (record,) = [r for r in caplog.records if annotations.ANN_GPU_PODS in r.getMessage()]
        assert "GPU 0" in record.getMessage() and "is not a list of namespace/name" in record.getMessage()
    finally:
        calls.shutdown()
