"""The extender path's ceiling on the real apiserver: /filter keeps the first node named, /bind writes the Binding."""

import asyncio

import aiohttp
from aiohttp import web

from gpuaware.bench.extender_ceiling import CeilingExtender
from gpuaware.bench.kube_bench import MODES, OPT_IN_MODES, _tag
from gpuaware.local.processes import free_port
from gpuaware.plumbing.kube.api import KubeApi
from tests.real_kube import api_client


def test_every_mode_of_a_budget_names_its_pods_apart():
    modes = MODES + OPT_IN_MODES
    assert len({_tag("raised", m) for m in modes}) == len(modes)


async def _ask(ext: CeilingExtender, calls: list[tuple[str, dict]]) -> list[dict]:
    runner = web.AppRunner(ext.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            out = []
            for verb, body in calls:
                async with session.post(f"http://127.0.0.1:{port}/{verb}", json=body) as r:
                    assert r.status == 200
                    out.append(await r.json())
            return out
    finally:
        await runner.cleanup()


def test_the_ceiling_extender_keeps_the_first_node_and_binds_by_uid(kube):
    kube.create("nodes", {"metadata": {"name": "ec-node-0"}, "status": {
        "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"},
        "capacity": {"cpu": "8", "memory": "64Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}]}})
    pod = kube.create("pods", {"metadata": {"name": "ec-pod"}, "spec": {
        "schedulerName": "nobody", "containers": [{"name": "main", "image": "registry.invalid/j:1"}]}})
    uid = pod["metadata"]["uid"]
    ext = CeilingExtender(KubeApi(api_client(kube.cp.kubeconfig)), workers=2)
    try:
        filtered, stale, bound = asyncio.run(_ask(ext, [
            ("filter", {"Pod": pod, "NodeNames": ["ec-node-0", "ec-node-1"]}),
            ("bind", {"PodName": "ec-pod", "PodNamespace": "default", "PodUID": "not-its-uid", "Node": "ec-node-0"}),
            ("bind", {"PodName": "ec-pod", "PodNamespace": "default", "PodUID": uid, "Node": "ec-node-0"}),
        ]))
    finally:
        ext.close()
    assert filtered["NodeNames"] == ["ec-node-0"] and filtered["Error"] == ""
    assert stale["Error"]  # another pod's UID: refused by the apiserver, said to kube-scheduler
    assert bound == {"Error": ""}
    assert (ext.bound, ext.failed) == (1, 1)
    assert kube.get("pods", "ec-pod")["spec"]["nodeName"] == "ec-node-0"
