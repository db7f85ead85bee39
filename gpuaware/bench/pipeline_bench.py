"""``gpuaware bench pipeline``: the stream and the scheduler under a whole fleet's telemetry, on one machine.

Per fleet size (``gpus``, 8 per node) and stream worker count, on the broker given (a fresh embedded
one by default):
- the **load generator** (``gpuaware.bench.fleet_load``, its own process) publishes what the fleet's agents
  would: pre-encoded GenTD26 batches at the default sampling policy, real batch sizes, keys and
  5 s flush window; ``published_samples_per_s`` is what it sent, ``generator_late_s`` how far its
  send loop fell behind the clock (it is never the bottleneck while that stays under a second);
- ``workers`` stream workers (own processes, one consumer group that starts at the topic's end)
  turn it into ``gpu.state.v1``: ``samples_per_s`` is what they applied, ``max_lag`` their highest
  summed consumer lag (records), ``lag_growing`` whether it rose over the measured window (``lag_growing``
  below); ``p50/p99_sample_to_state_s`` is from a sample's timestamp to the arrival of the
  first state carrying it, for GPUs in slot 0 (an eighth of the fleet, to keep the measuring
  cheap); it includes the agents' batching window (up to 5 s) and the stream's 1 s minimum
  publish interval, and ``p99_beyond_batching_s`` subtracts the 5 s window;
  ``p99_publish_to_arrival_s`` is the part from the state's ``published_ms`` to its arrival here: the
  worker's producer buffer (drained by a task of the worker's own event loop, so its stalls count), the
  broker, and this process's consumer (whose loop the scheduler shares);
  ``stream_p99_sample_to_state_s`` is the workers' own histogram;
- the **scheduler** (this process, wired as in ``gpuaware up`` against a fake API server holding
  the fleet's nodes) follows ``gpu.state.v1`` and places openb pods (capped at ``POD_RATE`` pods/s):
  ``scheduler_p99_ms`` is one scheduling cycle's p99 (one pod's decision, as kube-scheduler counts
  a cycle) on the model holding the fleet's live state; ``scheduler_pass_p99_ms`` one whole pass
  (live state applied, then every pending pod tried), ``scheduler_state_apply_p99_ms`` the
  application of the fleet's state alone; ``scheduler_feed_lag_p99_s`` the age
  of the newest state the scheduler holds, sampled every 2 s; ``scheduler_gpus`` how many of
  the fleet's GPUs it holds state for, ``scheduler_rss_mib`` this process's resident memory at
  the end (scheduler, fake API server and the bench's watchers) and ``scheduler_rss_growth_mib``
  its growth over the run (mostly the fleet's live state);
- ``cpu_percent`` / ``rss_mib`` per process: ``stream_workers`` (one entry per worker, its peak),
  ``generator``, ``scheduler`` (this process), ``broker``; ``worker_kib_per_gpu`` the workers' peak resident memory
  over what they held when they began applying (``worker_rss_at_join_mib``), per GPU of the fleet.
The measuring starts 10 s after the workers have met 99 % of the fleet's GPUs and built their forecasters (``gpus_met``
and ``gpus_forecasting`` of them, after ``met_after_s``; at most 240 s): meeting a GPU (its tracker, and at its first
closed minute its forecasters) costs more than its later samples, and that is a worker's start,
not the steady state (``gpuaware/bench/stream_recovery.py`` measures starts); then, once their summed lag is at most a
second of the fleet's records (``caught_up_after_s`` later, None if not within 120 s; ``lag_at_start``, what it was
when the window began): a worker that began the window behind measured its backlog draining. A size is *sustained*
when the lag does not grow, the workers applied at least 90 % of what was published (the two counters are read a
second apart) and the generator kept up; ``largest_sustained_gpus`` is the largest such size.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer

from gpuaware.agent.collectors.sim import Scenario
from gpuaware.bench.fleet_load import GPUS_PER_NODE, MODELS, load_template
from gpuaware.contract import topics
from gpuaware.contract.events import DecodeError, GpuState, decode
from gpuaware.local.processes import ChildProcess, cpu_seconds, peak_rss_mib, rss_mib
from gpuaware.local.stack_scheduler import StackScheduler
from gpuaware.local.stream_workers import StreamWorkerProcess, worker_env
from gpuaware.plumbing.kafka_admin import end_offsets, topic_partitions
from gpuaware.plumbing.kafka_settings import KafkaSettings

WARMUP_S = 10.0
# The measuring starts WARMUP_S after the workers have met (built the state of) this share of the fleet and built its
# forecasters, or after MEET_TIMEOUT_S. A GPU is first met within the agents' 30 s sampling ceiling and its
# forecasters are built at its first closed minute, up to a minute later; meeting it (its tracker, its owner entry,
# its forecasters) costs the worker more than its later samples: a worker's start, which
# gpuaware/bench/stream_recovery.py
# measures, not the steady state the fleet's figures are about. (Waiting for the meeting alone, a 60 s window at
# 50,000 GPUs spent 8-12 % of the worker's main thread building forecasters.)
MET_SHARE = 0.99
MEET_TIMEOUT_S = 240.0
# ... and once the workers' summed lag is at most what the fleet publishes in CAUGHT_UP_S (a node's batch every 5 s),
# or after CATCH_UP_TIMEOUT_S: a worker meets a large fleet's GPUs more slowly than they publish, and one that began
# the window with the meeting's backlog measured that backlog's draining, not whether it keeps up
# (``caught_up_after_s``, None when it did not; ``lag_at_start``).
CAUGHT_UP_S = 1.0
CATCH_UP_TIMEOUT_S = 120.0
BATCH_WINDOW_S = 5.0  # the agents' default flush (SamplingPolicy.flush_s)
POD_RATE = 20.0


def _scrapes(workers: list[StreamWorkerProcess]) -> list[str]:
    """Each reachable worker's /metrics text."""
    texts = []
    for worker in workers:
        with contextlib.suppress(OSError):
            texts.append(worker.metrics())
    return texts


def _buckets(workers: list[StreamWorkerProcess]) -> dict[float, float]:
    """The workers' sample-to-state histogram summed (cumulative counts by upper bound)."""
    out: dict[float, float] = {}
    for text in _scrapes(workers):
        for line in text.splitlines():
            if line.startswith("gpuaware_stream_sample_to_state_seconds_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                out[bound] = out.get(bound, 0.0) + float(line.split()[-1])
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


def lag_growing(lags: list[float]) -> bool:
    """Did the summed lag (sampled every 2 s) rise over the window: its last third's mean above its first
    third's by more than 1,000 records (a take and a fetch in flight make a steady worker's lag jump by a few
    hundred) and more than a tenth. A ratio test alone missed a worker that started the window far behind:
    67,600 -> 158,011 records in three minutes at 50,000 GPUs read as flat against 2x the start."""
    if len(lags) < 3:
        return False
    third = len(lags) // 3
    first, last = float(np.mean(lags[:third])), float(np.mean(lags[-third:]))
    return last - first > max(1000.0, 0.1 * first)


def _lag(workers: list[StreamWorkerProcess]) -> float | None:
    texts = _scrapes(workers)
    return sum(float(line.split()[-1]) for text in texts for line in text.splitlines()
               if line.startswith("gpuaware_stream_consumer_lag{")) if texts else None


def _applied(workers: list[StreamWorkerProcess]) -> float:
    return sum(w.counter("gpuaware_stream_samples_total") for w in workers)


def _met(workers: list[StreamWorkerProcess]) -> tuple[float, float]:
    """GPUs the workers hold, and those of them forecasting (one scrape of each worker)."""
    met = forecasting = 0.0
    for text in _scrapes(workers):
        for line in text.splitlines():
            if line.startswith("gpuaware_stream_gpus "):
                met += float(line.split()[1])
            elif line.startswith("gpuaware_stream_gpus_forecasting "):
                forecasting += float(line.split()[1])
    return met, forecasting


async def _start_group_at_end(kafka: KafkaSettings, group: str, names: tuple[str, ...]) -> None:
    """Commit ``group``'s offsets at the ends of ``names``: its workers skip what earlier sizes published."""
    tps = [tp for name in names for tp in await topic_partitions(kafka, name)]
    ends = await end_offsets(kafka, tps)
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(group))
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.commit({tp: ends[tp] for tp in tps})
    finally:
        await consumer.stop()


async def _watch_states(kafka: KafkaSettings, key_prefix: bytes, latencies: list[float], delivery: list[float],
                        stop: asyncio.Event) -> None:
    """Sample-to-state latency of every state of slot-0 GPUs that carries a new sample (heartbeat
    republishes of an unchanged GPU repeat their sample's time and are not counted); ``delivery``: the part of
    it from the state's ``published_ms`` (the worker's clock, this machine's) to its arrival here."""
    consumer = AIOKafkaConsumer(topics.GPU_STATE, **kafka.consumer_kwargs(None, from_beginning=False))
    await consumer.start()
    newest: dict[bytes, int] = {}
    try:
        while not stop.is_set():
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                now = time.time()
                for m in msgs:
                    if not (m.key and m.key.startswith(key_prefix) and m.key.endswith(b"-0")):
                        continue
                    try:
                        s = decode(m.value)
                    except DecodeError:
                        continue
                    if isinstance(s, GpuState) and s.sample_ts_ms > newest.get(m.key, 0):
                        if m.key in newest:  # the first state seen may be an old one
                            latencies.append(now - s.sample_ts_ms / 1000)
                            delivery.append(now - s.published_ms / 1000)
                        newest[m.key] = s.sample_ts_ms
    finally:
        await consumer.stop()


def _generator_stats(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


def _timed(owner: Any, method: str) -> list[float]:
    """Wrap ``owner.method`` (an instance attribute from now on) to record each call's duration."""
    durations: list[float] = []
    inner = getattr(owner, method)

    def timed(*args: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args)
        finally:
            durations.append(time.perf_counter() - started)

    setattr(owner, method, timed)
    return durations


def _pct(values: list[float] | np.ndarray, q: float, scale: float = 1.0, digits: int = 2) -> float | None:
    return round(float(np.percentile(values, q)) * scale, digits) if len(values) else None


async def run_size(kafka: KafkaSettings, gpus: int, workers: int, seconds: float, broker_pid: int | None,
                   workdir: Path, template: Path) -> dict:
    prefix = f"p{uuid.uuid4().hex[:4]}"
    nodes = max(1, gpus // GPUS_PER_NODE)
    # The scheduler's cluster: the fleet's nodes under the names the generator gives them (Scenario.node_name).
    scenario = Scenario.model_construct(name=prefix, nodes=nodes, gpus_per_node=GPUS_PER_NODE, models=MODELS,
                                        node_prefix=prefix, duration_s=86400, library=False)
    app_id = f"bench-pipeline-{prefix}"
    await _start_group_at_end(kafka, app_id, (topics.TELEMETRY, topics.EVENTS))
    procs = [StreamWorkerProcess(kafka, app_id, workdir, f"stream-{prefix}-{i}", node_identity="off")
             for i in range(workers)]
    for p in procs:
        p.start()
    sched = StackScheduler(kafka, scenario)
    await sched.start()
    sched.load.rate = min(sched.load.rate, POD_RATE)
    passes = _timed(sched.live, "schedule_once")
    applies = _timed(sched.live.gpu_state, "apply") if sched.live.gpu_state is not None else []
    stop = asyncio.Event()
    sched_task = asyncio.create_task(sched.run(stop))
    rss_before = rss_mib(os.getpid())
    stats_path = workdir / f"generator-{prefix}.jsonl"
    generator = ChildProcess(
        f"fleet-load-{prefix}",
        [sys.executable, "-m", "gpuaware.bench.fleet_load", "--gpus", str(gpus), "--prefix", prefix, "--template",
         str(template), "--stats", str(stats_path)],
        workdir / f"generator-{prefix}.log", worker_env(kafka))
    generator.start()
    latencies: list[float] = []
    delivery: list[float] = []
    watcher = asyncio.create_task(_watch_states(kafka, f"GPU-{prefix}-".encode(), latencies, delivery, stop))
    lags: list[float] = []
    feed_lag: list[float] = []
    view = sched.live.view
    try:
        met, forecasting, met_after, joined_rss = await _meet_the_fleet(procs, generator, nodes * GPUS_PER_NODE)
        await asyncio.sleep(WARMUP_S)
        caught_up_after = await _catch_up(procs, nodes / BATCH_WINDOW_S * CAUGHT_UP_S)
        lag_at_start = await asyncio.to_thread(_lag, procs)
        pids = {"generator": generator.pid, "scheduler": os.getpid(), "broker": broker_pid}
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        wcpu0 = [cpu_seconds(p.pid) for p in procs]
        gen0, applied0 = _generator_stats(stats_path), _applied(procs)
        t0, first, passes0, applies0 = time.monotonic(), len(latencies), len(passes), len(applies)
        delivered0 = len(delivery)
        decisions0 = len(sched.live.stats.decision_latencies)
        hist0 = await asyncio.to_thread(_buckets, procs)
        late = 0.0
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(2.0)
            lag = await asyncio.to_thread(_lag, procs)
            if lag is not None:
                lags.append(lag)
            newest = max((s.published_ms for s in view.gpus.values()), default=0) if view else 0
            if newest:
                feed_lag.append(time.time() - newest / 1000)
            late = max(late, float(_generator_stats(stats_path).get("late_s", 0.0)))
        elapsed = time.monotonic() - t0
        worker_p99 = _quantile(0.99, hist0, await asyncio.to_thread(_buckets, procs))
        gen1 = _generator_stats(stats_path)
        published = (gen1.get("samples", 0) - gen0.get("samples", 0)) / elapsed
        applied = (_applied(procs) - applied0) / elapsed
        cpu = {k: round(100 * (cpu_seconds(p) - cpu0[k]) / elapsed, 1) for k, p in pids.items()}
        worker_cpu = [cpu_seconds(p.pid) - c for p, c in zip(procs, wcpu0, strict=True)]
        cpu["stream_workers"] = [round(100 * c / elapsed, 1) for c in worker_cpu]
        rss = {"generator": round(peak_rss_mib(generator.pid), 1), "scheduler": round(rss_mib(os.getpid()), 1),
               "broker": round(peak_rss_mib(broker_pid), 1),
               "stream_workers": [round(peak_rss_mib(p.pid), 1) for p in procs]}
        # Each worker's peak resident memory over what it had when it began applying, per GPU it holds (the fleet
        # split evenly): what a worker's memory limit must allow per GPU (docs/deploy.md, "Sizing").
        growth = [peak - joined for peak, joined in zip(rss["stream_workers"], joined_rss, strict=True)]
        kib_per_gpu = round(1024 * sum(growth) / (nodes * GPUS_PER_NODE), 2)
        measured = latencies[first:]
        decisions = list(sched.live.stats.decision_latencies)[decisions0:]
        growing = lag_growing(lags)
        p99 = _pct(measured, 99)
        gpu_prefix = f"GPU-{prefix}-"
        return {
            "gpus": nodes * GPUS_PER_NODE, "workers": workers, "nodes": nodes, "seconds": round(elapsed, 1),
            "gpus_met": int(met), "gpus_forecasting": int(forecasting), "met_after_s": round(met_after, 1),
            "caught_up_after_s": caught_up_after,
            "lag_at_start": int(lag_at_start) if lag_at_start is not None else None,
            "published_samples_per_s": round(published, 1), "samples_per_s": round(applied, 1),
            "generator_late_s": round(late, 2),
            # What a worker does with a CPU second: the figure a shared, overloaded machine cannot skew.
            "samples_per_worker_cpu_s": round(applied * elapsed / max(sum(worker_cpu), 1e-3), 1),
            "states_measured": len(measured),
            "p50_sample_to_state_s": _pct(measured, 50), "p99_sample_to_state_s": p99,
            "p99_beyond_batching_s": round(max(0.0, p99 - BATCH_WINDOW_S), 2) if p99 is not None else None,
            "p99_publish_to_arrival_s": _pct(delivery[delivered0:], 99),
            "stream_p99_sample_to_state_s": round(worker_p99, 2) if worker_p99 is not None else None,
            "max_lag": int(max(lags)) if lags else None, "lag_growing": growing,
            "scheduler_p99_ms": _pct(decisions, 99, 1000),
            "scheduler_decisions": len(decisions),
            "scheduler_pass_p99_ms": _pct(passes[passes0:], 99, 1000), "scheduler_passes": len(passes) - passes0,
            "scheduler_state_apply_p99_ms": _pct(applies[applies0:], 99, 1000),
            "scheduler_feed_lag_p99_s": _pct(feed_lag, 99),
            "scheduler_gpus": sum(1 for u in view.gpus if u.startswith(gpu_prefix)) if view else 0,
            "scheduler_rss_mib": round(rss_mib(os.getpid()), 1),
            "scheduler_rss_growth_mib": round(rss_mib(os.getpid()) - rss_before, 1),
            "scheduler_placements": sched.live.stats.by_action()["PLACE"],
            "cpu_percent": cpu, "rss_mib": rss,
            "worker_rss_at_join_mib": [round(r, 1) for r in joined_rss], "worker_kib_per_gpu": kib_per_gpu,
        }
    finally:
        generator.stop()
        stop.set()
        await sched_task
        await watcher
        await sched.stop()
        for p in procs:
            p.stop()


async def _meet_the_fleet(procs: list[StreamWorkerProcess], generator: ChildProcess,
                          gpus: int) -> tuple[float, float, float, list[float]]:
    """Wait for the workers to join and apply, then to have met (and be forecasting) MET_SHARE of the fleet's ``gpus``,
    at most MEET_TIMEOUT_S; (GPUs met, GPUs forecasting, seconds it took, each worker's resident MiB when they began
    applying). A child that stops is an error."""
    deadline = time.monotonic() + 180
    while _applied(procs) <= 0:  # workers joined and applying
        if time.monotonic() > deadline or not all(p.running() for p in procs) or not generator.running():
            raise RuntimeError(f"pipeline at {gpus} GPUs did not start:\n"
                               + "\n".join(p.log_tail() for p in [*procs, generator]))
        await asyncio.sleep(0.5)
    joined = [rss_mib(p.pid) for p in procs]
    started = time.monotonic()
    while min(met_forecasting := await asyncio.to_thread(_met, procs)) < MET_SHARE * gpus \
            and time.monotonic() - started < MEET_TIMEOUT_S:
        if not all(p.running() for p in procs) or not generator.running():
            raise RuntimeError(f"pipeline at {gpus} GPUs stopped while meeting the fleet:\n"
                               + "\n".join(p.log_tail() for p in [*procs, generator]))
        await asyncio.sleep(1.0)
    met, forecasting = met_forecasting
    return met, forecasting, time.monotonic() - started, joined


async def _catch_up(procs: list[StreamWorkerProcess], records: float) -> float | None:
    """Seconds until the workers' summed lag was at most ``records`` (None: not within CATCH_UP_TIMEOUT_S)."""
    started = time.monotonic()
    while time.monotonic() - started < CATCH_UP_TIMEOUT_S:
        lag = await asyncio.to_thread(_lag, procs)
        if lag is not None and lag <= records:
            return round(time.monotonic() - started, 1)
        await asyncio.sleep(1.0)
    return None


def sustained(r: dict) -> bool:
    return (not r["lag_growing"] and bool(r["states_measured"]) and r["generator_late_s"] < 2.0
            and r["samples_per_s"] >= 0.9 * r["published_samples_per_s"])


def run_pipeline_bench(kafka: KafkaSettings, sizes: list[int], seconds: float, broker_pid: int | None,
                       worker_counts: tuple[int, ...] = (1, 2), broker: str = "embedded",
                       progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory(prefix="gpuaware-bench-pipeline-") as tmp:
        template = Path(tmp) / "fleet-template.pkl"
        progress("simulating the agents' template (32 nodes, 6 minutes of GenTD26)")
        load_template(template)
        for gpus in sizes:
            for workers in worker_counts:
                progress(f"{gpus} GPUs, {workers} worker(s): {MET_SHARE:.0%} of the GPUs met and forecasting (at most "
                         f"{MEET_TIMEOUT_S:.0f}s), {WARMUP_S:.0f}s warm-up, {seconds:.0f}s measured")
                r = asyncio.run(run_size(kafka, gpus, workers, seconds, broker_pid, Path(tmp), template))
                results.append(r)
                progress(f"{gpus} GPUs, {workers} worker(s): {r['samples_per_s']} samples/s, p99 sample-to-state "
                         f"{r['p99_sample_to_state_s']} s, max lag {r['max_lag']}, scheduler p99 "
                         f"{r['scheduler_p99_ms']} ms")
    ok = [r for r in results if sustained(r)]
    by_workers = {str(w): max((r["gpus"] for r in ok if r["workers"] == w), default=None) for w in worker_counts}
    return {"results": results, "largest_sustained_gpus": max((r["gpus"] for r in ok), default=None),
            "largest_sustained_gpus_by_workers": by_workers, "broker": broker, "cpus": os.cpu_count()}

