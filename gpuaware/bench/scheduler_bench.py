"""``gpuaware bench scheduler``: pods bound per second end to end, and p99 pod creation to binding.

Setup, as on a real cluster of the openb trace's size:
- a fake kube-apiserver in **its own process** (it plays the API server's part and should not share
  the scheduler's CPU or interpreter) holding the 1,213 GPU nodes of ``openb_node_list_gpu_node.csv``;
- every GPU's state (``gpu.state.v1``) and every node's (``node.state.v1``) published through the
  real broker; the scheduler reads them back (state feed) before it schedules;
- the scheduler wired as ``gpuaware scheduler`` wires it (``gpuaware.scheduler.wiring``: informers, passes, bind
  tasks), in this process, without publishing its decisions.

Then pods sampled from the openb pod trace (seeded; GPU, fractional and CPU-only as in the trace)
are created by the API-server process itself, which stamps each pod's creation and binding:
1. **throughput**: a burst of ``burst`` pods at once; ``pods_per_s`` = pods / (last binding - first creation);
2. **latency**: ``rate`` pods/s for ``seconds``; ``p99_create_to_bind_s`` over those pods.
Each binding is three API calls (annotate the GPUs, Binding, Event), as in production.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer

from gpuaware.contract import topics
from gpuaware.contract.events import GpuState, HealthBand, NodeGpu, NodeState, encode
from gpuaware.local.fake_apiserver import FakeApiServer, make_node, make_pod
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.settings import SchedulerSettings
from gpuaware.scheduler.sim.openb import load_nodes, load_pods
from gpuaware.scheduler.wiring import build_scheduler


def trace_sample(pod_csv: str | Path, count: int, seed: int) -> list:
    """``count`` workloads drawn from the pod trace with replacement, the same for the same seed."""
    trace = load_pods(pod_csv)
    rng = random.Random(seed)
    return [rng.choice(trace).workload for _ in range(count)]


def _pod_objects(pod_csv: Path, count: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    out = []
    for i, w in enumerate(trace_sample(pod_csv, count, seed)):
        frac = w.num_gpu == 1 and w.gpu_milli < 1000
        ann = {"gpuaware.io/gpu-milli": str(w.gpu_milli)} if frac else {}
        if w.models:
            ann["gpuaware.io/gpu-models"] = ",".join(w.models)
        out.append(make_pod(f"{prefix}-{i:05d}", namespace="bench", gpus=0 if frac else w.num_gpu,
                            cpu=f"{w.cpu_milli}m", memory=f"{w.memory_mib}Mi", annotations=ann))
    return out


def _api_server_process(conn, node_csv: str) -> None:
    """Child: the fake API server with the openb nodes; creates pods on command and reports timings."""
    nodes = load_nodes(node_csv)
    with FakeApiServer(window=200_000) as fake:
        for n in nodes:
            fake.create("nodes", make_node(n.name, gpus=n.gpus, product=n.model, cpu=f"{n.cpu_milli}m",
                                           memory=f"{n.memory_mib}Mi"))
        conn.send(fake.url)
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            _, pods, rate, timeout_s = cmd
            created: dict[str, float] = {}
            start = time.monotonic()
            for i, pod in enumerate(pods):
                if rate:
                    delay = start + i / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
                created[key] = time.monotonic()
                fake.create("pods", pod)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not all(k in fake.store.bound_at for k in created):
                time.sleep(0.05)
            cpu = os.times()
            conn.send({"created": created, "bound": {k: fake.store.bound_at.get(k) for k in created},
                       "cpu_s": cpu.user + cpu.system})


async def _publish_state(kafka: KafkaSettings, node_csv: str) -> int:
    nodes = load_nodes(node_csv)
    producer = AIOKafkaProducer(**kafka.producer_kwargs())
    await producer.start()
    now = int(time.time() * 1000)
    count = 0
    try:
        for n in nodes:
            gpus = [NodeGpu(f"GPU-{n.name}-{g}", g, n.model, n.gpu_memory_mib, 0, HealthBand.HEALTHY)
                    for g in range(n.gpus)]
            await producer.send(topics.NODE_STATE, encode(NodeState(n.name, now, n.cpu_milli, n.memory_mib, gpus,
                                                                    1000 * n.gpus, 0)), key=n.name.encode())
            for g in gpus:
                state = GpuState(g.uuid, n.name, n.model, now, now + 5, 20.0, 10.0, 1000.0, g.fb_total_mib, 150.0,
                                 50.0, 97.0, HealthBand.HEALTHY, {}, [], None, None, 1)
                await producer.send(topics.GPU_STATE, encode(state), key=g.uuid.encode())
                count += 1
        await producer.flush()
    finally:
        await producer.stop()
    return count


def _summary(result: dict[str, dict[str, float | None]]) -> tuple[float, list[float], int]:
    created, bound = result["created"], result["bound"]
    done = [k for k in created if bound.get(k) is not None]
    lat = [bound[k] - created[k] for k in done]
    span = (max(bound[k] for k in done) - min(created.values())) if done else float("nan")
    return span, lat, len(created) - len(done)


def run_bench(kafka: KafkaSettings, node_csv: str, pod_csv: str, burst: int = 2000, rate: float = 200.0,
              seconds: float = 20.0, seed: int = 0,
              progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_api_server_process, args=(child, node_csv), name="fake-apiserver", daemon=True)
    server.start()
    try:
        url = parent.recv()
        progress(f"fake API server with the openb nodes at {url}")
        gpus = asyncio.run(_publish_state(kafka, node_csv))
        progress(f"published the state of {gpus} GPUs")
        return asyncio.run(_measure(kafka, url, parent, pod_csv, burst, rate, seconds, seed, gpus, progress))
    finally:
        parent.send(("stop",))
        server.join(timeout=10)
        if server.is_alive():
            server.kill()


async def _measure(kafka: KafkaSettings, url: str, conn, pod_csv: str, burst: int, rate: float, seconds: float,
                   seed: int, gpus: int, progress: Callable[[str], None]) -> dict[str, Any]:
    # As ``gpuaware scheduler`` runs, but reading state only: the bench measures placement, not publishing.
    settings = SchedulerSettings(api_server=url, extender_port=0, leader_elect=False, stale_after_s=3600)
    runtime = build_scheduler(settings, kafka, publish=False, pool_size=64)
    live, view = runtime.live, runtime.view
    assert view is not None
    stop = asyncio.Event()
    try:
        t0 = time.monotonic()
        await runtime.start(sync_timeout_s=120)
        progress(f"scheduler ready in {time.monotonic() - t0:.1f}s with {len(view.gpus)} GPU states")
        task = asyncio.create_task(runtime.run(stop))

        async def phase(pods: list[dict[str, Any]], phase_rate: float, timeout_s: float) -> dict:
            await asyncio.to_thread(conn.send, ("create", pods, phase_rate, timeout_s))
            return await asyncio.to_thread(conn.recv)

        burst_pods = _pod_objects(Path(pod_csv), burst, seed, "burst")
        progress(f"burst of {burst} pods")
        cpu0, api0 = time.process_time(), (await phase([], 0.0, 0.0))["cpu_s"]
        burst_result = await phase(burst_pods, 0.0, 120.0)
        cpu1 = time.process_time()
        span, burst_lat, burst_missing = _summary(burst_result)
        n_steady = int(rate * seconds)
        progress(f"{rate:.0f} pods/s for {seconds:.0f}s")
        _, steady_lat, steady_missing = _summary(await phase(_pod_objects(Path(pod_csv), n_steady, seed + 1, "steady"),
                                                             rate, 60.0))
        decisions = np.asarray(live.stats.decision_latencies) * 1000
        stop.set()
        await task
        return {
            "nodes": len(live.cache.nodes), "gpus": gpus, "burst_pods": burst,
            "pods_per_s": round((burst - burst_missing) / span, 1) if span == span and span > 0 else None,
            "burst_p99_create_to_bind_s": round(float(np.percentile(burst_lat, 99)), 3) if burst_lat else None,
            "burst_unbound": burst_missing,
            "burst_scheduler_cpu_s": round(cpu1 - cpu0, 2),
            "burst_apiserver_cpu_s": round(burst_result["cpu_s"] - api0, 2),
            "rate_pods_per_s": rate, "rate_pods": n_steady,
            "p50_create_to_bind_s": round(float(np.percentile(steady_lat, 50)), 3) if steady_lat else None,
            "p99_create_to_bind_s": round(float(np.percentile(steady_lat, 99)), 3) if steady_lat else None,
            "rate_unbound": steady_missing,
            "p99_decision_ms": round(float(np.percentile(decisions, 99)), 3) if len(decisions) else None,
            "unschedulable_events": live.stats.by_action()["UNSCHEDULABLE"],
            "api_errors": {f"{v}:{c}": n for (v, c), n in live.stats.api_errors.items()},
        }
    finally:
        stop.set()
        await runtime.stop()
