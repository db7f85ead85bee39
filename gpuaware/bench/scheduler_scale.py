"""``gpuaware bench scheduler-scale``: the scheduler alone with a whole fleet's live state, per fleet size.

``bench pipeline`` measures the scheduler behind the load generator and the stream workers, all on
one machine, so what it reports for the scheduler at 50,000 GPUs is mostly the CPU the others took.
Here nothing stands between the fleet and the scheduler:
- a **feed process** (its own, so encoding is not the scheduler's cost) publishes what the stream
  would: first one ``node.state.v1`` per node and one ``gpu.state.v1`` per GPU (the compacted
  topics the scheduler catches up on), then ``states_per_gpu_s`` GPU states per GPU per second
  (default 0.12: the stream publishes a state per new sample, and the agents' default sampling
  policy gives ~0.12 samples per GPU per second under the GenTD26 replay, ``bench pipeline``'s
  published samples/s over its GPUs), in 100 ms batches through a pipe: each a GPU's newest
  encoded state, re-encoded with fresh stamps and values as fast as half of each tick allows, so
  the rate holds on a loaded machine;
- the scheduler reads them through its own feed path (``gpuaware.scheduler.feed.StateFeed`` with a consumer
  over that pipe: decode, ``StateView.learn``), into ``LiveScheduler`` wired as in production;
- a **fake API server process** holds the fleet's nodes (8 GPUs each, models mixed as in ``gpuaware
  up``) and creates openb pods at ``pod_rate`` per second for the scheduler to place.

Per size: ``cycle_p50_ms``/``cycle_p99_ms`` one pod's scheduling decision (wall), ``cycle_cpu_p50_ms``/
``cycle_cpu_p99_ms`` the CPU time of the scheduler's thread in it; ``pass_p99_ms``/``pass_cpu_p99_ms``
a whole pass (live state applied, every pending pod tried); ``state_apply_p99_ms``/
``state_apply_cpu_p99_ms`` the live state's application alone; ``feed_lag_p50_s``/``feed_lag_p99_s``
from a batch's send to the scheduler reading it, per batch, and ``feed_lag_growing`` whether the last
third's mean is well above the first's; ``states_sent``/``states_read``; ``cpu_percent`` of the
scheduler process over the measured window and ``cpu_s_per_pod`` its CPU per pod placed;
``rss_mib`` its resident memory at the end (the API server and the feed run elsewhere).
CPU time is the figure to compare on a shared machine: wall time there is mostly waiting for a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from aiokafka.structs import TopicPartition

from gpuaware.agent.collectors.sim import Scenario
from gpuaware.bench.fleet_load import GPUS_PER_NODE, MODELS
from gpuaware.bench.scheduler_bench import trace_sample
from gpuaware.contract import topics
from gpuaware.contract.events import Forecast, GpuState, HealthBand, NodeGpu, NodeState, encode
from gpuaware.local.fake_apiserver import FakeApiServer, make_pod
from gpuaware.local.processes import cpu_seconds, rss_mib
from gpuaware.local.stack_scheduler import cluster_objects
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.plumbing.kube.api import KubeApi, connect
from gpuaware.scheduler.core.framework import Scheduler
from gpuaware.scheduler.feed import StateFeed, StateView
from gpuaware.scheduler.kube.live import LiveScheduler
from gpuaware.scheduler.settings import SchedulerSettings

STATES_PER_GPU_S = 0.12
POD_RATE = 20.0
BATCH_S = 0.1
REFRESH_S = 0.05  # of each BATCH_S tick, encoding fresh states
GPU_TP = TopicPartition(topics.GPU_STATE, 0)
NODE_TP = TopicPartition(topics.NODE_STATE, 0)
FORECAST_METRICS = ("util_gpu", "fb_used_mib")


def fleet(gpus: int, prefix: str) -> Scenario:
    return Scenario.model_construct(name=prefix, nodes=max(1, gpus // GPUS_PER_NODE), gpus_per_node=GPUS_PER_NODE,
                                    models=MODELS, node_prefix=prefix, duration_s=86400, library=False)


def gpu_state(node: str, g: int, model: str, now_ms: int, rng: random.Random) -> GpuState:
    """A state as the stream publishes it: six forecasts, four health components, a workload class."""
    util = rng.uniform(0, 100)
    forecasts = [Forecast(m, h * 60, util if m == "util_gpu" else 30_000.0, util * 0.8, min(100.0, util * 1.2))
                 for m in FORECAST_METRICS for h in (1, 5, 15)]
    band = HealthBand.DEGRADED if rng.random() < 0.01 else HealthBand.HEALTHY
    return GpuState(f"GPU-{node}-{g}", node, model, now_ms - 3000, now_ms, util, 12.5, 40_000.0, 81_559,
                    rng.uniform(100, 600), rng.uniform(35, 80), 98.5, band,
                    {"thermal": 100.0, "ecc": 100.0, "xid": 100.0, "throttle": 95.0}, forecasts,
                    "training-compute-bound", 0.82, 5000)


def _feed_process(conn, gpus: int, prefix: str, states_per_gpu_s: float, seed: int) -> None:
    """Child: the fleet's state once (the compacted topics), then GPU states at the fleet's rate.

    What is sent is each GPU's newest encoded state, picked at random (so the rate holds whatever this process
    gets of a CPU); as much of the fleet as ``REFRESH_S`` of a tick allows is encoded afresh, stamped now, in the
    meantime, so the states keep moving and stay fresh (records are accepted by publish time, and samples stay
    fresh for 90 s)."""
    scenario = fleet(gpus, prefix)
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    nodes = [(scenario.node_name(n), MODELS[(n * GPUS_PER_NODE) % len(MODELS)]) for n in range(scenario.nodes)]
    conn.send(("nodes", [encode(NodeState(name, now, 128_000, 786_432,
                                          [NodeGpu(f"GPU-{name}-{g}", g, model, 81_559, 0, HealthBand.HEALTHY)
                                           for g in range(GPUS_PER_NODE)], 8000, 8 * 81_559))
                         for name, model in nodes]))
    newest = [encode(gpu_state(name, g, model, now, rng)) for name, model in nodes for g in range(GPUS_PER_NODE)]
    conn.send(("gpus", newest))
    rate = states_per_gpu_s * len(newest)
    started, sent = time.monotonic(), 0
    while not conn.poll():  # the parent's "stop"
        tick = time.monotonic()
        due = int((tick - started) * rate) - sent
        if due > 0:
            conn.send(("live", time.time(), [newest[rng.randrange(len(newest))] for _ in range(due)]))
            sent += due
        now = int(time.time() * 1000)
        while time.monotonic() - tick < REFRESH_S:
            i = rng.randrange(len(newest))
            name, model = nodes[i // GPUS_PER_NODE]
            newest[i] = encode(gpu_state(name, i % GPUS_PER_NODE, model, now, rng))
        time.sleep(max(0.0, BATCH_S - (time.monotonic() - tick)))


class PipeConsumer:
    """What ``StateFeed`` reads, over the feed process's pipe: the startup records (catch-up), then the
    live batches, each noted with its delay since it was sent (``lags``)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.backlog: list[tuple[TopicPartition, bytes]] = []
        self.pos = {GPU_TP: 0, NODE_TP: 0}
        self.lags: list[tuple[float, float]] = []  # (read at, seconds since sent)
        self.sent = self.read = 0

    def startup(self) -> dict[TopicPartition, int]:
        """Takes the fleet's state from the pipe; returns the catch-up targets."""
        for _ in range(2):
            kind, records = self.conn.recv()
            tp = NODE_TP if kind == "nodes" else GPU_TP
            self.backlog += [(tp, r) for r in records]
        return {GPU_TP: sum(tp == GPU_TP for tp, _ in self.backlog), NODE_TP: sum(tp == NODE_TP for tp, _ in
                                                                                  self.backlog)}

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if not self.backlog:
            deadline = time.monotonic() + timeout_ms / 1000
            while not self.conn.poll() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            while self.conn.poll():
                _, sent_at, records = self.conn.recv()
                self.lags.append((time.time(), time.time() - sent_at))
                self.sent += len(records)
                self.backlog += [(GPU_TP, r) for r in records]
        take, self.backlog = self.backlog[:max_records or 2000], self.backlog[max_records or 2000:]
        out: dict[TopicPartition, list] = {}
        for tp, value in take:
            out.setdefault(tp, []).append(SimpleNamespace(topic=tp.topic, partition=0, offset=self.pos[tp], key=None,
                                                          value=value, headers=[]))
            self.pos[tp] += 1
        self.read += len(take)
        await asyncio.sleep(0)
        return out

    async def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    async def stop(self) -> None:
        pass


def _api_process(conn, gpus: int, prefix: str, pod_csv: str, rate: float, seconds: float, seed: int) -> None:
    """Child: the fake API server with the fleet's nodes; on "go", creates openb pods at ``rate``."""
    nodes, _ = cluster_objects(fleet(gpus, prefix))
    pods = []
    for i, w in enumerate(trace_sample(pod_csv, int(rate * seconds) + 1, seed)):
        frac = w.num_gpu == 1 and w.gpu_milli < 1000
        pods.append(make_pod(f"{prefix}-{i:05d}", namespace="bench", gpus=0 if frac else w.num_gpu,
                             cpu=f"{min(w.cpu_milli, 16000)}m", memory=f"{min(w.memory_mib, 65536)}Mi",
                             annotations={"gpuaware.io/gpu-milli": str(w.gpu_milli)} if frac else {}))
    with FakeApiServer(window=200_000) as fake:
        for n in nodes:
            fake.create("nodes", n)
        conn.send(fake.url)
        conn.recv()  # "go"
        start = time.monotonic()
        for i, pod in enumerate(pods):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            fake.create("pods", pod)
        conn.recv()  # "stop"


class Timings:
    """Wall and thread-CPU seconds of each call of ``owner.method`` (patched on the instance or class)."""

    def __init__(self, owner: Any, method: str):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.owner, self.method, self.inner = owner, method, getattr(owner, method)
        wall, cpu, inner = self.wall, self.cpu, self.inner

        def timed(*args: Any, **kwargs: Any) -> Any:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - w0)

        setattr(owner, method, timed)

    def restore(self) -> None:
        setattr(self.owner, self.method, self.inner)

    def mark(self) -> int:
        return len(self.wall)


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


async def _measure(api_url: str, api_conn, feed_conn, gpus: int, seconds: float, warmup_s: float,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    settings = SchedulerSettings(api_server=api_url, extender_port=0, leader_elect=False)
    view = StateView(stale_after_ms=int(settings.stale_after_s * 1000))
    live = LiveScheduler(KubeApi(connect(api_url, pool_size=32)), settings, view)
    consumer = PipeConsumer(feed_conn)
    targets = await asyncio.to_thread(consumer.startup)
    feed = StateFeed(KafkaSettings(bootstrap_servers="unused:9092"), view)
    rss0 = rss_mib(os.getpid())
    t0 = time.monotonic()
    feed.follow(consumer, targets)
    await feed.catch_up()
    progress(f"{gpus} GPUs: caught up on {len(view.gpus)} GPU states in {time.monotonic() - t0:.1f}s")
    cycles = Timings(Scheduler, "schedule")
    passes = Timings(live, "schedule_once")
    stop = asyncio.Event()
    try:
        await live.start(sync_timeout_s=180)
        assert live.gpu_state is not None
        applies = Timings(live.gpu_state, "apply")
        live.leading.set()
        task = asyncio.create_task(live.run(stop))
        await asyncio.to_thread(api_conn.send, "go")
        await asyncio.sleep(warmup_s)
        marks = (cycles.mark(), passes.mark(), applies.mark(), len(consumer.lags))
        placed0, cpu0, read0, w0 = live.stats.by_action()["PLACE"], cpu_seconds(os.getpid()), consumer.read, \
            time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - w0
        cpu = cpu_seconds(os.getpid()) - cpu0
        placed = live.stats.by_action()["PLACE"] - placed0
        stop.set()
        await task
    finally:
        cycles.restore()
        stop.set()
        await feed.stop()
        await live.stop()
    lags = [lag for _, lag in consumer.lags[marks[3]:]]
    third = max(1, len(lags) // 3)
    cyc_w, cyc_c = cycles.wall[marks[0]:], cycles.cpu[marks[0]:]
    pass_w, pass_c = passes.wall[marks[1]:], passes.cpu[marks[1]:]
    app_w, app_c = applies.wall[marks[2]:], applies.cpu[marks[2]:]
    return {
        "gpus": gpus, "nodes": len(live.cache.cluster), "gpus_in_view": len(view.gpus), "seconds": round(elapsed, 1),
        "cycles": len(cyc_w), "cycle_p50_ms": _ms(cyc_w, 50), "cycle_p99_ms": _ms(cyc_w, 99),
        "cycle_cpu_p50_ms": _ms(cyc_c, 50), "cycle_cpu_p99_ms": _ms(cyc_c, 99),
        "passes": len(pass_w), "pass_p99_ms": _ms(pass_w, 99), "pass_cpu_p99_ms": _ms(pass_c, 99),
        "state_applies": len(app_w), "state_apply_p99_ms": _ms(app_w, 99), "state_apply_cpu_p99_ms": _ms(app_c, 99),
        "states_per_s_read": round((consumer.read - read0) / elapsed, 1),
        "feed_lag_p50_s": round(float(np.percentile(lags, 50)), 3) if lags else None,
        "feed_lag_p99_s": round(float(np.percentile(lags, 99)), 3) if lags else None,
        "feed_lag_growing": bool(lags) and bool(np.mean(lags[-third:]) > 2 * np.mean(lags[:third]) + 0.5),
        "placed": placed, "cpu_percent": round(100 * cpu / elapsed, 1),
        "cpu_s_per_pod": round(cpu / placed, 4) if placed else None,
        "rss_mib": round(rss_mib(os.getpid()), 1), "rss_growth_mib": round(rss_mib(os.getpid()) - rss0, 1),
    }


def run_size(gpus: int, seconds: float, pod_csv: str | Path, states_per_gpu_s: float = STATES_PER_GPU_S,
             pod_rate: float = POD_RATE, warmup_s: float = 5.0, seed: int = 0,
             progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    prefix = f"s{random.Random(seed + gpus).randrange(16 ** 4):04x}"
    api_parent, api_child = ctx.Pipe()
    feed_parent, feed_child = ctx.Pipe()
    api = ctx.Process(target=_api_process, args=(api_child, gpus, prefix, str(pod_csv), pod_rate,
                                                 seconds + warmup_s + 30, seed), name="fake-apiserver", daemon=True)
    gen = ctx.Process(target=_feed_process, args=(feed_child, gpus, prefix, states_per_gpu_s, seed), name="feed",
                      daemon=True)
    api.start()
    gen.start()
    try:
        url = api_parent.recv()
        result = asyncio.run(_measure(url, api_parent, feed_parent, gpus, seconds, warmup_s, progress))
        result["states_per_gpu_s"] = states_per_gpu_s
        result["pod_rate"] = pod_rate
        return result
    finally:
        for conn in (api_parent, feed_parent):
            with contextlib.suppress(OSError):
                conn.send("stop")
        for p in (api, gen):
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def run_scale_bench(sizes: list[int], seconds: float, pod_csv: str | Path, states_per_gpu_s: float = STATES_PER_GPU_S,
                    pod_rate: float = POD_RATE, seed: int = 0,
                    progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    results = []
    for gpus in sizes:
        progress(f"{gpus} GPUs for {seconds:.0f}s")
        results.append(run_size(gpus, seconds, pod_csv, states_per_gpu_s, pod_rate, seed=seed, progress=progress))
        progress(str(results[-1]))
    return {"results": results}
