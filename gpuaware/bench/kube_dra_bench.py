"""``gpuaware bench scheduler --dra``: kube-scheduler's DRA path and gpuaware allocating the same
ResourceClaims, side by side on the real control plane.

Setup as ``gpuaware.bench.kube_bench``: etcd, kube-apiserver, kube-scheduler and kwok (the pinned v1.36.3
binaries), the openb GPU nodes as kwok nodes (without ``nvidia.com/gpu``: the GPUs are devices), for
each node its ResourceSlice as gpuaware's publisher writes it (``gpuaware.plumbing.kube.resource_slices``:
NVIDIA-shaped devices of driver ``gpu.nvidia.com``, ``productName`` the openb model) and the shipped
DeviceClasses. Every trace pod that asks for GPUs gets a ResourceClaim created before it (there is no
kube-controller-manager, so ``resourceClaimName``, not a template):

- one request ``ExactCount`` of ``num_gpu`` devices of class ``gpu.nvidia.com``;
- ``gpu_spec`` (allowed models): a CEL selector on ``productName``;
- a fractional pod (one GPU, ``gpu_milli`` < 1000), ``fraction``: ``whole`` (default) asks for a whole
  GPU; ``memory`` asks for its fraction of the smallest GPU memory among the models it may use (DRA
  consumable capacity, beta and on by default in 1.36) and marks every device
  ``allowMultipleAllocations`` (NVIDIA's slices do not); both kube-scheduler and gpuaware then allocate
  memory shares (``shareID`` + ``consumedCapacity``). No openb model has MIG partitions.

Modes, each on the same pods (names differ per mode), one after the other on one cluster:

- ``kube_scheduler_dra``: the real kube-scheduler, whose DynamicResources plugin allocates claims;
- ``gpuaware_dra``: gpuaware's live scheduler (``schedulerName: gpuaware``, ``dra: true``) allocates
  and binds;
- ``ceiling_dra`` (opt-in: ``--modes``): no scheduler, ``gpuaware.bench.kube_ceiling.DraCeilingBinder``, which picks
  the next free devices by count and makes the same writes per pod (the claim's finalizer, its status, the
  Binding): the most claim pods/s this control plane takes on this machine at that moment.

Per mode, as in ``gpuaware.bench.kube_bench`` (setup, driver and timing figures: ``gpuaware.bench.kube_harness``): a
backlog of ``burst`` pods created before the scheduler starts (``pods_per_s``: from the scheduler's
start to the last binding), then ``rate`` pods/s for ``seconds`` (``p99_create_to_bind_s``, with the
``driver_pods_per_s`` reached), then ``pending``; ``unallocated_gpu_pct``, ``stranded_gpu_pct`` (GPUs
holding memory shares with memory left over, which no whole-GPU claim can have), ``devices_allocated_twice``
and ``bound_pods_without_allocation`` come from the apiserver's account: the claims'
``status.allocation`` (a result with ``consumedCapacity`` below the device's memory takes that share of
it, any other the whole device). Between modes the pods are deleted and the claims released (their
finalizer removed, then deleted: no controller-manager deallocates them here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from gpuaware.bench.kube_bench import _api, _scheduler, kwok_nodes, running
from gpuaware.bench.kube_ceiling import SCHEDULER_NAME as CEILING_SCHEDULER
from gpuaware.bench.kube_ceiling import DraCeilingBinder
from gpuaware.bench.kube_harness import (
    NAMESPACE,
    REPO,
    Driver,
    api_budget,
    backlog_then_steady,
    bench_control_plane,
    driver_process,
    raised_qps,
)
from gpuaware.bench.scheduler_bench import trace_sample
from gpuaware.contract import dra
from gpuaware.local.kube_control_plane import KubeControlPlane
from gpuaware.plumbing.gc_policy import fresh_process_gc
from gpuaware.plumbing.kube.resource_slices import NodeGpu, node_slices
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.sim.openb import GPU_MEMORY_MIB, load_nodes
from gpuaware.scheduler.wiring import api_pool_size

DRA_MODES = ("kube_scheduler_dra", "gpuaware_dra")
DRA_OPT_IN_MODES = ("ceiling_dra",)  # run only when named: a reference, not a scheduler
SCHEDULER_NAMES = {"gpuaware_dra": "gpuaware", "ceiling_dra": CEILING_SCHEDULER}
DRIVER = dra.DRIVER
DEVICE_CLASS = dra.DEVICE_CLASS_GPU
REQUEST = "gpu"
MIB = 1024 * 1024
UNKNOWN_MODEL_MEMORY_MIB = 16384
FRACTIONS = ("whole", "memory")
DEVICE_CLASSES = REPO / "deploy" / "components" / "dra-deviceclasses" / "deviceclasses.yaml"
CLAIMS_PATH = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


# -- the cluster's devices --------------------------------------------------------------------------

def _memory_mib(model: str) -> int:
    # openb publishes no memory for G2/G3: their slices say 16 GiB (it only matters with --dra-fraction memory).
    return GPU_MEMORY_MIB.get(model) or UNKNOWN_MODEL_MEMORY_MIB


def dra_cluster(node_csv: str | Path, node_count: int | None = None,
                fraction: str = "whole") -> tuple[list[dict], list[dict]]:
    """(kwok Nodes, their ResourceSlices as gpuaware's publisher writes them) of the first ``node_count``
    GPU nodes; with ``fraction`` ``memory`` every GPU is shareable (``allowMultipleAllocations``)."""
    specs = load_nodes(node_csv)[:node_count]
    names = {s.name for s in specs}
    nodes = [n for n in kwok_nodes(node_csv) if n["metadata"]["name"] in names]
    for n in nodes:  # the GPUs are devices now, not an extended resource
        for key in ("capacity", "allocatable"):
            n["status"][key].pop("nvidia.com/gpu", None)
    slices = []
    for s in specs:
        gpus = [NodeGpu(index=i, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{s.name}/{i}')}", model=s.model,
                        memory_bytes=_memory_mib(s.model) * MIB) for i in range(s.gpus)]
        for sl in node_slices(s.name, gpus, generation=1):
            if fraction == "memory":
                for d in sl["spec"]["devices"]:
                    d["allowMultipleAllocations"] = True
            slices.append(sl)
    return nodes, slices


# -- the pods and their claims ----------------------------------------------------------------------

def _model_selector(models: list[str]) -> str:
    return " || ".join(f'device.attributes["{DRIVER}"].productName == "{m}"' for m in models)


def dra_pods(pod_csv: str | Path, count: int, seed: int, prefix: str, mode: str, cluster_models: list[str],
             fraction: str = "whole") -> tuple[list[tuple[str, int, bytes]], list[bytes]]:
    """(pods as (name, GPU milli, JSON body), their ResourceClaims' JSON bodies) of ``count`` trace pods;
    a fractional pod asks for a whole GPU, or with ``fraction`` ``memory`` for its share of the memory."""
    pods, claims = [], []
    for i, w in enumerate(trace_sample(pod_csv, count, seed)):
        name = f"{prefix}-{i:05d}"
        container: dict[str, Any] = {"name": "main", "image": "registry.invalid/job:1",
                                     "resources": {"requests": {"cpu": f"{w.cpu_milli}m",
                                                                "memory": f"{w.memory_mib}Mi"}}}
        spec: dict[str, Any] = {"schedulerName": SCHEDULER_NAMES.get(mode, "default-scheduler"),
                                "containers": [container]}
        if w.num_gpu:
            exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount",
                                       "count": w.num_gpu}
            models = [m for m in w.models if m in cluster_models] or cluster_models
            if w.models:
                exactly["selectors"] = [{"cel": {"expression": _model_selector(models)}}]
            if fraction == "memory" and w.num_gpu == 1 and w.gpu_milli < 1000:
                smallest = min(_memory_mib(m) for m in models)
                exactly["capacity"] = {"requests": {"memory": f"{math.ceil(smallest * w.gpu_milli / 1000)}Mi"}}
            claims.append(json.dumps({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}}}).encode())
            spec["resourceClaims"] = [{"name": REQUEST, "resourceClaimName": name}]
            container["resources"]["claims"] = [{"name": REQUEST}]
        pods.append((name, w.num_gpu * w.gpu_milli,
                     json.dumps({"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}).encode()))
    return pods, claims


# -- the apiserver's account ------------------------------------------------------------------------

def _quantity_bytes(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def allocation_account(claims: list[dict], slices: list[dict], bound: set[str]) -> dict[str, Any]:
    """What the claims' ``status.allocation`` hand out: ``allocated_gpus`` (a shared result counts its
    share of the device's memory), ``stranded_gpus`` (devices with shares on them and memory left over:
    no whole-GPU claim can have them), ``devices_allocated_twice`` (a device given whole twice, or whole
    and shared, or shared beyond its memory) and ``bound_pods_unallocated`` (bound pods whose claim
    has no allocation reserved for them)."""
    memory = {(s["spec"]["pool"]["name"], d["name"]): _quantity_bytes(d["capacity"]["memory"]["value"])
              for s in slices for d in s["spec"]["devices"]}
    whole: dict[tuple[str, str], int] = defaultdict(int)
    shared: dict[tuple[str, str], int] = defaultdict(int)
    unallocated = []
    for c in claims:
        name = c["metadata"]["name"]
        status = c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        reserved = {r.get("name") for r in status.get("reservedFor") or []}
        if name in bound and (not results or name not in reserved):
            unallocated.append(name)
        for r in results:
            key = (r["pool"], r["device"])
            used = (r.get("consumedCapacity") or {}).get("memory")
            # A whole-device claim on a shareable device consumes all its memory: count it whole.
            if used is None or _quantity_bytes(used) >= memory.get(key, 0):
                whole[key] += 1
            else:
                shared[key] += _quantity_bytes(used)
    twice = sum(1 for k, n in whole.items() if n > 1 or (n and shared.get(k)))
    twice += sum(1 for k, b in shared.items() if b > memory.get(k, 0))
    allocated = len(whole) + sum(min(1.0, b / memory[k]) for k, b in shared.items() if k in memory and k not in whole)
    stranded = sum(1 for k, b in shared.items() if k not in whole and b < memory.get(k, 0))
    return {"allocated_gpus": allocated, "stranded_gpus": stranded, "devices_allocated_twice": twice,
            "bound_pods_unallocated": sorted(unallocated)}


# -- the driver: kube_bench's, plus claims ----------------------------------------------------------

class _DraDriver(Driver):
    def create_claims(self, bodies: list[bytes]) -> list[str]:
        url = self.server + CLAIMS_PATH

        def post(body: bytes) -> str | None:
            resp = self.http.request("POST", url, body=body, headers={"Content-Type": "application/json"})
            return None if resp.status == 201 else f"{resp.status} {resp.data[:200]!r}"

        return [e for e in self.pool.map(post, bodies) if e]

    def list_claims(self) -> list[dict]:
        return json.loads(self.http.request("GET", self.server + CLAIMS_PATH).data)["items"]

    def release_claims(self, timeout_s: float = 600.0) -> None:
        """Delete every claim: no controller-manager deallocates them, so their delete-protection
        finalizer (set by whoever allocated) is removed here, as the resourceclaim controller would."""
        url = self.server + CLAIMS_PATH
        self.http.request("DELETE", url + "?gracePeriodSeconds=0", timeout=timeout_s)

        def unfinalize(name: str) -> None:
            self.http.request("PATCH", f"{url}/{name}", body=b'{"metadata":{"finalizers":null}}',
                              headers={"Content-Type": "application/merge-patch+json"})

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = [c["metadata"]["name"] for c in self.list_claims()]
            if not left:
                return
            list(self.pool.map(unfinalize, left))
            time.sleep(0.2)
        raise RuntimeError(f"resourceclaims of namespace {NAMESPACE} not deleted after {timeout_s:.0f}s")


# -- the run ----------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _dra_scheduler(mode: str, cp: KubeControlPlane, qps: tuple[float, int] | None,
                         slices: list[dict]) -> AsyncIterator[None]:
    if mode == "ceiling_dra":
        settings = SchedulerSettings(extender_port=0, dra=True)
        async with running(DraCeilingBinder(_api(cp.kubeconfig, qps, api_pool_size(settings)), slices,
                                            settings.bind_workers)):
            yield
        return
    async with _scheduler("kube_scheduler" if mode == "kube_scheduler_dra" else "gpuaware", cp, qps, dra=True):
        yield


async def _measure_mode(mode: str, cp: KubeControlPlane, conn, qps: tuple[float, int] | None, pod_csv: str,
                        burst: int, rate: float, seconds: float, seed: int, slices: list[dict],
                        models: list[str], fraction: str, tag: str,
                        progress: Callable[[str], None]) -> dict[str, Any]:
    async def ask(cmd: tuple) -> Any:
        await asyncio.to_thread(conn.send, cmd)
        return await asyncio.to_thread(conn.recv)

    burst_pods, burst_claims = dra_pods(pod_csv, burst, seed, f"{tag}-burst", mode, models, fraction)
    n_steady = int(rate * seconds)
    steady_pods, steady_claims = dra_pods(pod_csv, n_steady, seed + 1, f"{tag}-steady", mode, models,
                                            fraction)
    try:
        progress(f"{mode}: {len(burst_claims) + len(steady_claims)} claims")
        claim_errors = await ask(("call", "create_claims", burst_claims + steady_claims))
        fresh_process_gc()  # as gpuaware.bench.kube_bench does for each mode
        figures = await backlog_then_steady(ask, _dra_scheduler(mode, cp, qps, slices), burst_pods, steady_pods, rate,
                                            seconds, 180.0, progress, mode)
        claims = await ask(("call", "list_claims"))
        done, errors = figures.pop("done"), figures.pop("create_errors")
        account = allocation_account(claims, slices, set(done))
        gpus = sum(len(sl["spec"]["devices"]) for sl in slices)
        return {
            **figures,
            "unallocated_gpu_pct": round(100.0 * (1 - account["allocated_gpus"] / gpus), 2),
            "stranded_gpu_pct": round(100.0 * account["stranded_gpus"] / gpus, 2),
            "pending": len(burst_pods) + len(steady_pods) - len(done),
            "claims": len(burst_claims) + len(steady_claims),
            "devices_allocated_twice": account["devices_allocated_twice"],
            "bound_pods_without_allocation": len(account["bound_pods_unallocated"]),
            "create_errors": claim_errors[:5] + errors,
        }
    finally:
        await ask(("delete",))
        await ask(("call", "release_claims"))


def run_dra_bench(node_csv: str, pod_csv: str, burst: int = 1000, rate: float = 200.0, seconds: float = 5.0,
                  seed: int = 0, modes: tuple[str, ...] = DRA_MODES, budgets: tuple[str, ...] = ("raised",),
                  qps: float = 500.0, node_count: int | None = None, fraction: str = "whole",
                  progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    if fraction not in FRACTIONS:
        raise ValueError(f"fraction: {fraction!r} is not one of {', '.join(FRACTIONS)}")
    if fraction == "memory" and "ceiling_dra" in modes:
        raise ValueError("ceiling_dra hands out whole devices: not with fraction memory")
    nodes, slices = dra_cluster(node_csv, node_count, fraction)
    models = sorted({d["attributes"]["productName"]["string"] for s in slices for d in s["spec"]["devices"]})
    budget_table = api_budget(qps)
    t0 = time.monotonic()
    with (bench_control_plane([*nodes, *slices], [DEVICE_CLASSES]) as cp,
          driver_process(cp, _DraDriver) as conn):
        progress(f"control plane with {len(nodes)} kwok nodes and their ResourceSlices in "
                 f"{time.monotonic() - t0:.0f}s; versions {cp.versions()}")
        runs: dict[str, Any] = {}
        for budget in budgets:
            q = raised_qps(qps) if budget == "raised" else None
            runs[budget] = {"api_budget": budget_table[budget], "modes": {
                mode: asyncio.run(_measure_mode(mode, cp, conn, q, pod_csv, burst, rate, seconds, seed,
                                                slices, models, fraction, f"{budget[0]}{mode[0]}", progress))
                for mode in modes}}
        return {"nodes": len(nodes), "gpus": sum(len(s["spec"]["devices"]) for s in slices), "fraction": fraction,
                "burst_pods": burst,
                "rate_pods_per_s": rate, "rate_pods": int(rate * seconds), "versions": cp.versions(),
                "api_budget": budget_table, "runs": runs}
