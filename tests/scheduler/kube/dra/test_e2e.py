"""gpuaware allocating ResourceClaims on a real kube-apiserver (v1.36.3, ``resource.k8s.io/v1``).

One control plane for the module (etcd + kube-apiserver; no kube-controller-manager, so claims are
created up front and pods name them with ``resourceClaimName``). Nodes publish NVIDIA-shaped
ResourceSlices (``gpuaware.contract.dra``); the scheduler runs in this process as its ServiceAccount with the
RBAC of the production overlay plus ``deploy/components/dra``, and each test uses nodes and pods of its
own (each test's DeviceClass selects a test-group attribute of its own devices).

- whole GPUs, two on one NVLink island, and a memory capacity request: the apiserver takes the
  allocations, the devices are the node's and distinct, the pods bound there;
- a restarted scheduler reads the claims and hands out no device twice;
- a claim allocated by someone else after the scheduler read it: 409 on the status write, the pod
  requeued (not bound), the other allocation kept;
- a selector in CEL gpuaware does not evaluate: the pod is left alone with the reason as an Event;
- a GPUQueue's per-model quota counts claimed GPUs;
- a pod whose claims were written before a restart cut its Binding short is bound where they say;
- memory shares of GPUs that allow multiple allocations (consumable capacity): the apiserver takes them
  (shareID, consumedCapacity), no GPU's memory is over-committed across claims nor after a restart, and a
  whole-GPU claim does not get a shared GPU;
- the delete-protection finalizer: a claim deleted while allocated stays, allocation and all, and its
  device is not handed out again (nor is a claim being deleted allocated);
- ``firstAvailable``: the first subrequest that fits is allocated, and the result names it;
- a claim shared by several pods: all bound where it is, each in its ``reservedFor``, its device charged
  once; a pod that joined it and is withdrawn takes only itself off;
- MIG partitions (partitionable devices, A's publisher): the apiserver takes them, and no two handed out
  share a memory slice (the pool's shared counters).

Skipped when the binaries are not built, failed under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from gpuaware.contract import dra
from gpuaware.local.kube_control_plane import BinariesMissing, KubeControlPlane, find_binaries
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.plumbing.kube.resource_slices import NodeGpu, node_slices
from gpuaware.scheduler.kube.dra import claims as dra_claims
from gpuaware.scheduler.kube.dra import writer as dra_writer
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings
from tests.support import RBAC_KINDS, live_scheduler, need, overlay_with, wait_for

REPO = Path(__file__).resolve().parents[4]
CRDS = REPO / "deploy" / "base" / "crds"
SETTINGS = SchedulerSettings(pass_interval_s=0.02, extender_port=0, unqueued="allow", dra=True)
GB = 2**30


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeControlPlane]:
    need(find_binaries, BinariesMissing)
    with KubeControlPlane() as plane:
        for crd in ("gpuqueues", "gpuworkloads"):
            plane.kubectl("apply", "-f", str(CRDS / f"gpuaware.io_{crd}.yaml"))
            plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
        plane.create_namespace("gpuaware")
        # The production overlay with the DRA component, as docs/dra.md has it: its RBAC, applied as it ships.
        rendered = plane.kubectl("kustomize", str(overlay_with(tmp_path_factory.mktemp("overlay"), "dra"))).stdout
        rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
        plane.apply(yaml.safe_dump_all(rbac))
        plane.rbac = rbac  # type: ignore[attr-defined]
        yield plane


def admin(cp: KubeControlPlane) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def body(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data)


@contextlib.asynccontextmanager
async def scheduler(cp: KubeControlPlane, lead: bool = True, account_name: str = "gpuaware-scheduler"
                    ) -> AsyncIterator[LiveScheduler]:
    """gpuaware's scheduler as the ``gpuaware-scheduler`` ServiceAccount (the shipped RBAC), leading or not."""
    cfg = client.Configuration()
    account = await asyncio.to_thread(cp.serviceaccount_kubeconfig, "gpuaware", account_name,
                                      create=account_name != "gpuaware-scheduler")
    config.load_kube_config(config_file=str(account), client_configuration=cfg)
    async with live_scheduler(KubeApi(client.ApiClient(cfg)), SETTINGS, None, lead) as live:
        yield live


def node(cp: KubeControlPlane, name: str, group: str) -> None:
    cp.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpuaware-test": group}},
              "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                         "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}})


def gpu_slice(cp: KubeControlPlane, name: str, product: str = "NVIDIA H100 80GB HBM3", gpus: int = 8,
              islands: int = 2, memory: int = 80 * GB, group: str = "", shareable: bool = False) -> None:
    devices = [dra.gpu_device(i, uuid=f"GPU-{name}-{i}", product_name=product, memory_bytes=memory,
                              architecture="Hopper", nvlink_island=i * islands // gpus, shareable=shareable)
               for i in range(gpus)]
    for d in devices:  # the test's group, so that each test's DeviceClass selects its own devices only
        d["attributes"]["gpu.gpuaware.io/testGroup"] = {"string": group}
    r = client.ResourceV1Api(admin(cp))
    r.create_resource_slice(dra.resource_slice(name, devices), _preload_content=False)


def device_class(cp: KubeControlPlane, group: str, kind: str = "gpu") -> str:
    name = f"{group}-{kind}"
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
              "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{dra.DRIVER}" && '
                                              f'device.attributes["{dra.DRIVER}"].type == "{kind}" && '
                                              f'device.attributes["gpu.gpuaware.io"].testGroup == "{group}"'}}]}})
    return name


def claim(cp: KubeControlPlane, name: str, cls: str, count: int = 1, selectors: tuple[str, ...] = (),
          capacity: dict[str, str] | None = None, constraints: list[dict] | None = None, ns: str = "default") -> None:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count,
                               "selectors": [{"cel": {"expression": s}} for s in selectors]}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": name, "namespace": ns}, "spec": spec})


def pod(cp: KubeControlPlane, name: str, claims: list[str], ns: str = "default") -> None:
    cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
              "spec": {"schedulerName": "gpuaware",
                       "containers": [{"name": "main", "image": "registry.example.com/job:1.0",
                                       "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                     "claims": [{"name": c} for c in claims]}}],
                       "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]}})


def read(cp: KubeControlPlane, kind: str, name: str, ns: str = "default") -> dict[str, Any]:
    return json.loads(cp.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout)


def results(c: dict[str, Any]) -> list[dict[str, Any]]:
    return ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []


async def cut_short(cp: KubeControlPlane, name: str, node_name: str, device: str) -> None:
    """Claim ``name`` allocated on ``node_name`` (``device``) and reserved for pod ``name``, its Binding not
    written: what a scheduler stopped between the two writes leaves behind."""
    r = client.ResourceV1Api(admin(cp))
    written = body(await asyncio.to_thread(r.read_namespaced_resource_claim, name, "default",
                                           _preload_content=False))
    written["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": dra.DRIVER, "pool": node_name, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": read(cp, "pod", name)["metadata"]["uid"]}]}
    await asyncio.to_thread(r.replace_namespaced_resource_claim_status, name, "default", written,
                            _preload_content=False)


async def bound(cp: KubeControlPlane, name: str, ns: str = "default") -> str:
    out: dict[str, str] = {}

    def check() -> bool:
        out["node"] = read(cp, "pod", name, ns)["spec"].get("nodeName") or ""
        return bool(out["node"])

    await wait_for(check, 30, f"pod {name} bound", poll_s=0.2)
    return out["node"]


def all_allocated(cp: KubeControlPlane) -> list[tuple[str, str]]:
    items = json.loads(cp.kubectl("get", "resourceclaims", "-A", "-o", "json").stdout)["items"]
    return [(r["pool"], r["device"]) for c in items for r in results(c)]


async def test_whole_gpus_an_nvlink_pair_and_a_memory_request_are_allocated_as_the_apiserver_takes_them(cp):
    node(cp, "dra-a", "alloc")
    gpu_slice(cp, "dra-a", group="alloc")
    cls = device_class(cp, "alloc")
    island = dra.ATTR_NVLINK_ISLAND
    claim(cp, "pair", cls, count=2, constraints=[{"requests": ["gpus"], "matchAttribute": island}])
    claim(cp, "big", cls, capacity={"memory": "40Gi"},
          selectors=(f'device.attributes["{dra.DRIVER}"].productName == "NVIDIA H100 80GB HBM3"',
                     f'device.capacity["{dra.DRIVER}"].memory.compareTo(quantity("64Gi")) >= 0'))
    pod(cp, "pair-pod", ["pair"])
    pod(cp, "big-pod", ["big"])
    async with scheduler(cp):
        assert await bound(cp, "pair-pod") == "dra-a"
        assert await bound(cp, "big-pod") == "dra-a"
    pair, big = read(cp, "resourceclaim", "pair"), read(cp, "resourceclaim", "big")
    pod_uid = read(cp, "pod", "pair-pod")["metadata"]["uid"]
    assert pair["status"]["reservedFor"] == [{"resource": "pods", "name": "pair-pod", "uid": pod_uid}]
    assert pair["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["dra-a"]}]
    devices = [r["device"] for r in results(pair)] + [r["device"] for r in results(big)]
    assert len(devices) == 3 == len(set(devices)), devices
    assert all(r["driver"] == dra.DRIVER and r["pool"] == "dra-a" and r["request"] == "gpus"
               for r in results(pair) + results(big))
    islands = {int(d.split("-")[1]) * 2 // 8 for d in devices[:2]}  # gpu_slice: 4 GPUs per island
    assert len(islands) == 1, devices


async def test_a_restarted_scheduler_reads_the_claims_and_hands_out_no_device_twice(cp):
    node(cp, "dra-r", "restart")
    gpu_slice(cp, "dra-r", gpus=4, group="restart")
    cls = device_class(cp, "restart")
    for i in range(2):
        claim(cp, f"r{i}", cls)
        pod(cp, f"r{i}", [f"r{i}"])
    async with scheduler(cp):
        for i in range(2):
            await bound(cp, f"r{i}")
    for i in range(2, 5):  # three more on four GPUs, two taken: one must wait
        claim(cp, f"r{i}", cls)
        pod(cp, f"r{i}", [f"r{i}"])
    async with scheduler(cp) as live:  # a new process: only the API to go by
        await wait_for(lambda: sum(bool(read(cp, "pod", f"r{i}")["spec"].get("nodeName")) for i in range(5)) == 4,
                       30, "four of five placed", poll_s=0.2)
        await wait_for(lambda: any(k.startswith("default/r") for k in live.cache.pending), 10, "one pending")
        c = live.cache.cluster  # the model charges the claims read from the API to the GPUs they name
        assert (c.gpu_free[c.index["dra-r"]] == 0).all(), c.gpu_free[c.index["dra-r"]]
    mine = [(p, d) for p, d in all_allocated(cp) if p == "dra-r"]
    assert len(mine) == 4 == len(set(mine)), mine


async def test_a_claim_allocated_by_someone_else_meanwhile_is_a_conflict_and_the_pod_waits(cp):
    node(cp, "dra-c", "conflict")
    gpu_slice(cp, "dra-c", gpus=2, group="conflict")
    cls = device_class(cp, "conflict")
    claim(cp, "contested", cls)
    pod(cp, "contested", ["contested"])
    async with scheduler(cp, lead=False) as live:
        await wait_for(lambda: "default/contested" in live.cache.pending, 10, "the pod queued")
        await wait_for(lambda: "default/contested" in live.cache.dra.state.claims, 10, "the claim read")
        stale = json.loads(json.dumps(live.cache.dra.state.claims["default/contested"]))
        # Someone else (kube-scheduler, another replica) allocates it; the cache is made to miss that.
        other = dict(stale, status={"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": dra.DRIVER, "pool": "dra-c", "device": "gpu-1"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["dra-c"]}]}]}}})
        r = client.ResourceV1Api(admin(cp))
        await asyncio.to_thread(r.replace_namespaced_resource_claim_status, "contested", "default", other,
                                _preload_content=False)
        # Seen, the pod would go where that allocation is (a claim in use is shared: it joins it)...
        await wait_for(lambda: live.cache.dra.joins.get("default/contested") == "dra-c", 10, "the allocation seen")
        live.cache.claim_event("MODIFIED", stale)  # ...and made to miss it, as if it came a moment later
        assert "default/contested" in live.cache.pending
        live.schedule_once()  # places on what the stale claim says is free
        await wait_for(lambda: live.stats.decisions[("DROP", "claim-conflict")] == 1, 10, "the 409")
        assert live.stats.api_errors[("update-claim", 409)] == 1  # the finalizer write, the first with its version
    assert dra_claims.FINALIZER not in (read(cp, "resourceclaim", "contested")["metadata"].get("finalizers") or [])
    assert not read(cp, "pod", "contested")["spec"].get("nodeName")
    assert [r["device"] for r in results(read(cp, "resourceclaim", "contested"))] == ["gpu-1"]


async def test_a_selector_gpuaware_cannot_evaluate_leaves_the_pod_alone_with_the_reason(cp):
    node(cp, "dra-u", "unsupported")
    gpu_slice(cp, "dra-u", gpus=2, group="unsupported")
    cls = device_class(cp, "unsupported")
    claim(cp, "regex", cls, selectors=(f'device.attributes["{dra.DRIVER}"].productName.matches("H1.*")',))
    pod(cp, "regex", ["regex"])
    async with scheduler(cp) as live:
        await wait_for(lambda: "default/regex" in live.cache.rejected, 10, "left alone")
        await wait_for(lambda: any("not supported by gpuaware" in e["message"] for e in json.loads(cp.kubectl(
            "get", "events", "-n", "default", "--field-selector", "involvedObject.name=regex", "-o", "json"
        ).stdout)["items"]), 10, "the reason as an Event", poll_s=0.2)
    assert "matches()" in live.cache.rejected["default/regex"].reason
    assert not read(cp, "pod", "regex")["spec"].get("nodeName")
    assert not results(read(cp, "resourceclaim", "regex"))


async def test_a_queue_quota_per_model_counts_claimed_gpus(cp):
    cp.create_namespace("dra-quota")
    node(cp, "dra-q", "quota")
    gpu_slice(cp, "dra-q", gpus=4, group="quota")
    cls = device_class(cp, "quota")
    cp.apply({"apiVersion": "gpuaware.io/v1alpha1", "kind": "GPUQueue", "metadata": {"name": "dra-quota"},
              "spec": {"tenant": "dra-quota", "namespaces": ["dra-quota"], "borrowing": {"enabled": False},
                       "quota": [{"model": "H100", "gpus": 2}]}})
    for i in range(2):
        claim(cp, f"q{i}", cls, count=2 if i == 0 else 1, ns="dra-quota")
        pod(cp, f"q{i}", [f"q{i}"], ns="dra-quota")
    async with scheduler(cp) as live:
        await bound(cp, "q0", "dra-quota")
        await wait_for(lambda: "quota" in live.unschedulable._reported.get("dra-quota/q1", ""), 10, "q1 over quota")
    assert not read(cp, "pod", "q1", "dra-quota")["spec"].get("nodeName")


async def test_mig_partitions_are_allocated_without_overlapping_memory_slices(cp):
    parts = tuple([dra.MigPartition("1g.10gb", 19, p, 1, 9856 * 2**20, 14) for p in range(7)]
                  + [dra.MigPartition("3g.40gb", 9, p, 4, 40192 * 2**20, 42, 3, 2) for p in (0, 4)]
                  + [dra.MigPartition("7g.80gb", 0, 0, 8, 79 * 2**30, 98, 7, 5, 0, 1, 1)])  # the GPU's counters
    gpu = NodeGpu(0, "GPU-dra-m-0", "NVIDIA A100-SXM4-80GB", 80 * GB, architecture="Ampere", partitions=parts)
    node(cp, "dra-m", "mig")
    r = client.ResourceV1Api(admin(cp))
    for s in node_slices("dra-m", [gpu], generation=1):
        for d in (s["spec"].get("devices") or []):
            d["attributes"]["gpu.gpuaware.io/testGroup"] = {"string": "mig"}
        r.create_resource_slice(s, _preload_content=False)
    cls = device_class(cp, "mig", kind="mig")
    profile = f'device.attributes["{dra.DRIVER}"].profile'
    claim(cp, "m3", cls, selectors=(f'{profile} == "3g.40gb"',))
    pod(cp, "m3", ["m3"])
    async with scheduler(cp) as live:
        await bound(cp, "m3")
        (three,) = results(read(cp, "resourceclaim", "m3"))
        start = int(three["device"].rsplit("-", 1)[1])
        for i in range(4):  # 3g (4 slices) + three 1g fill the GPU's compute: a fourth 1g waits
            claim(cp, f"m1-{i}", cls, selectors=(f'{profile} == "1g.10gb"',))
            pod(cp, f"m1-{i}", [f"m1-{i}"])
        await wait_for(lambda: sum(bool(read(cp, "pod", f"m1-{i}")["spec"].get("nodeName")) for i in range(4)) == 3,
                       30, "three 1g placed", poll_s=0.2)
        await wait_for(lambda: any(k.startswith("default/m1-") for k in live.cache.pending), 10, "one 1g waiting")
    ones = [results(read(cp, "resourceclaim", f"m1-{i}")) for i in range(4)]
    taken = [int(r[0]["device"].rsplit("-", 1)[1]) for r in ones if r]
    assert three["device"].startswith("gpu-0-mig-3g40gb-9-") and len(taken) == 3 == len(set(taken))
    assert not set(taken) & set(range(start, start + 4)), (three, taken)  # no memory slice twice


async def test_a_placement_cut_short_after_its_claim_writes_is_bound_where_the_claims_say(cp):
    node(cp, "dra-s", "resume")
    gpu_slice(cp, "dra-s", gpus=4, group="resume")
    cls = device_class(cp, "resume")
    claim(cp, "cut", cls)
    pod(cp, "cut", ["cut"])
    # What a scheduler that stopped between the claim's status write and the Binding leaves behind.
    await cut_short(cp, "cut", "dra-s", "gpu-2")
    async with scheduler(cp) as live:
        assert await bound(cp, "cut") == "dra-s"
        c = live.cache.cluster
        assert c.gpu_free[c.index["dra-s"], :4].tolist() == [1000, 1000, 0, 1000]  # its claim's GPU, once
    assert [x["device"] for x in results(read(cp, "resourceclaim", "cut"))] == ["gpu-2"]


async def test_a_lasting_refusal_of_the_claim_write_leaves_the_pod_alone_instead_of_asking_every_pass(cp):
    """As a ServiceAccount granted everything but ``resourceclaims/binding`` (1.36 refuses the allocation
    with 422): the pod gets the apiserver's reason once, and the write is not repeated pass after pass."""
    grants = []
    for d in cp.rbac:  # type: ignore[attr-defined]
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding") and d["metadata"]["name"].startswith("gpuaware-sched"):
            d = json.loads(json.dumps(d).replace("gpuaware-scheduler", "dra-no-binding"))
            for rule in d.get("rules") or []:
                rule["resources"] = [r for r in rule["resources"] if r != "resourceclaims/binding"]
            d["rules" if d["kind"] == "ClusterRole" else "subjects"] = [
                x for x in d.get("rules" if d["kind"] == "ClusterRole" else "subjects") or [] if x.get("resources", 1)]
            grants.append(d)
    cp.apply(yaml.safe_dump_all(grants))
    node(cp, "dra-f", "forbidden")
    gpu_slice(cp, "dra-f", gpus=2, group="forbidden")
    cls = device_class(cp, "forbidden")
    claim(cp, "nobind", cls)
    pod(cp, "nobind", ["nobind"])
    async with scheduler(cp, account_name="dra-no-binding") as live:
        await wait_for(lambda: "default/nobind" in live.cache.rejected, 30, "left alone")
        assert "resourceclaims/binding" in live.cache.rejected["default/nobind"].reason
        for _ in range(5):  # passes place nothing for it (requeued, each would write the claim again)
            live.schedule_once()
            await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert live.stats.api_errors[("update-claim-status", 422)] == 1
    assert not read(cp, "pod", "nobind")["spec"].get("nodeName")


async def test_the_claims_writes_and_the_binding_go_on_while_a_pass_holds_the_event_loop(cp):
    # The finalizer, the claim's status and the Binding are made on one API thread: none waits for the loop,
    # which a pass holds for tens of milliseconds (here: until the pod is bound, or 30 s have passed).
    node(cp, "dra-held", "held")
    gpu_slice(cp, "dra-held", gpus=1, islands=1, group="held")
    claim(cp, "held", device_class(cp, "held"))
    pod(cp, "held", ["held"])
    async with scheduler(cp, lead=False) as live:
        await wait_for(lambda: "default/held" in live.cache.pending, 10, "the pod queued", poll_s=0.1)
        live.schedule_once()  # the placement's bind task is spawned ...
        await asyncio.sleep(0)  # ... and runs to its first wait on the API
        deadline = time.monotonic() + 30
        while not read(cp, "pod", "held")["spec"].get("nodeName") and time.monotonic() < deadline:
            time.sleep(0.2)  # the loop held, as by a long pass
        assert read(cp, "pod", "held")["spec"].get("nodeName") == "dra-held"
        await wait_for(lambda: len(live.tasks) == 0, 30, "the bind task done")
    assert results(read(cp, "resourceclaim", "held"))[0]["pool"] == "dra-held"
    assert dra_claims.FINALIZER in read(cp, "resourceclaim", "held")["metadata"]["finalizers"]


async def test_a_claim_deleted_while_allocated_keeps_its_device_until_it_is_deallocated(cp):
    """kube-scheduler's delete-protection finalizer: gpuaware puts it on before the allocation, so deleting
    the claim of a running pod leaves the claim (deletionTimestamp set) and its allocation in the API."""
    node(cp, "dra-d", "delete")
    gpu_slice(cp, "dra-d", gpus=1, islands=1, group="delete")
    cls = device_class(cp, "delete")
    claim(cp, "kept", cls)
    pod(cp, "kept", ["kept"])
    async with scheduler(cp):
        await bound(cp, "kept")
    kept = read(cp, "resourceclaim", "kept")
    assert kept["metadata"]["finalizers"] == [dra_claims.FINALIZER]
    cp.kubectl("delete", "resourceclaim", "kept", "-n", "default", "--wait=false")
    kept = read(cp, "resourceclaim", "kept")
    assert kept["metadata"].get("deletionTimestamp") and [r["device"] for r in results(kept)] == ["gpu-0"]
    claim(cp, "after", cls)
    pod(cp, "after", ["after"])
    async with scheduler(cp) as live:  # restarted: the deleted claim still holds the node's only GPU
        await wait_for(lambda: "default/after" in live.cache.pending and "default/kept" in live.cache.dra.state.claims,
                       10, "the pod and the claim read")
        for _ in range(3):
            live.schedule_once()
            await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert not read(cp, "pod", "after")["spec"].get("nodeName")
        # A pod whose claim is being deleted waits with that reason, and its claim is not allocated.
        pod(cp, "late", ["kept"])
        await wait_for(lambda: "default/late" in live.cache.rejected, 10, "the late pod left waiting")
        assert "ResourceClaim default/kept is being deleted" in live.cache.rejected["default/late"].reason
    assert [r["device"] for r in results(read(cp, "resourceclaim", "kept"))] == ["gpu-0"]
    assert not results(read(cp, "resourceclaim", "after"))


async def test_memory_shares_of_shareable_gpus_are_packed_without_over_committing_a_gpu(cp):
    node(cp, "dra-sh", "share")
    gpu_slice(cp, "dra-sh", gpus=2, islands=1, group="share", shareable=True)
    cls = device_class(cp, "share")
    for i in range(5):  # 30 GiB each on two 80 GiB GPUs: two per GPU, the fifth waits
        claim(cp, f"sh{i}", cls, capacity={"memory": "30Gi"})
        pod(cp, f"sh{i}", [f"sh{i}"])

    def placed(names: list[str]) -> list[str]:
        return [n for n in names if read(cp, "pod", n)["spec"].get("nodeName")]

    async def passes(live: LiveScheduler) -> None:
        for _ in range(3):
            live.schedule_once()
            await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")

    first = [f"sh{i}" for i in range(5)]
    async with scheduler(cp) as live:
        await wait_for(lambda: len(placed(first)) == 4, 30, "four shares placed", poll_s=0.2)
        claim(cp, "sh-whole", cls)  # a whole GPU: both are shared, so it waits
        pod(cp, "sh-whole", ["sh-whole"])
        await wait_for(lambda: "default/sh-whole" in live.cache.pending, 10, "the whole-GPU pod waiting")
        await passes(live)
        assert len(placed(first)) == 4 and not placed(["sh-whole"])
    # The waiting pods go (a waiting whole-GPU pod would have the node kept for it), then a new process, with
    # only the claims to go by: 20 GiB fits beside two 30 GiB shares, another 30 GiB nowhere.
    for name in [*set(first) - set(placed(first)), "sh-whole"]:
        cp.kubectl("delete", "pod", name, "-n", "default", "--wait=false")
    claim(cp, "sh-small", cls, capacity={"memory": "20Gi"})
    pod(cp, "sh-small", ["sh-small"])
    async with scheduler(cp) as live:
        await bound(cp, "sh-small")
        claim(cp, "sh-more", cls, capacity={"memory": "30Gi"})
        pod(cp, "sh-more", ["sh-more"])
        await wait_for(lambda: "default/sh-more" in live.cache.pending, 10, "the last share waiting")
        await passes(live)
        assert not placed(["sh-more"])
    used: dict[str, int] = {}
    ids = []
    for name in [*first, "sh-small", "sh-more", "sh-whole"]:
        for r in results(read(cp, "resourceclaim", name)):
            assert r["pool"] == "dra-sh" and r["shareID"] and r["consumedCapacity"]["memory"], r
            used[r["device"]] = used.get(r["device"], 0) + int(r["consumedCapacity"]["memory"])
            ids.append(r["shareID"])
    assert sorted(used.values()) == [60 * GB, 80 * GB], used  # never more than a GPU's 80 GiB
    assert len(ids) == 5 == len(set(ids))


async def test_a_claim_shared_by_several_pods_binds_them_all_where_it_is_and_its_device_counts_once(cp):
    node(cp, "dra-j", "joint")
    gpu_slice(cp, "dra-j", gpus=2, islands=1, group="joint")
    cls = device_class(cp, "joint")
    for name in ("team", "solo", "extra"):
        claim(cp, name, cls)
    for name, claims in (("team-a", ["team"]), ("team-b", ["team"]), ("solo", ["solo"])):
        pod(cp, name, claims)  # queued together: one of the team allocates the claim, the other joins it
    async with scheduler(cp) as live:
        for name in ("team-a", "team-b", "solo"):
            assert await bound(cp, name) == "dra-j"
        team = read(cp, "resourceclaim", "team")
        uids = {read(cp, "pod", n)["metadata"]["uid"] for n in ("team-a", "team-b")}
        assert {r["uid"] for r in team["status"]["reservedFor"]} == uids
        assert len(results(team)) == 1 and results(team)[0]["device"] != results(read(cp, "resourceclaim",
                                                                                         "solo"))[0]["device"]
        pod(cp, "extra", ["extra"])  # both GPUs are taken (the shared one once): it waits
        await wait_for(lambda: "default/extra" in live.cache.pending, 10, "the third claim waiting")
        live.schedule_once()
        await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert not read(cp, "pod", "extra")["spec"].get("nodeName")
        c = live.cache.cluster
        assert (c.gpu_free[c.index["dra-j"]] == 0).all()
        held = sorted(live.cache.running[f"default/{n}"].workload.num_gpu for n in ("team-a", "team-b"))
        assert held == [0, 1], held  # counted once, in the model and in the quotas
    # Pods joining the claim in one go, each written from the claim as the cache read it (a 409 for all but the
    # first: the claim is read again and the write tried again); one whose placement is withdrawn (its Binding
    # refused) takes itself off again, and only itself: the claim stays allocated for the others. (A scheduler
    # not leading: no pass places them meanwhile.)
    for name in ("team-c", "team-d"):
        pod(cp, name, ["team"])
    async with scheduler(cp, lead=False) as live:
        await wait_for(lambda: all(live.cache.dra.joins.get(f"default/{n}") == "dra-j" for n in ("team-c", "team-d")),
                       10, "team-c and team-d joining")
        joiners = [read(cp, "pod", n) for n in ("team-c", "team-d")]
        stale = dict(live.cache.dra.state.claims)
        written = [await live.binder.claims.share(stale, ["default/team"], "dra-j", j) for j in joiners]
        assert live.stats.api_errors[("update-claim-status", 409)] == 1  # team-d's first try
        joined = read(cp, "resourceclaim", "team")["status"]
        new = {j["metadata"]["uid"] for j in joiners}
        assert {r["uid"] for r in joined["reservedFor"]} == uids | new
        await live.binder.claims.release(written[0])  # with team-d's write since: a patch, not the claim as read
        left = read(cp, "resourceclaim", "team")["status"]
        assert {r["uid"] for r in left["reservedFor"]} == uids | {joiners[1]["metadata"]["uid"]}
        assert left["allocation"] == team["status"]["allocation"]
        with pytest.raises(dra_writer.ClaimsRefused, match="no longer allocated on dra-other"):
            await live.binder.claims.share(stale, ["default/team"], "dra-other", joiners[0])


async def test_a_claim_changed_after_its_allocation_is_still_released_when_its_binding_fails(cp):
    """The placement's claim write landed, then the claim changed (a label: a new resourceVersion), then the
    Binding failed: the release's 409 reads the claim again and, still reserved for this pod alone, it is
    deallocated, not left allocated to nobody."""
    node(cp, "dra-rel", "release")
    gpu_slice(cp, "dra-rel", gpus=1, group="release")
    cls = device_class(cp, "release")
    claim(cp, "rel", cls)
    pod(cp, "rel", ["rel"])
    async with scheduler(cp, lead=False) as live:
        await wait_for(lambda: "default/rel" in live.cache.dra.state.claims and "default/rel" in live.cache.pending, 10,
                       "the claim and the pod read")
        device = next(d for d in live.cache.dra.state.inventory.devices.values() if d.node == "dra-rel")
        picks = [(dra_claims.DeviceRequest("default/rel", "gpus", 1, ()), device)]
        written = await live.binder.claims.allocate(live.cache.dra.state.claims, "dra-rel", picks,
                                                    read(cp, "pod", "rel"))
        assert results(read(cp, "resourceclaim", "rel"))
        cp.kubectl("label", "resourceclaim", "rel", "-n", "default", "touched=yes")
        await live.binder.claims.release(written)
    after = read(cp, "resourceclaim", "rel")
    assert not (after.get("status") or {}).get("allocation") and not after["status"].get("reservedFor")
    assert dra_claims.FINALIZER not in (after["metadata"].get("finalizers") or [])


async def test_claims_allocated_on_a_node_that_is_gone_are_deallocated_and_the_pod_goes_elsewhere(cp):
    """A placement cut short after its claim write, and then its node deleted (its slice left behind: no
    garbage collector here): as kube-scheduler's DRA PostFilter, the claim, reserved for this pod alone, is
    deallocated, and the pod is placed afresh on a node that is there."""
    for name in ("dra-gone", "dra-here"):
        node(cp, name, "strand")
        gpu_slice(cp, name, gpus=2, group="strand")
    cls = device_class(cp, "strand")
    claim(cp, "strand", cls)
    pod(cp, "strand", ["strand"])
    await cut_short(cp, "strand", "dra-gone", "gpu-0")
    cp.kubectl("delete", "node", "dra-gone", "--wait=false")
    async with scheduler(cp):
        assert await bound(cp, "strand") == "dra-here"
    assert [x["pool"] for x in results(read(cp, "resourceclaim", "strand"))] == ["dra-here"]


async def test_an_admin_access_claim_gets_gpus_in_use_and_takes_none_where_the_namespace_allows_it(cp):
    """A monitoring pod's claim with ``adminAccess`` for the node's only GPU, which another pod's claim holds:
    the apiserver refuses such a claim outside a namespace labelled for admin access; inside one gpuaware places
    the pod, the apiserver takes the allocation (``adminAccess: true``), and the GPU stays the other claim's
    (a third claim still waits for it)."""
    node(cp, "dra-adm", "admin")
    gpu_slice(cp, "dra-adm", gpus=1, islands=1, group="admin")
    cls = device_class(cp, "admin")
    admin_claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "watch"},
                   "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                       "deviceClassName": cls, "adminAccess": True}}]}}}
    refused = cp.kubectl("apply", "-f", "-", "-n", "default", input=json.dumps(admin_claim), check=False)
    assert refused.returncode != 0 and "admin-access" in refused.stderr, refused.stderr
    cp.create_namespace("monitoring")
    cp.kubectl("label", "namespace", "monitoring", "resource.kubernetes.io/admin-access=true")
    cp.kubectl("apply", "-f", "-", "-n", "monitoring", input=json.dumps(admin_claim))
    claim(cp, "busy", cls)
    claim(cp, "later", cls)
    pod(cp, "busy", ["busy"])
    async with scheduler(cp) as live:
        assert await bound(cp, "busy") == "dra-adm"
        pod(cp, "watcher", ["watch"], ns="monitoring")
        assert await bound(cp, "watcher", "monitoring") == "dra-adm"
        watch, busy = read(cp, "resourceclaim", "watch", "monitoring"), read(cp, "resourceclaim", "busy")
        assert [(r["device"], r.get("adminAccess")) for r in results(watch)] == [(results(busy)[0]["device"], True)]
        assert live.cache.running["monitoring/watcher"].allocation.gpus == []  # no GPU of its own in the model
        pod(cp, "later", ["later"])  # the GPU is still busy's: admin access took nothing
        await wait_for(lambda: "default/later" in live.cache.pending, 10, "the third claim waiting")
        live.schedule_once()
        await wait_for(lambda: len(live.tasks) == 0, 30, "the pass's tasks done")
        assert not read(cp, "pod", "later")["spec"].get("nodeName")
