"""The extender's /filter as kube-scheduler calls it, with ``nodeCacheCapable: false`` (every Node in the
request) and ``true`` (node names only): request bytes and latency over loopback HTTP, printed as JSON.

    python -m gpuaware.bench.extender_bench [--nodes 500] [--requests 50] [--asked 1.0]

The cluster is ``--nodes`` 8-GPU nodes, every fourth one half used; the pod asks for one GPU. Node
objects are fake_apiserver.make_node's plus ``--images`` entries in ``status.images`` (the kubelet
reports up to 50 by default), which bring a Node near the ~9 KB of a real GPU node. ``--asked``: the
share of the nodes each request names (kube-scheduler sends those its ``percentageOfNodesToScore`` found
feasible: about 0.4 of 1,213 nodes). ``filter_handler_cpu_ms_mean``: the /filter handler's CPU (thread
time) with the ``nodeCacheCapable: true`` arguments, without HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp
from aiohttp import web

from gpuaware.local.fake_apiserver import make_node, make_pod
from gpuaware.local.processes import free_port
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.core.policies import profile
from gpuaware.scheduler.core.workload_mix import WorkloadMix
from gpuaware.scheduler.kube.cache import ClusterCache
from gpuaware.scheduler.kube.extender.server import Extender


def cluster(n: int, images: int) -> tuple[ClusterCache, list[dict]]:
    nodes = [make_node(f"node-{i:05d}", gpus=8) for i in range(n)]
    for node in nodes:
        node["status"]["images"] = [{"names": [f"registry.example.com/team/image-{j}@sha256:{j:064x}",
                                               f"registry.example.com/team/image-{j}:v1.{j}.0"],
                                     "sizeBytes": 1_000_000_000 + j} for j in range(images)]
    cache = ClusterCache()
    cache.sync_nodes(nodes)
    bound = []
    for i in range(0, n, 4):
        pod = make_pod(f"busy-{i}", gpus=4, scheduler="default-scheduler")
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["spec"]["nodeName"] = nodes[i]["metadata"]["name"]
        pod["status"] = {"phase": "Running"}
        bound.append(pod)
    cache.sync_pods(bound)
    return cache, nodes


async def measure(n_nodes: int, n_requests: int, images: int = 50, asked: float = 1.0) -> dict:
    cache, nodes = cluster(n_nodes, images)
    core = Scheduler(profile("gpuaware", WorkloadMix(), 0))
    ext = Extender(cache, lambda: core, lambda: True)
    runner = web.AppRunner(ext.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    pod = make_pod("new", gpus=1, scheduler="default-scheduler")
    nodes = nodes[:max(1, round(asked * n_nodes))]
    names = [n["metadata"]["name"] for n in nodes]
    bodies = {
        "nodeCacheCapable=false": json.dumps({"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}).encode(),
        "nodeCacheCapable=true": json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode(),
    }
    out: dict = {"nodes": n_nodes, "nodes_asked": len(names), "requests": n_requests, "images_per_node": images}
    try:
        async with aiohttp.ClientSession() as http:
            for mode, body in bodies.items():
                times, answer_bytes = [], 0
                for _ in range(n_requests + 3):  # the first three warm up
                    t0 = time.perf_counter()
                    async with http.post(f"http://127.0.0.1:{port}/filter", data=body,
                                         headers={"Content-Type": "application/json"}) as resp:
                        answer = await resp.read()
                        assert resp.status == 200, answer[:200]
                    times.append(time.perf_counter() - t0)
                    answer_bytes = len(answer)
                times = sorted(times[3:])
                out[mode] = {"request_bytes": len(body), "answer_bytes": answer_bytes,
                             "latency_ms_p50": round(statistics.median(times) * 1000, 2),
                             "latency_ms_p95": round(times[int(0.95 * (len(times) - 1))] * 1000, 2),
                             "kept_nodes": len(json.loads(answer)["NodeNames"] or
                                               (json.loads(answer)["Nodes"] or {}).get("items") or [])}
    finally:
        await runner.cleanup()
    # The handler's own CPU, called directly (no HTTP, no parsing): on this thread's clock, so that other work on
    # the box (which stretches every latency above) does not count.
    args = {"Pod": pod, "Nodes": None, "NodeNames": names}
    cpu = []
    for _ in range(n_requests + 3):
        t0 = time.thread_time()
        ext.filter(args)
        cpu.append(time.thread_time() - t0)
    out["filter_handler_cpu_ms_mean"] = round(statistics.fmean(cpu[3:]) * 1000, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--asked", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.nodes, args.requests, args.images, args.asked)), indent=2))


if __name__ == "__main__":
    main()
