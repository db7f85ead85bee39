"""``gpuaware bench stream``: GPU-samples/s through the Faust workers and sample-to-state latency.

On a fresh embedded broker (or the one named by ``--bootstrap-servers``) with a fleet of ``gpus``
synthetic GPUs (8 per node, batches of ``samples_per_batch`` samples per GPU, as an agent that
flushes every few seconds sends them):
1. **throughput**: a backlog of ``backlog`` samples is written first; then ``workers`` stream
   workers start, and the rate is the backlog divided by the time from the first applied sample
   to the last (read from the workers' /metrics); ``gpu_samples_per_worker_cpu_s`` divides the
   backlog by the CPU seconds the workers spent meanwhile (their efficiency, whatever else runs);
2. **latency**: telemetry is then produced live at ``rate`` samples/s, stamped at production,
   and a consumer of ``gpu.state.v1`` takes, for each state that carries a new sample, the time
   from that sample's stamp to the state's arrival: p50/p99 over ``latency_s`` seconds, after a
   5 s warm-up that drains what the backlog left in the worker's producer buffer. The load
   alternates between batches so that every batch is a change the worker publishes at once.
Everything runs on this machine, broker and load generator included: the figures are what one
machine sustains, not one worker alone.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.contract.events import GpuInfo, GpuSample, TelemetryBatch, decode, encode
from gpuaware.local.processes import cpu_seconds, peak_rss_mib
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing.kafka_settings import KafkaSettings

GPUS_PER_NODE = 8
LATENCY_WARMUP_S = 5.0


@dataclass
class Fleet:
    nodes: int
    samples_per_batch: int
    seq: int = 0
    prefix: str = "bench"  # of node names and GPU UUIDs: runs that share a broker keep their fleets apart

    def batches(self, ts_ms: int, step_ms: int) -> list[TelemetryBatch]:
        """One batch per node: ``samples_per_batch`` samples per GPU, ``step_ms`` apart, ending at ``ts_ms``."""
        out = []
        k = self.samples_per_batch
        base = ts_ms - (k - 1) * step_ms
        for n in range(self.nodes):
            node = f"{self.prefix}-node-{n:04d}"
            gpus = [GpuInfo(f"GPU-{self.prefix}-{n:04d}-{g}", g, "NVIDIA H100 80GB HBM3", 81559)
                    for g in range(GPUS_PER_NODE)]
            samples = []
            for j in range(k):
                seq = self.seq + j + 1
                # Load alternates between batches, so every batch changes each GPU's state and is
                # published on arrival (unchanged samples would wait for the 30 s heartbeat).
                level = 85 if (self.seq // k) % 2 else 15
                for g in range(GPUS_PER_NODE):
                    util = level + random.randint(-5, 5)
                    samples.append(GpuSample(g, seq, j * step_ms, max(0, min(100, util)), util // 2,
                                             30_000 + 10 * (seq % 500), 3000 + 30 * util, 55))
            out.append(TelemetryBatch(node, self.seq // k + 1, base, gpus, samples))
        self.seq += k
        return out


async def _produce(batches: list[TelemetryBatch], producer: AIOKafkaProducer) -> None:
    futures = [await producer.send(topics.TELEMETRY, encode(b), key=b.key()) for b in batches]
    await asyncio.gather(*futures)


async def _wait_applied(workers: list[StreamWorkerProcess], total: int,
                        timeout_s: float) -> tuple[float, float, float]:
    """(time the first sample was applied, time all ``total`` were, the workers' CPU seconds in between),
    polling the workers' counters."""
    first = None
    cpu_first = 0.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        applied = sum(w.counter("gpuaware_stream_samples_total") for w in workers)
        now = time.monotonic()
        if applied > 0 and first is None:
            first, cpu_first = now, sum(cpu_seconds(w.pid) for w in workers)
        if applied >= total:
            return first or now, now, sum(cpu_seconds(w.pid) for w in workers) - cpu_first
        for w in workers:
            if not w.running():
                raise RuntimeError(f"stream worker {w.name} exited:\n{w.log_tail()}")
        await asyncio.sleep(0.25)  # each scrape costs the worker a walk over its GPUs
    raise TimeoutError(f"workers applied {applied:.0f} of {total} samples within {timeout_s:.0f}s")


async def _latency(kafka: KafkaSettings, fleet: Fleet, rate: float, seconds: float,
                   producer: AIOKafkaProducer) -> list[float]:
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(None, from_beginning=False, fetch_max_wait_ms=20))
    await consumer.start()
    parts = [TopicPartition(topics.GPU_STATE, p) for p in range(topics.spec(topics.GPU_STATE).partitions)]
    consumer.assign(parts)
    await consumer.seek_to_end(*parts)
    latencies: list[float] = []
    seen: set[tuple[str, int]] = set()
    # The first seconds still drain what the backlog left in the worker's producer buffer.
    measure_from_ms = int((time.time() + LATENCY_WARMUP_S) * 1000)
    stop = asyncio.Event()

    async def consume() -> None:
        while not stop.is_set():
            for msgs in (await consumer.getmany(timeout_ms=100)).values():
                arrived = time.time() * 1000
                for m in msgs:
                    s = decode(m.value)
                    if (s.gpu_uuid, s.sample_ts_ms) not in seen and s.gpu_uuid.startswith("GPU-bench-") \
                            and s.sample_ts_ms >= measure_from_ms:
                        seen.add((s.gpu_uuid, s.sample_ts_ms))
                        latencies.append((arrived - s.sample_ts_ms) / 1000.0)

    reader = asyncio.create_task(consume())
    samples_per_round = fleet.nodes * GPUS_PER_NODE * fleet.samples_per_batch
    interval = samples_per_round / rate
    started = time.monotonic()
    next_round = started
    while time.monotonic() - started < seconds + LATENCY_WARMUP_S:
        await _produce(fleet.batches(int(time.time() * 1000), 1000), producer)
        next_round += interval
        await asyncio.sleep(max(0.0, next_round - time.monotonic()))
    await asyncio.sleep(3.0)  # let the last states arrive
    stop.set()
    await reader
    await consumer.stop()
    return latencies


async def run_phase(kafka: KafkaSettings, workdir: Path, workers: int, gpus: int, samples_per_batch: int,
                    backlog: int, rate: float, latency_s: float) -> dict:
    fleet = Fleet(max(1, gpus // GPUS_PER_NODE), samples_per_batch)
    app_id = f"bench-stream-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(**kafka.producer_kwargs())
    await producer.start()
    procs: list[StreamWorkerProcess] = []
    try:
        per_round = fleet.nodes * GPUS_PER_NODE * samples_per_batch
        rounds = max(1, backlog // per_round)
        now = int(time.time() * 1000)
        for r in range(rounds):
            await _produce(fleet.batches(now - (rounds - r) * samples_per_batch * 1000, 1000), producer)
        total = rounds * per_round
        procs = [StreamWorkerProcess(kafka, app_id, workdir, f"{app_id}-{i}", node_identity="off")
                 for i in range(workers)]
        for p in procs:
            p.start()
        first, last, drain_cpu_s = await _wait_applied(procs, total, timeout_s=600)
        rate_backlog = total / max(last - first, 1e-3)
        latencies = await _latency(kafka, fleet, rate, latency_s, producer)
        cpu = [cpu_seconds(p.pid) for p in procs]
        rss = [peak_rss_mib(p.pid) for p in procs]
        lat = np.array(latencies) if latencies else np.array([np.nan])
        return {
            "workers": workers,
            "gpus": fleet.nodes * GPUS_PER_NODE,
            "samples_per_batch_per_gpu": samples_per_batch,
            "backlog_samples": total,
            "gpu_samples_per_s": round(rate_backlog, 1),
            "gpu_samples_per_s_per_worker": round(rate_backlog / workers, 1),
            # Per CPU second the workers spent draining: what a shared, overloaded machine cannot skew.
            "gpu_samples_per_worker_cpu_s": round(total / max(drain_cpu_s, 1e-3), 1),
            "latency_rate_samples_per_s": rate,
            "latency_states": len(latencies),
            "p50_latency_s": round(float(np.nanpercentile(lat, 50)), 3),
            "p95_latency_s": round(float(np.nanpercentile(lat, 95)), 3),
            "p99_latency_s": round(float(np.nanpercentile(lat, 99)), 3),
            "max_latency_s": round(float(np.nanmax(lat)), 3),
            "worker_cpu_s": [round(c, 1) for c in cpu],
            "worker_rss_mib": [round(r, 1) for r in rss],
        }
    finally:
        await producer.stop()
        for p in procs:
            p.stop()


def run_bench(kafka: KafkaSettings, worker_counts: list[int], gpus: int, samples_per_batch: int, backlog: int,
              rate: float, latency_s: float, progress=None) -> dict:
    results = []
    with tempfile.TemporaryDirectory(prefix="gpuaware-bench-stream-") as tmp:
        for n in worker_counts:
            if progress:
                progress(f"{n} worker(s): {backlog} backlog samples, then {latency_s:.0f}s at {rate:.0f} samples/s")
            results.append(asyncio.run(run_phase(kafka, Path(tmp), n, gpus, samples_per_batch, backlog, rate,
                                                 latency_s)))
    one = results[0]["gpu_samples_per_s"]
    return {
        "results": results,
        "scaling": {str(r["workers"]): round(r["gpu_samples_per_s"] / one, 2) for r in results} if one else {},
        "cpus": os.cpu_count(),
        "targets": {"gpu_samples_per_s_per_worker": 30_000, "p99_latency_s": 1.0},
    }
