"""gpuaware's extender behind a real kube-scheduler (v1.36.3): the shipped extender configuration, over mTLS.

The real control plane (etcd, kube-apiserver, kube-scheduler, kwok) of ``KubeControlPlane``; gpuaware's
informers and extender run in this process, the extender on loopback where the shipped configuration
names the Service. A whole-GPU pod and a pod asking only for a fraction (the ``gpuaware.io/gpu-milli``
annotation) each fit, for kube-scheduler, on more than one kwok node; gpuaware's filter leaves one,
and kube-scheduler binds each pod there.

Skipped when the binaries are not built, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

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
from plumbing.kube.api import KubeApi
from scheduler.kube.extender import Extender
from scheduler.kube.extender_access import server_context
from scheduler.kube.live import LiveScheduler
from scheduler.settings import SchedulerSettings
from tests.support import need

REPO = Path(__file__).resolve().parents[3]
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


def gpu_node(name: str, gpus: int, product: str | None) -> dict[str, Any]:
    node = make_node(name, gpus=gpus, product=product or "none", cpu="32", memory="256Gi")
    node.update(apiVersion="v1", kind="Node")
    key, value = KWOK_NODE_ANNOTATION
    node["metadata"]["annotations"] = {key: value, "node.alpha.kubernetes.io/ttl": "0"}
    if product is None:  # a CPU node: no GPU labels, no nvidia.com/gpu
        node["metadata"]["labels"] = {"kubernetes.io/hostname": name}
        for part in ("capacity", "allocatable"):
            node["status"][part].pop("nvidia.com/gpu")
    del node["status"]["conditions"]  # kwok keeps them
    return node


def pod(name: str, annotations: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/none:0", "resources": resources}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


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
    """The extender, noting which pods it filtered and whether kube-scheduler sent names only."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.filtered: dict[str, dict[str, Any]] = {}

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        result = super().filter(args)
        self.filtered[args["Pod"]["metadata"]["name"]] = {"sent_nodes": args.get("Nodes") is not None,
                                                          "asked": list(args.get("NodeNames") or []),
                                                          "kept": list(result["NodeNames"] or [])}
        return result


async def test_kube_scheduler_binds_whole_and_fractional_gpu_pods_where_gpuawares_extender_says(tmp_path):
    _need_binaries()
    pki = _Pki(tmp_path / "pki")
    cert, key = pki.server("extender", "gpuaware-scheduler-extender", ["IP:127.0.0.1", "DNS:localhost"])
    client_cert, client_key = pki.client("kube-scheduler-extender-client", "system:kube-scheduler")
    tls = {"ca": pki.ca_cert, "client": client_cert, "client_key": client_key}
    settings = SchedulerSettings(pass_interval_s=0.05, extender_port=0, extender_tls_cert_file=str(cert),
                                 extender_tls_key_file=str(key), extender_client_ca_file=str(pki.ca_cert))
    port = free_port()
    cp = KubeControlPlane(kwok=True)
    await asyncio.to_thread(cp.start)
    for crd in ("gpuqueues", "gpuworkloads"):  # the informers list GPUQueues
        await asyncio.to_thread(cp.kubectl, "apply", "-f", str(CRDS / f"gpuaware.io_{crd}.yaml"))
        await asyncio.to_thread(cp.kubectl, "wait", "--for=condition=Established", f"crd/{crd}.gpuaware.io",
                                "--timeout=60s")
    stop = asyncio.Event()
    live: LiveScheduler | None = None
    task: asyncio.Task | None = None
    runner: web.AppRunner | None = None
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        live = LiveScheduler(KubeApi(client.ApiClient(cfg)), settings, None)
        await live.start()
        task = asyncio.create_task(live.run(stop))  # not leading: it only keeps the cache current
        ext = RecordingExtender.from_settings(live.cache, live.passes.core, lambda: True, settings)
        runner = web.AppRunner(ext.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_context(settings)).start()
        await asyncio.to_thread(cp.start_scheduler, shipped_scheduler_config(port, tls))

        nodes = {"h100": ("gpu-h100", 8, "NVIDIA-H100-80GB-HBM3"), "a100": ("gpu-a100", 8, "NVIDIA-A100-SXM4-80GB"),
                 "cpu": ("cpu-only", 0, None)}
        for name, gpus, product in nodes.values():
            await asyncio.to_thread(cp.apply, gpu_node(name, gpus, product))
        await eventually(lambda: asyncio.sleep(0, all(n in live.cache.cluster.index for n, _, _ in nodes.values())),
                         "gpuaware's cache has the nodes")

        # kube-scheduler alone: "whole" fits both GPU nodes, "frac" (no extended resource) all three.
        whole = pod("whole", {"gpuaware.io/gpu-models": "A100"}, gpus=1)
        frac = pod("frac", {"gpuaware.io/gpu-milli": "500", "gpuaware.io/gpu-models": "H100"})
        for p in (whole, frac):
            await asyncio.to_thread(cp.apply, p)

        async def bound(name: str) -> str | None:
            out = await asyncio.to_thread(cp.kubectl, "get", "pod", name, "-o", "json")
            return json.loads(out.stdout)["spec"].get("nodeName")

        assert await eventually(lambda: bound("whole"), "whole-GPU pod bound") == "gpu-a100"
        assert await eventually(lambda: bound("frac"), "fractional pod bound") == "gpu-h100"
        # The extender decided, for both pods, from names only (nodeCacheCapable), over mTLS.
        assert sorted(ext.filtered["whole"]["asked"]) == ["gpu-a100", "gpu-h100"], ext.filtered
        assert ext.filtered["whole"]["kept"] == ["gpu-a100"] and not ext.filtered["whole"]["sent_nodes"]
        assert sorted(ext.filtered["frac"]["asked"]) == ["cpu-only", "gpu-a100", "gpu-h100"], ext.filtered
        assert ext.filtered["frac"]["kept"] == ["gpu-h100"] and not ext.filtered["frac"]["sent_nodes"]
        assert ext.requests[("filter", 200)] >= 2 and not [k for k in ext.requests if k[1] != 200], ext.requests
    finally:
        stop.set()
        if task is not None:
            await task
        if runner is not None:
            await runner.cleanup()
        # The informers' watches end when the apiserver goes: stop both at once.
        stopping = asyncio.create_task(live.stop()) if live is not None else None
        await asyncio.to_thread(cp.stop)
        if stopping is not None:
            await stopping
