"""A critical GPU's DRA devices tainted with DeviceTaintRules and lifted on recovery, on a real kube-apiserver
1.36 with the DRADeviceTaintRules gate; kube-scheduler (with kwok running the pods) keeps a claim off a
tainted GPU and places it once the taint is lifted. The health chain's hook (HealthReactions) taints on
critical and lifts on recovery. Skipped when the control plane is not built, failed under ``CI=true``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config

from gpuaware.contract import dra
from gpuaware.local.kube_control_plane import KWOK_NODE_ANNOTATION, BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.plumbing.kube.resource_slices import NodeGpu, SlicePublisher
from gpuaware.scheduler.kube.calls import ApiCalls
from gpuaware.scheduler.kube.dra import device_taints
from gpuaware.scheduler.kube.dra.device_taints import DeviceTaints, gpu_devices
from gpuaware.scheduler.metrics import SchedulerStats
from gpuaware.scheduler.settings import SchedulerSettings
from tests.contract.nvidia_slices import a100_static_mig_node, h100_node
from tests.support import REPO, live_scheduler, need, wait_for

GATES = {"DRADeviceTaintRules": True}
RUNTIME = ["--runtime-config=resource.k8s.io/v1beta2=true"]


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane(scheduler=True, kwok=True, feature_gates=GATES, apiserver_args=RUNTIME) as plane:
        plane.kubectl("apply", "-f", str(REPO / "deploy/components/dra-deviceclasses/deviceclasses.yaml"))
        yield plane


@pytest.fixture(scope="module")
def api_client(cp):
    return config.new_client_from_config(str(cp.kubeconfig))


def kwok_node(cp: KubeControlPlane, name: str) -> None:
    cp.apply({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": name, "annotations": dict([KWOK_NODE_ANNOTATION]),
                           "labels": {"kubernetes.io/hostname": name}},
              "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                         "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}})


def claim_and_pod(cp: KubeControlPlane, name: str, scheduler: str = "default-scheduler",
                  tolerations: list[dict[str, str]] | None = None) -> None:
    exactly: dict[str, Any] = {"deviceClassName": dra.DEVICE_CLASS_GPU}
    if tolerations:
        exactly["tolerations"] = tolerations
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": name, "namespace": "default"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
              "spec": {"schedulerName": scheduler, "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                       "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                       "containers": [{"name": "c", "image": "registry.invalid/x:1",
                                       "resources": {"claims": [{"name": "gpu"}]}}]}})


def get(cp: KubeControlPlane, *args: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def until(cond, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.2)


def unschedulable(cp: KubeControlPlane, pod: str) -> bool:
    conds = get(cp, "pod", pod, "-n", "default").get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)


def test_gpu_devices_finds_the_whole_gpu_and_its_partitions():
    assert gpu_devices([h100_node("h")], 3) == [(dra.DRIVER, "h", "gpu-3")]
    assert gpu_devices([a100_static_mig_node("a")], 1) == [
        (dra.DRIVER, "a", "gpu-1-mig-3g40gb-9-0"), (dra.DRIVER, "a", "gpu-1-mig-2g20gb-14-4"),
        (dra.DRIVER, "a", "gpu-1-mig-2g20gb-14-6")]
    broken = h100_node("b")
    broken["spec"]["devices"][0]["capacity"] = {}
    assert gpu_devices([broken], 0) == []  # a slice that does not parse is skipped, not guessed at


def test_kube_scheduler_keeps_a_claim_off_a_tainted_gpu_until_it_is_lifted(cp, api_client):
    kwok_node(cp, "kw-taint")
    SlicePublisher(api_client).publish("kw-taint", [NodeGpu(0, "GPU-kw-0", "NVIDIA H100 80GB HBM3", 80 * 2**30)])
    taints = DeviceTaints(api_client)
    assert taints.taint("kw-taint", 0, "critical") == 1
    assert taints.taint("kw-taint", 0, "critical") == 0  # once is enough
    (rule,) = get(cp, "devicetaintrules")["items"]
    assert rule["spec"]["deviceSelector"] == {"driver": dra.DRIVER, "pool": "kw-taint", "device": "gpu-0"}
    assert rule["spec"]["taint"]["key"] == dra.TAINT_UNHEALTHY and rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert taints.load() == {("kw-taint", 0)}  # found again, as a restarted scheduler finds it
    claim_and_pod(cp, "wants-gpu")
    until(lambda: unschedulable(cp, "wants-gpu"), "kube-scheduler reporting the pod unschedulable")
    assert "cannot allocate all claims" in json.dumps(get(cp, "pod", "wants-gpu", "-n", "default")["status"])
    assert taints.lift("kw-taint", 0) == 1 and taints.load() == set()
    until(lambda: get(cp, "pod", "wants-gpu", "-n", "default")["spec"].get("nodeName") == "kw-taint",
          "the pod placed once the taint was lifted")
    claim = get(cp, "resourceclaim", "wants-gpu", "-n", "default")
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


async def test_the_health_chain_taints_on_critical_and_lifts_on_recovery(cp, api_client):
    SlicePublisher(api_client).publish("kw-chain", [NodeGpu(g, f"GPU-ch-{g}", "H100", 80 * 2**30) for g in range(2)])
    taints = DeviceTaints(api_client)
    calls = ApiCalls(KubeApi(api_client), SchedulerStats(), workers=2)
    try:
        await taints.taint_async(calls, "kw-chain", 1, "critical")
        assert {(r["spec"]["deviceSelector"]["pool"], r["spec"]["deviceSelector"]["device"])
                for r in get(cp, "devicetaintrules")["items"]} == {("kw-chain", "gpu-1")}
        # A fresh scheduler knows nothing yet: the first GPU in service reads the rules, the rest wait for that.
        first = taints.lift_if_tainted(calls, "kw-chain", 0)
        assert first is not None and taints.lift_if_tainted(calls, "kw-chain", 1) is None
        await first  # GPU 0 was never tainted: the rules read once, nothing deleted
        assert taints.tainted == {("kw-chain", 1)} and taints.lift_if_tainted(calls, "kw-chain", 0) is None
        await taints.lift_if_tainted(calls, "kw-chain", 1)
        assert get(cp, "devicetaintrules")["items"] == [] and taints.tainted == set()
    finally:
        calls.shutdown()


async def test_without_the_api_tainting_switches_itself_off(cp, api_client, monkeypatch, caplog):
    monkeypatch.setattr(device_taints, "RULES_VERSION", "v1alpha9")  # an apiserver that serves no DeviceTaintRule
    SlicePublisher(api_client).publish("kw-off", [NodeGpu(0, "GPU-off-0", "H100", 80 * 2**30)])
    stats = SchedulerStats()
    calls = ApiCalls(KubeApi(api_client), stats, workers=2)
    taints = DeviceTaints(api_client)
    try:
        await taints.taint_async(calls, "kw-off", 0, "critical")
        assert taints.served is False and stats.api_errors[("create-devicetaintrule", 404)] == 1
        assert "DRADeviceTaintRules" in caplog.text
        await taints.taint_async(calls, "kw-off", 0, "critical")  # no second try, no second warning
        assert stats.api_errors[("create-devicetaintrule", 404)] == 1
        assert taints.lift_if_tainted(calls, "kw-off", 0) is None
    finally:
        calls.shutdown()


async def test_health_reactions_taint_a_critical_gpu_and_lift_it_when_it_recovers(
        cp, api_client, kube, listed, calls, stats, tasks, wait_for):
    """The hook in gpuaware/scheduler/kube/quarantine.py: the node and pods live in the session's apiserver as in
    test_quarantine.py, the slices and rules in this module's (DeviceTaintRules gated on). The taint is lifted when
    the GPU returns to service: validated PASS after its pods left."""
    from gpuaware.contract.events import HealthAction, HealthBand, HealthVerdict
    from gpuaware.scheduler.kube.quarantine import HealthReactions
    from tests.scheduler.kube.test_quarantine import gpu, setup, step

    SlicePublisher(api_client).publish("n0", [NodeGpu(g, f"GPU-n0-{g}", "H100", 80 * 2**30) for g in range(2)])
    view, state, health, _ = setup(kube, listed, calls, stats, tasks)
    taints = DeviceTaints(api_client)
    health = HealthReactions(view, calls, health.cache, stats, health.sink, health.evictor, tasks, taints)
    health.validate_s = 0.05

    def rules() -> set[str]:
        return {r["spec"]["deviceSelector"]["device"] for r in get(cp, "devicetaintrules")["items"]
                if r["spec"]["deviceSelector"]["pool"] == "n0"}

    step(state, health)
    view.learn(gpu(1, HealthBand.CRITICAL))
    step(state, health)
    await wait_for(lambda: rules() == {"gpu-1"}, what="GPU 1's device tainted")

    def passing() -> bool:
        healthy = gpu(1, HealthBand.HEALTHY)
        healthy.verdict, healthy.recommended_action = HealthVerdict.PASS, HealthAction.NONE
        view.learn(healthy)
        step(state, health)
        return ("n0", 1) not in health.chains and len(tasks) == 0

    await wait_for(passing, what="validated and back in service")
    await wait_for(lambda: rules() == set(), what="the taint lifted")


async def test_gpuaware_keeps_claims_off_devices_a_rule_taints_and_uses_them_once_it_is_lifted(cp, api_client):
    """gpuaware's allocator reads the DeviceTaintRules (served here): GPU 0 tainted, the first claim gets
    GPU 1, the second waits, and it gets GPU 0 once the rule is gone."""
    for crd in ("gpuqueues", "gpuworkloads"):  # what gpuaware's scheduler watches besides
        cp.kubectl("apply", "-f", str(REPO / "deploy/base/crds" / f"gpuaware.io_{crd}.yaml"))
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
    kwok_node(cp, "kw-rules")
    SlicePublisher(api_client).publish("kw-rules", [NodeGpu(g, f"GPU-ru-{g}", "NVIDIA H100 80GB HBM3", 80 * 2**30)
                                                    for g in range(2)])
    taints = DeviceTaints(api_client)
    assert taints.taint("kw-rules", 0, "critical") == 1
    for name in ("ru-a", "ru-b"):
        claim_and_pod(cp, name, scheduler="gpuaware")
    settings = SchedulerSettings(pass_interval_s=0.02, extender_port=0, unqueued="allow", dra=True)
    async with live_scheduler(KubeApi(api_client), settings) as live:
        await wait_for(lambda: get(cp, "pod", "ru-a", "-n", "default")["spec"].get("nodeName") == "kw-rules",
                       30, "the first pod placed", poll_s=0.2)
        assert next(iter(live.cache.dra.state.inventory.rules.values())).pool == "kw-rules"
        await wait_for(lambda: "default/ru-b" in live.cache.pending, 10, "the second pod waiting")
        for _ in range(3):
            live.schedule_once()
            await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert not get(cp, "pod", "ru-b", "-n", "default")["spec"].get("nodeName")
        assert taints.lift("kw-rules", 0) == 1
        await wait_for(lambda: get(cp, "pod", "ru-b", "-n", "default")["spec"].get("nodeName") == "kw-rules",
                       30, "the second pod placed once the rule is gone", poll_s=0.2)
    devices = [get(cp, "resourceclaim", n, "-n", "default")["status"]["allocation"]["devices"]["results"][0]["device"]
               for n in ("ru-a", "ru-b")]
    assert devices == ["gpu-1", "gpu-0"]


async def test_a_claim_tolerating_a_taint_gets_the_tainted_device_from_gpuaware_as_from_kube_scheduler(cp, api_client):
    """Both GPUs of a node tainted NoExecute by a rule under NVIDIA's XID key. A claim tolerating that key gets
    one from kube-scheduler and one from gpuaware (the apiserver takes both allocations); a claim without the
    toleration, for gpuaware, waits."""
    for crd in ("gpuqueues", "gpuworkloads"):
        cp.kubectl("apply", "-f", str(REPO / "deploy/base/crds" / f"gpuaware.io_{crd}.yaml"))
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
    kwok_node(cp, "kw-tol")
    SlicePublisher(api_client).publish("kw-tol", [NodeGpu(g, f"GPU-tol-{g}", "NVIDIA H100 80GB HBM3", 80 * 2**30)
                                                  for g in range(2)])
    cp.apply({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": "tol-xid"},
              "spec": {"deviceSelector": {"driver": dra.DRIVER, "pool": "kw-tol"},
                       "taint": {"key": dra.TAINT_XID, "value": "79", "effect": "NoExecute"}}})
    tolerate = [{"key": dra.TAINT_XID, "operator": "Exists", "effect": "NoExecute"}]
    for name, scheduler, tolerations in (("tol-kube", "default-scheduler", tolerate),
                                         ("tol-ours", "gpuaware", tolerate), ("tol-none", "gpuaware", None)):
        claim_and_pod(cp, name, scheduler=scheduler, tolerations=tolerations)
    until(lambda: get(cp, "pod", "tol-kube", "-n", "default")["spec"].get("nodeName") == "kw-tol",
          "kube-scheduler placing the tolerating claim on a tainted device")
    settings = SchedulerSettings(pass_interval_s=0.02, extender_port=0, unqueued="allow", dra=True)
    async with live_scheduler(KubeApi(api_client), settings) as live:
        await wait_for(lambda: get(cp, "pod", "tol-ours", "-n", "default")["spec"].get("nodeName") == "kw-tol",
                       30, "gpuaware placing the tolerating claim", poll_s=0.2)
        await wait_for(lambda: "default/tol-none" in live.cache.pending, 10, "the claim without it waiting")
        for _ in range(3):
            live.schedule_once()
            await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert not get(cp, "pod", "tol-none", "-n", "default")["spec"].get("nodeName")
    results = {n: get(cp, "resourceclaim", n, "-n", "default")["status"]["allocation"]["devices"]["results"][0]
               for n in ("tol-kube", "tol-ours")}
    assert {r["device"] for r in results.values()} == {"gpu-0", "gpu-1"}
    # The request's tolerations copied into the result (the taint eviction controller reads them there), by
    # kube-scheduler and by gpuaware alike.
    assert results["tol-kube"]["tolerations"] == results["tol-ours"]["tolerations"] == tolerate
    cp.kubectl("delete", "devicetaintrules", "tol-xid")
