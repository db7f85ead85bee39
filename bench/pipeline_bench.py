"""``gpuaware bench pipeline``: the whole pipeline on one machine at rising fleet sizes.

Per size (``gpus`` simulated GPUs, 8 per node, replaying GenTD26 with adaptive sampling), for
``seconds`` after a warm-up, on the broker named or a fresh embedded one:
- the agents (this process) publish telemetry; ``samples_per_s`` is what they published;
- one stream worker (its own process) turns it into ``gpu.state.v1``; ``p99_sample_to_state_s`` is
  from a sample's timestamp to the arrival of the first state carrying it (so it includes the
  agents' 5 s telemetry batching window and the stream's 1 s minimum publish interval; a sample
  that changes nothing is published only with the 30 s heartbeat, with a newer sample, and is not
  counted); ``stream_p99_sample_to_state_s`` is the worker's own figure for states published as
  samples arrive (its /metrics histogram); ``max_lag`` the worker's highest consumer lag seen, and
  ``lag_growing`` whether the lag at the end is well above the lag at the start;
- the scheduler (this process, as in ``gpuaware up``) places openb pods on the fleet from that
  state; ``scheduler_p99_ms`` is one scheduling cycle's p99;
- ``cpu_percent`` and ``rss_mib`` per process: this one (agents + scheduler), the stream worker,
  the broker.
The largest size with ``lag_growing`` false and every component keeping up is what one machine
sustains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer

from agent.collectors.sim import Scenario, SimCluster
from agent.runtime import AgentRuntime
from agent.sampling import SamplingPolicy
from contract import topics
from contract.events import DecodeError, GpuState, decode
from gpuaware.local.processes import cpu_seconds, peak_rss_mib
from gpuaware.local.stack_scheduler import StackScheduler
from gpuaware.local.stream_workers import StreamWorkerProcess
from plumbing.kafka_settings import KafkaSettings

WARMUP_S = 10.0


def _buckets(worker: StreamWorkerProcess) -> dict[float, float]:
    """The worker's sample-to-state histogram (cumulative counts by upper bound)."""
    try:
        text = worker.metrics()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("gpuaware_stream_sample_to_state_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-1])
    return out


def _quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """histogram_quantile over the increase between two scrapes (linear within a bucket, as Prometheus does)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank, lower, prev = q * counts[-1], 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - prev) / max(count - prev, 1e-12)
        lower, prev = bound, count
    return None


def _lag(worker: StreamWorkerProcess) -> float | None:
    try:
        text = worker.metrics()
    except OSError:
        return None
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("gpuaware_stream_consumer_lag{"))


async def _watch_states(kafka: KafkaSettings, prefix: str, latencies: list[float], stop: asyncio.Event) -> None:
    """Sample-to-state latency of every state that carries a new sample (heartbeat republishes of an
    unchanged GPU repeat their sample's time and are not counted)."""
    consumer = AIOKafkaConsumer(topics.GPU_STATE, **kafka.consumer_kwargs(None, from_beginning=False))
    await consumer.start()
    newest: dict[str, int] = {}
    try:
        while not stop.is_set():
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                now = time.time()
                for m in msgs:
                    try:
                        s = decode(m.value)
                    except DecodeError:
                        continue
                    if isinstance(s, GpuState) and s.node.startswith(prefix) and \
                            s.sample_ts_ms > newest.get(s.gpu_uuid, 0):
                        if s.gpu_uuid in newest:  # the first state seen may be an old one
                            latencies.append(now - s.sample_ts_ms / 1000)
                        newest[s.gpu_uuid] = s.sample_ts_ms
    finally:
        await consumer.stop()


async def run_size(kafka: KafkaSettings, gpus: int, seconds: float, broker_pid: int | None, workdir: Path) -> dict:
    prefix = f"pb{gpus}-{uuid.uuid4().hex[:4]}"
    scenario = Scenario(name=prefix, nodes=max(1, gpus // 8), gpus_per_node=8, models=["H100", "A100", "V100", "T4"],
                        node_prefix=prefix, duration_s=86400, library=False)
    worker = StreamWorkerProcess(kafka, f"bench-pipeline-{prefix}", workdir, f"stream-{prefix}")
    worker.start()
    sched = StackScheduler(kafka, scenario)
    await sched.start()
    stop = asyncio.Event()
    sched_task = asyncio.create_task(sched.run(stop))
    cluster = SimCluster(scenario)
    runtime = AgentRuntime(cluster.collectors(), kafka, SamplingPolicy(), str(workdir / f"spool-{prefix}"))
    agent_stop = asyncio.Event()
    agents = asyncio.create_task(runtime.run(agent_stop, None))
    latencies: list[float] = []
    watcher = asyncio.create_task(_watch_states(kafka, prefix, latencies, stop))
    lags: list[float] = []
    try:
        await asyncio.sleep(WARMUP_S)
        pids = {"agents_and_scheduler": os.getpid(), "stream_worker": worker.pid, "broker": broker_pid}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        samples0, t0, first = runtime.samples_published, time.monotonic(), len(latencies)
        decisions0 = len(sched.live.stats.decision_latencies)
        hist0 = await asyncio.to_thread(_buckets, worker)
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(2.0)
            lag = await asyncio.to_thread(_lag, worker)
            if lag is not None:
                lags.append(lag)
        elapsed = time.monotonic() - t0
        worker_p99 = _quantile(0.99, hist0, await asyncio.to_thread(_buckets, worker))
        samples = runtime.samples_published - samples0
        cpu = {k: round(100 * (cpu_seconds(p) - cpu0[k]) / elapsed, 1) for k, p in pids.items()}
        rss = {k: round(peak_rss_mib(p), 1) for k, p in pids.items()}
        measured = latencies[first:]
        decisions = np.asarray(list(sched.live.stats.decision_latencies)[decisions0:]) * 1000
        third = max(1, len(lags) // 3)
        growing = bool(lags) and bool(np.mean(lags[-third:]) > 2 * np.mean(lags[:third]) + 1000)
        return {
            "gpus": scenario.nodes * 8, "nodes": scenario.nodes, "seconds": round(elapsed, 1),
            "samples_per_s": round(samples / elapsed, 1),
            "states": len(measured),
            "p50_sample_to_state_s": round(float(np.percentile(measured, 50)), 2) if measured else None,
            "p99_sample_to_state_s": round(float(np.percentile(measured, 99)), 2) if measured else None,
            "stream_p99_sample_to_state_s": round(worker_p99, 2) if worker_p99 is not None else None,
            "max_lag": int(max(lags)) if lags else None, "lag_growing": growing,
            "scheduler_p99_ms": round(float(np.percentile(decisions, 99)), 2) if len(decisions) else None,
            "scheduler_placements": sched.live.stats.by_action()["PLACE"],
            "cpu_percent": cpu, "rss_mib": rss,
        }
    finally:
        agent_stop.set()
        stop.set()
        with contextlib.suppress(Exception):
            await agents
        await sched_task
        await watcher
        await sched.stop()
        worker.stop()


def run_pipeline_bench(kafka: KafkaSettings, sizes: list[int], seconds: float, broker_pid: int | None,
                       progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory(prefix="gpuaware-bench-pipeline-") as tmp:
        for gpus in sizes:
            progress(f"{gpus} GPUs: {WARMUP_S:.0f}s warm-up, {seconds:.0f}s measured")
            results.append(asyncio.run(run_size(kafka, gpus, seconds, broker_pid, Path(tmp))))
            progress(f"{gpus} GPUs: {results[-1]['samples_per_s']} samples/s, "
                     f"p99 sample-to-state {results[-1]['p99_sample_to_state_s']} s, max lag {results[-1]['max_lag']}")
    sustained = [r["gpus"] for r in results if not r["lag_growing"] and r["states"]]
    return {"results": results, "largest_sustained_gpus": max(sustained) if sustained else None,
            "cpus": os.cpu_count()}
