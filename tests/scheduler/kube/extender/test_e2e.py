"""gpuaware's extender behind a real kube-scheduler (v1.36.3): the shipped extender configuration, over mTLS.

The real control plane (etcd, kube-apiserver, kube-scheduler, kwok) of ``KubeControlPlane``, one for the
module; gpuaware's informers (as the ``gpuaware-scheduler`` ServiceAccount with the shipped RBAC) and extender
run in this process, the extender on loopback where the shipped
configuration names the Service; each test starts its own kube-scheduler and uses its own labelled nodes.
- A whole-GPU pod and a pod asking only for a fraction (the ``gpuaware.io/gpu-milli`` annotation) each
  fit, for kube-scheduler, on more than one kwok node; gpuaware's filter leaves one, and kube-scheduler
  binds each pod there.
- Preemption: kube-scheduler's DefaultPreemption proposes victims on two nodes; gpuaware's /preempt keeps
  the one whose GPUs the preemptor can use; kube-scheduler evicts only there and binds the preemptor.
- A pod whose gpuaware request is invalid stays Pending as Unschedulable with gpuaware's reason (it is
  not bound past the ``ignorable`` extender).

Skipped when the binaries are not built, except under ``CI=true``, where that is a failure.
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
from aiohttp import web
from kubernetes import client, config

from gpuaware.local.fake_apiserver import make_node
from gpuaware.local.kube_control_plane import (
    KWOK_NODE_ANNOTATION,
    BinariesMissing,
    KubeControlPlane,
    _Pki,
    find_binaries,
)
from gpuaware.local.processes import free_port
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.scheduler.kube.extender.access import server_context
from gpuaware.scheduler.kube.extender.server import Extender
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings
from tests.support import need, shipped_rbac

REPO = Path(__file__).resolve().parents[4]
CRDS = REPO / "deploy" / "base" / "crds"
SCHEDULER_YAML = REPO / "deploy" / "base" / "scheduler" / "scheduler.yaml"


def _need_binaries() -> None:
    need(find_binaries, BinariesMissing)  # skipped without them, failed under CI=true


def shipped_scheduler_config(port: int, tls: dict[str, Path]) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration, its extender on 127.0.0.1:port with these TLS files."""
    (cm,) = [d for d in yaml.safe_load_all(SCHEDULER_YAML.read_text())
             if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuaware-kube-scheduler-extender"]
    doc = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
    doc.pop("clientConnection")  # KubeControlPlane gives it the scheduler's credentials
    (ext,) = doc["extenders"]
    scheme, rest = ext["urlPrefix"].split("://", 1)
    ext["urlPrefix"] = f"{scheme}://127.0.0.1:{port}/{rest.split('/', 1)[1]}"
    ext["tlsConfig"] = {"certFile": str(tls["client"]), "keyFile": str(tls["client_key"]), "caFile": str(tls["ca"])}
    return doc


def gpu_node(name: str, gpus: int, product: str | None, group: str) -> dict[str, Any]:
    """A kwok node labelled ``gpuaware-test: group`` (a test's pods select their own nodes)."""
    node = make_node(name, gpus=gpus, product=product or "none", cpu="32", memory="256Gi")
    node.update(apiVersion="v1", kind="Node")
    key, value = KWOK_NODE_ANNOTATION
    node["metadata"]["annotations"] = {key: value, "node.alpha.kubernetes.io/ttl": "0"}
    node["metadata"]["labels"]["gpuaware-test"] = group
    if product is None:  # a CPU node: no GPU labels, no nvidia.com/gpu
        node["metadata"]["labels"] = {"kubernetes.io/hostname": name, "gpuaware-test": group}
        for part in ("capacity", "allocatable"):
            node["status"][part].pop("nvidia.com/gpu")
    del node["status"]["conditions"]  # kwok keeps them
    return node


def pod(name: str, annotations: dict[str, str], group: str, gpus: int = 0, priority_class: str | None = None
        ) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/none:0", "resources": resources}],
        "nodeSelector": {"gpuaware-test": group}, "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations}, "spec": spec}


async def eventually(check, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not so after {timeout_s:.0f}s (last: {last!r})")


class RecordingExtender(Extender):
    """The extender, noting which pods it filtered (and whether kube-scheduler sent names only) and
    which preemption candidates it was asked about and kept."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.filtered: dict[str, dict[str, Any]] = {}
        self.preempted: dict[str, dict[str, Any]] = {}

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super().preempt(args)
        # The first call per pod: a retry while the victims terminate asks about the remaining node only.
        self.preempted.setdefault(args["Pod"]["metadata"]["name"], {
            "asked": {n: sorted(p["UID"] for p in v.get("Pods") or [])
                      for n, v in (args.get("NodeNameToMetaVictims") or {}).items()},
            "kept": {n: sorted(p["UID"] for p in v.get("Pods") or [])
                     for n, v in result["NodeNameToMetaVictims"].items()}})
        return result

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super().filter(args)
        self.filtered[args["Pod"]["metadata"]["name"]] = {"sent_nodes": args.get("Nodes") is not None,
                                                          "asked": list(args.get("NodeNames") or []),
                                                          "kept": list(result["NodeNames"] or [])}
        return result


@pytest.fixture(scope="module")
def cp() -> Iterator[KubeControlPlane]:
    """One control plane (etcd, kube-apiserver, kwok; no kube-scheduler yet) for the module, CRDs installed."""
    _need_binaries()
    with KubeControlPlane(kwok=True) as plane:
        for crd in ("gpuqueues", "gpuworkloads"):  # the informers list GPUQueues
            plane.kubectl("apply", "-f", str(CRDS / f"gpuaware.io_{crd}.yaml"))
            plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io", "--timeout=60s")
        plane.create_namespace("gpuaware")
        plane.apply(yaml.safe_dump_all(shipped_rbac(plane)))  # gpuaware runs as its ServiceAccount
        yield plane


@contextlib.asynccontextmanager
async def extender_behind_kube_scheduler(cp: KubeControlPlane, tmp_path: Path
                                         ) -> AsyncIterator[tuple[LiveScheduler, RecordingExtender]]:
    """gpuaware's informers and extender (mTLS) in this process, kube-scheduler with the shipped configuration."""
    pki = _Pki(tmp_path / "pki")
    cert, key = pki.server("extender", "gpuaware-scheduler-extender", ["IP:127.0.0.1", "DNS:localhost"])
    client_cert, client_key = pki.client("kube-scheduler-extender-client", "system:kube-scheduler")
    tls = {"ca": pki.ca_cert, "client": client_cert, "client_key": client_key}
    settings = SchedulerSettings(pass_interval_s=0.05, extender_port=0, extender_tls_cert_file=str(cert),
                                 extender_tls_key_file=str(key), extender_client_ca_file=str(pki.ca_cert))
    port = free_port()
    stop = asyncio.Event()
    cfg = client.Configuration()  # as the scheduler's ServiceAccount, with exactly the shipped RBAC
    account = await asyncio.to_thread(cp.serviceaccount_kubeconfig, "gpuaware", "gpuaware-scheduler", create=False)
    config.load_kube_config(config_file=str(account), client_configuration=cfg)
    live = LiveScheduler(KubeApi(client.ApiClient(cfg)), settings, None)
    await live.start()
    task = asyncio.create_task(live.run(stop))  # not leading: it only keeps the cache current
    runner: web.AppRunner | None = None
    try:
        ext = RecordingExtender.from_settings(live.cache, live.passes.core, lambda: True, settings, calls=live.calls)
        runner = web.AppRunner(ext.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(settings)).start()
        await asyncio.to_thread(cp.start_scheduler, shipped_scheduler_config(port, tls))
        yield live, ext
    finally:
        await asyncio.to_thread(cp.stop_scheduler)
        stop.set()
        await task
        if runner is not None:
            await runner.cleanup()
        await live.stop()


async def add_nodes(cp: KubeControlPlane, live: LiveScheduler, nodes: list[dict[str, Any]]) -> None:
    for node in nodes:
        await asyncio.to_thread(cp.apply, node)
    names = [n["metadata"]["name"] for n in nodes]
    await eventually(lambda: asyncio.sleep(0, all(n in live.cache.cluster.index for n in names)),
                     "gpuaware's cache has the nodes")


async def read_pod(cp: KubeControlPlane, name: str) -> dict[str, Any] | None:
    out = await asyncio.to_thread(cp.kubectl, "get", "pod", name, "-o", "json", "--ignore-not-found")
    return json.loads(out.stdout) if out.stdout.strip() else None


async def bound(cp: KubeControlPlane, name: str) -> str | None:
    obj = await read_pod(cp, name)
    return obj["spec"].get("nodeName") if obj else None


async def test_kube_scheduler_binds_whole_and_fractional_gpu_pods_where_gpuawares_extender_says(cp, tmp_path):
    async with extender_behind_kube_scheduler(cp, tmp_path) as (_live, ext):
        await add_nodes(cp, _live, [gpu_node("gpu-h100", 8, "NVIDIA-H100-80GB-HBM3", "place"),
                                    gpu_node("gpu-a100", 8, "NVIDIA-A100-SXM4-80GB", "place"),
                                    gpu_node("cpu-only", 0, None, "place")])
        # kube-scheduler alone: "whole" fits both GPU nodes, "frac" (no extended resource) all three.
        whole = pod("whole", {"gpuaware.io/gpu-models": "A100"}, "place", gpus=1)
        frac = pod("frac", {"gpuaware.io/gpu-milli": "500", "gpuaware.io/gpu-models": "H100"}, "place")
        for p in (whole, frac):
            await asyncio.to_thread(cp.apply, p)

        assert await eventually(lambda: bound(cp, "whole"), "whole-GPU pod bound") == "gpu-a100"
        assert await eventually(lambda: bound(cp, "frac"), "fractional pod bound") == "gpu-h100"
        # The extender decided, for both pods, from names only (nodeCacheCapable), over mTLS.
        assert sorted(ext.filtered["whole"]["asked"]) == ["gpu-a100", "gpu-h100"], ext.filtered
        assert ext.filtered["whole"]["kept"] == ["gpu-a100"] and not ext.filtered["whole"]["sent_nodes"]
        assert sorted(ext.filtered["frac"]["asked"]) == ["cpu-only", "gpu-a100", "gpu-h100"], ext.filtered
        assert ext.filtered["frac"]["kept"] == ["gpu-h100"] and not ext.filtered["frac"]["sent_nodes"]
        assert ext.requests[("filter", 200)] >= 2 and not [k for k in ext.requests if k[1] != 200], ext.requests


async def test_kube_scheduler_preempts_only_the_victims_gpuawares_preempt_keeps(cp, tmp_path):
    for name, value in (("bench-low", 100), ("bench-high", 100_000)):
        await asyncio.to_thread(cp.apply, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                           "metadata": {"name": name}, "value": value})
    async with extender_behind_kube_scheduler(cp, tmp_path) as (live, ext):
        await add_nodes(cp, live, [gpu_node("pre-a100", 2, "NVIDIA-A100-SXM4-80GB", "preempt"),
                                   gpu_node("pre-h100", 2, "NVIDIA-H100-80GB-HBM3", "preempt")])
        # Four low-priority whole-GPU pods fill both nodes (two each: the only places they fit).
        low = [f"low-{i}" for i in range(4)]
        for name in low:
            await asyncio.to_thread(cp.apply, pod(name, {}, "preempt", gpus=1, priority_class="bench-low"))
        placed = {name: await eventually(lambda n=name: bound(cp, n), f"{name} bound") for name in low}
        assert sorted(placed.values()) == ["pre-a100", "pre-a100", "pre-h100", "pre-h100"], placed
        uids = {name: (await read_pod(cp, name))["metadata"]["uid"] for name in low}
        on = {node: sorted(uids[n] for n, where in placed.items() if where == node)
              for node in ("pre-a100", "pre-h100")}
        await eventually(lambda: asyncio.sleep(0, all(f"default/{n}" in live.cache.running for n in low)),
                         "gpuaware's cache has the low pods running")

        # Two A100s, high priority: for kube-scheduler evicting either node's pair makes room; for gpuaware
        # only the A100 node's does (the model), and /preempt says so.
        await asyncio.to_thread(cp.apply, pod("high", {"gpuaware.io/gpu-models": "A100"}, "preempt", gpus=2,
                                              priority_class="bench-high"))
        assert await eventually(lambda: bound(cp, "high"), "the preemptor bound", 180) == "pre-a100"
        answer = ext.preempted["high"]
        assert answer["asked"] == on, answer  # kube-scheduler's candidates: both nodes, with their victims
        assert answer["kept"] == {"pre-a100": on["pre-a100"]}, answer
        # kube-scheduler evicted only what gpuaware kept: the H100 node's pods run on.
        for name, node in placed.items():
            obj = await read_pod(cp, name)
            if node == "pre-a100":
                assert obj is None or obj["metadata"].get("deletionTimestamp"), (name, obj)
            else:
                assert obj is not None and not obj["metadata"].get("deletionTimestamp"), name
        assert ext.requests[("preempt", 200)] >= 1 and not [k for k in ext.requests if k[1] != 200], ext.requests


async def test_a_pod_with_an_invalid_gpuaware_request_stays_pending_with_gpuawares_reason(cp, tmp_path):
    async with extender_behind_kube_scheduler(cp, tmp_path) as (live, ext):
        await add_nodes(cp, live, [gpu_node("bad-a100", 8, "NVIDIA-A100-SXM4-80GB", "invalid")])
        await asyncio.to_thread(cp.apply, pod("bad", {"gpuaware.io/gpu-milli": "5000"}, "invalid"))

        async def unschedulable() -> dict[str, Any] | None:
            obj = await read_pod(cp, "bad")
            conds = [c for c in (obj or {}).get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"]
            return conds[0] if conds and conds[0].get("reason") == "Unschedulable" else None

        cond = await eventually(unschedulable, "the pod marked Unschedulable")
        assert "invalid gpuaware request: gpuaware.io/gpu-milli: 5000 is outside" in cond["message"], cond
        assert await bound(cp, "bad") is None
        assert ext.requests[("filter", 200)] >= 1 and ("preempt", 200) not in ext.requests, ext.requests


async def test_a_burst_of_fractional_pods_never_puts_more_than_a_whole_gpu_on_one(cp, tmp_path):
    async with extender_behind_kube_scheduler(cp, tmp_path) as (live, ext):
        await add_nodes(cp, live, [gpu_node(f"share-{i}", 1, "NVIDIA-A100-SXM4-80GB", "share") for i in range(3)])
        # Twelve pods of 600 milli in one request: three fit (one per GPU). kube-scheduler takes them one after
        # another, each within milliseconds of binding the last, long before gpuaware's watch shows that binding,
        # and kube-scheduler itself does not count milli.
        burst = [pod(f"share-{i:02d}", {"gpuaware.io/gpu-milli": "600"}, "share") for i in range(12)]
        for p in burst:
            p["metadata"]["labels"] = {"burst": "share"}
        await asyncio.to_thread(cp.apply, {"apiVersion": "v1", "kind": "List", "items": burst})

        async def settled() -> list[dict[str, Any]] | None:
            out = await asyncio.to_thread(cp.kubectl, "get", "pods", "-l", "burst=share", "-o", "json")
            items = json.loads(out.stdout)["items"]

            def done(p: dict[str, Any]) -> bool:
                conds = [c for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
                return bool(p["spec"].get("nodeName")) or bool(conds and conds[0].get("reason") == "Unschedulable")
            return items if len(items) == 12 and all(map(done, items)) else None

        items = await eventually(settled, "every pod bound or Unschedulable", 120)
        on: dict[str, list[str]] = {}
        for p in items:
            if p["spec"].get("nodeName"):
                on.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
        assert all(len(pods) == 1 for pods in on.values()), on  # 2 x 600 milli on one GPU is over-commit
        assert sorted(on) == ["share-0", "share-1", "share-2"], on
        # gpuaware bound them (bindVerb), so each carries the GPU it holds, for the device plugin.
        for p in items:
            if p["spec"].get("nodeName"):
                assert json.loads(p["metadata"]["annotations"]["gpuaware.io/gpus"]) == [
                    {"index": 0, "uuid": None, "milli": 600}], p["metadata"]
        assert ext.requests[("bind", 200)] >= 3, ext.requests
