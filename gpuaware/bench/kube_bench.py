"""``gpuaware bench scheduler`` on the real control plane: kube-scheduler, kube-scheduler + gpuaware's
extender, and gpuaware as the scheduler, side by side on the same pods.

Setup: etcd, kube-apiserver, kube-scheduler and kwok of ``KubeControlPlane`` (the pinned v1.36.3
binaries), the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv`` as kwok nodes (kwok keeps them
Ready and runs what is bound to them). Pods are sampled from the openb pod trace (seeded); each mode
gets the same pods, written as that mode needs them:

- ``kube_scheduler``: the default kube-scheduler alone; a fractional pod asks for a whole
  ``nvidia.com/gpu`` (it cannot ask for less);
- ``extender``: kube-scheduler with the shipped extender configuration (``nodeCacheCapable``, no
  ``managedResources``, ``bindVerb``: gpuaware's extender writes the Bindings; over plain HTTP on
  loopback here) and gpuaware's extender in this process, as its settings ship (``extender_one_node``:
  /filter keeps the core's pick, so kube-scheduler binds without scoring); a fractional pod carries only
  ``gpuaware.io/gpu-milli``;
- ``gpuaware``: gpuaware's live scheduler binds (``schedulerName: gpuaware``), in this process,
  without the state feed (neither kube-scheduler mode sees telemetry either);
- ``ceiling`` (opt-in: ``--modes``): no scheduler at all, a binder that decides nothing
  (``gpuaware.bench.kube_ceiling``), for the most pods/s this control plane takes on this machine at that moment;
- ``extender_ceiling`` (opt-in): kube-scheduler with the ``extender`` mode's configuration and an extender that
  decides nothing (``gpuaware.bench.extender_ceiling``), for the most pods/s kube-scheduler reaches through one
  Python extender hop per pod.

The driver (``gpuaware.bench.kube_harness``: its own processes, pre-serialised bodies, keep-alive connection
pools) creates the pods and watches them; it stamps creation (just before the POST) and binding (the
watch event that first shows ``spec.nodeName``) on one clock. Per mode: a backlog of ``burst`` pods
created before the mode's scheduler starts, ``pods_per_s`` = bound backlog pods / (last binding - the
moment the scheduler was started: its start-up and informer sync count, this box's pod creation does
not; ``first_to_last_bind_pods_per_s`` beside it leaves the start-up out); then ``rate`` pods/s for
``seconds``: ``p99_create_to_bind_s``, with ``driver_pods_per_s`` (the rate the driver reached) next to
it; then ``pending`` (pods of both phases not bound after the wait) and ``unallocated_gpu_pct`` (GPU
capacity not requested by a bound pod, as in the fragmentation experiment: a fractional pod given a
whole GPU allocates its fraction). The pods are then deleted (grace period 0) before the next mode.

API budget: ``default`` is each component as shipped: kube-scheduler's clientConnection qps 50,
burst 100 (its Events go through a second client with the same limit); gpuaware's Python client has no
client-side limit. ``raised`` gives every client of every component the same token bucket (``--qps``,
burst ``2 * qps``): kube-scheduler's clientConnection (so its event client too), and for gpuaware (both
modes: the extender binds) a limiter on every request of its API client and of its Events' client, as
client-go's. Within either budget each scheduler paces its Events as shipped: kube-scheduler as fast as
its event client's bucket lets it, gpuaware at ``scheduler.event_qps`` 50, burst 100 (docs/scheduler.md).
The apiserver keeps its default max-requests-inflight (400/200) in both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from kubernetes import client, config

from gpuaware.bench.extender_ceiling import CeilingExtender
from gpuaware.bench.kube_ceiling import SCHEDULER_NAME as CEILING_SCHEDULER
from gpuaware.bench.kube_ceiling import CeilingBinder
from gpuaware.bench.kube_harness import (
    NAMESPACE,
    REPO,
    Pods,
    api_budget,
    backlog_then_steady,
    bench_control_plane,
    driver_process,
    raised_qps,
)
from gpuaware.bench.scheduler_bench import trace_sample
from gpuaware.local.kube_control_plane import KWOK_NODE_ANNOTATION, KubeControlPlane
from gpuaware.local.processes import free_port
from gpuaware.plumbing.gc_policy import fresh_process_gc, loading_long_lived_heap
from gpuaware.plumbing.kube.api import KubeApi
from gpuaware.plumbing.kube.ratelimit import TokenBucket
from gpuaware.scheduler.kube.extender.server import Extender
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.sim.openb import load_nodes
from gpuaware.scheduler.wiring import api_pool_size

SCHEDULER_YAML = REPO / "deploy" / "base" / "scheduler" / "scheduler.yaml"
MODES = ("kube_scheduler", "extender", "gpuaware")
OPT_IN_MODES = ("ceiling", "extender_ceiling")  # run only when named: references, not schedulers
SCHEDULER_NAMES = {"gpuaware": "gpuaware", "ceiling": CEILING_SCHEDULER}


# -- the cluster and the pods ---------------------------------------------------------------------

def kwok_nodes(node_csv: str | Path) -> list[dict[str, Any]]:
    """The openb GPU nodes as Node objects kwok manages (labels as GPU feature discovery sets them)."""
    key, value = KWOK_NODE_ANNOTATION
    out = []
    for n in load_nodes(node_csv):
        res = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi", "nvidia.com/gpu": str(n.gpus), "pods": "110"}
        out.append({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": n.name, "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
                                 "labels": {"kubernetes.io/hostname": n.name, "nvidia.com/gpu.present": "true",
                                            "nvidia.com/gpu.product": n.model}},
                    "status": {"capacity": res, "allocatable": res}})
    return out


def bench_pods(pod_csv: str | Path, count: int, seed: int, prefix: str, mode: str) -> Pods:
    """(name, GPU milli requested, JSON body) of ``count`` trace pods, written for ``mode``."""
    out = []
    for i, w in enumerate(trace_sample(pod_csv, count, seed)):
        frac = w.num_gpu == 1 and w.gpu_milli < 1000
        ann: dict[str, str] = {}
        gpus = w.num_gpu
        if mode != "kube_scheduler":  # the extender, gpuaware and the ceiling read gpuaware's annotations
            if frac:
                ann["gpuaware.io/gpu-milli"] = str(w.gpu_milli)
                gpus = 0
            if w.models:
                ann["gpuaware.io/gpu-models"] = ",".join(w.models)
        name = f"{prefix}-{i:05d}"
        res: dict[str, Any] = {"requests": {"cpu": f"{w.cpu_milli}m", "memory": f"{w.memory_mib}Mi"}}
        if gpus:
            res["limits"] = {"nvidia.com/gpu": str(gpus)}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NAMESPACE, "annotations": ann},
               "spec": {"schedulerName": SCHEDULER_NAMES.get(mode, "default-scheduler"),
                        "containers": [{"name": "main", "image": "registry.invalid/job:1", "resources": res}]}}
        out.append((name, w.num_gpu * w.gpu_milli, json.dumps(pod).encode()))
    return out


def extender_scheduler_config(url: str, qps: tuple[float, int] | None) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration with its extender at ``url`` (plain HTTP, no tlsConfig)."""
    (cm,) = [d for d in yaml.safe_load_all(SCHEDULER_YAML.read_text())
             if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuaware-kube-scheduler-extender"]
    doc = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
    doc.pop("clientConnection", None)
    (ext,) = doc["extenders"]
    ext["urlPrefix"] = url + "/" + ext["urlPrefix"].split("://", 1)[1].split("/", 1)[1]
    ext.pop("tlsConfig", None)
    return _with_qps(doc, qps)


def _with_qps(doc: dict[str, Any], qps: tuple[float, int] | None) -> dict[str, Any]:
    if qps is not None:
        doc["clientConnection"] = {"qps": qps[0], "burst": qps[1]}
    return doc


# -- gpuaware's API client under a token bucket ----------------------------------------------------

class LimitedApiClient(client.ApiClient):
    """Every request (lists, watches, writes) takes a token first, as in client-go."""

    def __init__(self, cfg: client.Configuration, bucket: TokenBucket):
        super().__init__(cfg)
        self.bucket = bucket

    def call_api(self, *args: Any, **kw: Any) -> Any:
        self.bucket.take()
        return super().call_api(*args, **kw)


def _api(kubeconfig: Path, qps: tuple[float, int] | None, pool: int = 64) -> KubeApi:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    api_client = LimitedApiClient(cfg, TokenBucket(*qps)) if qps else client.ApiClient(cfg)
    return KubeApi(api_client)


# -- the run ----------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def running(binder: CeilingBinder) -> AsyncIterator[None]:
    """A ceiling binder started (its informers synced) for the block, stopped after it."""
    await asyncio.to_thread(binder.start)
    try:
        yield
    finally:
        await asyncio.to_thread(binder.stop)


@contextlib.asynccontextmanager
async def _scheduler(mode: str, cp: KubeControlPlane, qps: tuple[float, int] | None,
                     dra: bool = False) -> AsyncIterator[None]:
    """``mode``'s scheduler, running until the block ends; ``dra``: gpuaware allocates ResourceClaims."""
    settings = SchedulerSettings(extender_port=0, leader_elect=False, stale_after_s=3600, dra=dra)
    if mode == "ceiling":
        nodes = await asyncio.to_thread(_node_gpus, cp)
        async with running(CeilingBinder(_api(cp.kubeconfig, qps, api_pool_size(settings)), nodes,
                                         settings.bind_workers)):
            yield
        return
    if mode == "extender_ceiling":
        async with _ceiling_extender(cp, qps, settings.bind_workers):
            yield
        return
    if mode == "kube_scheduler":
        doc = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        await asyncio.to_thread(cp.start_scheduler, _with_qps(doc, qps))
        try:
            yield
        finally:
            await asyncio.to_thread(cp.stop_scheduler)
        return
    # extender and gpuaware: gpuaware's informers and Bindings (the extender's /bind) in this process, its
    # collector as ``gpuaware scheduler`` runs it (gpuaware.scheduler.main), from a fresh process's (``_measure_mode``).
    with loading_long_lived_heap():
        # Events on a client of their own under the budget's bucket, as kube-scheduler's eventClient.
        live = LiveScheduler(_api(cp.kubeconfig, qps, api_pool_size(settings)), settings, None,
                             events_api=_api(cp.kubeconfig, qps, 4))
        await live.start(sync_timeout_s=120)
    stop = asyncio.Event()
    task = asyncio.create_task(live.run(stop))
    runner: web.AppRunner | None = None
    try:
        if mode == "gpuaware":
            live.leading.set()
        else:
            ext = Extender.from_settings(live.cache, live.passes.core, lambda: True, settings, calls=live.calls)
            runner = web.AppRunner(ext.app(), access_log=None)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await asyncio.to_thread(cp.start_scheduler, extender_scheduler_config(f"http://127.0.0.1:{port}", qps))
        yield
    finally:
        if mode == "extender":
            await asyncio.to_thread(cp.stop_scheduler)
        stop.set()
        await task
        if runner is not None:
            await runner.cleanup()
        await live.stop()


@contextlib.asynccontextmanager
async def _ceiling_extender(cp: KubeControlPlane, qps: tuple[float, int] | None,
                            workers: int) -> AsyncIterator[None]:
    """kube-scheduler with the shipped extender configuration pointing at a ``CeilingExtender``."""
    ext = CeilingExtender(_api(cp.kubeconfig, qps, workers), workers)
    runner = web.AppRunner(ext.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.to_thread(cp.start_scheduler, extender_scheduler_config(f"http://127.0.0.1:{port}", qps))
        try:
            yield
        finally:
            await asyncio.to_thread(cp.stop_scheduler)
    finally:
        await runner.cleanup()
        ext.close()


def _node_gpus(cp: KubeControlPlane) -> list[tuple[str, int]]:
    """(name, whole GPUs) of every node, listed as the ceiling's start-up (gpuaware's informers list them too)."""
    api = _api(cp.kubeconfig, None)
    items = json.loads(api.core.list_node(_preload_content=False).data)["items"]
    return [(n["metadata"]["name"], int(n["status"]["allocatable"].get("nvidia.com/gpu", 0))) for n in items]


async def _measure_mode(mode: str, cp: KubeControlPlane, conn, qps: tuple[float, int] | None, pod_csv: str,
                        burst: int, rate: float, seconds: float, seed: int, capacity_milli: int, tag: str,
                        progress: Callable[[str], None]) -> dict[str, Any]:
    async def ask(cmd: tuple) -> Any:
        await asyncio.to_thread(conn.send, cmd)
        return await asyncio.to_thread(conn.recv)

    burst_pods = bench_pods(pod_csv, burst, seed, f"{tag}-burst", mode)
    n_steady = int(rate * seconds)
    steady_pods = bench_pods(pod_csv, n_steady, seed + 1, f"{tag}-steady", mode)
    # Every mode starts with a fresh process's collector, before the clock starts: an earlier mode's settled
    # (frozen, tuned) heap would flatter the next one's start-up and keep the finished scheduler alive.
    fresh_process_gc()
    try:
        figures = await backlog_then_steady(ask, _scheduler(mode, cp, qps), burst_pods, steady_pods, rate, seconds,
                                            300.0, progress, f"{mode} ({tag})")
        done = figures.pop("done")
        milli = {n: m for n, m, _ in burst_pods + steady_pods}
        return {
            **figures,
            "unallocated_gpu_pct": round(100.0 * (1 - sum(milli[n] for n in done) / capacity_milli), 2),
            "pending": len(milli) - len(done),
        }
    finally:
        await ask(("delete",))


def _tag(budget: str, mode: str) -> str:
    """The pods' name prefix: one per budget and mode (``extender`` and ``extender_ceiling`` apart)."""
    return budget[0] + "".join(word[0] for word in mode.split("_"))


def run_kube_bench(node_csv: str, pod_csv: str, burst: int = 1000, rate: float = 200.0, seconds: float = 5.0,
                   seed: int = 0, modes: tuple[str, ...] = MODES, budgets: tuple[str, ...] = ("default", "raised"),
                   qps: float = 500.0, node_count: int | None = None,
                   progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    nodes = kwok_nodes(node_csv)[:node_count]
    capacity_milli = 1000 * sum(int(n["status"]["capacity"]["nvidia.com/gpu"]) for n in nodes)
    budget_table = api_budget(qps)
    t0 = time.monotonic()
    with bench_control_plane(nodes, create_timeout_s=300) as cp, driver_process(cp) as conn:
        progress(f"control plane with {len(nodes)} kwok nodes in {time.monotonic() - t0:.0f}s; "
                 f"versions {cp.versions()}")
        runs: dict[str, Any] = {}
        for budget in budgets:
            q = raised_qps(qps) if budget == "raised" else None
            runs[budget] = {"api_budget": budget_table[budget], "modes": {
                mode: asyncio.run(_measure_mode(mode, cp, conn, q, pod_csv, burst, rate, seconds, seed,
                                                capacity_milli, _tag(budget, mode), progress))
                for mode in modes}}
        return {"nodes": len(nodes), "gpus": capacity_milli // 1000, "burst_pods": burst, "rate_pods_per_s": rate,
                "rate_pods": int(rate * seconds), "versions": cp.versions(), "api_budget": budget_table, "runs": runs}
