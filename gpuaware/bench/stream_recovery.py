"""What a stream-worker restart costs at fleet scale: memory store (whole changelog replayed) vs RocksDB.

    python -m gpuaware.bench.stream_recovery [--gpus 10000] [--rounds 12] [--stores memory,rocksdb]
    [--bootstrap-servers H:P]

For each store, on a fresh embedded broker of its own (or the one named): ``rounds`` telemetry batches per node
of a ``gpus`` fleet (8 GPUs per node, ``samples_per_batch`` samples per GPU per batch) go through one
worker, which writes each node's entry (its GPUs' snapshots) to the table's changelog once per batch; the worker is
stopped (SIGTERM, as a rollout or a rescheduled pod does), one more batch per node is written while
it is down, and the worker is started again on the same data directory. Timed from that start:
- ``first_new_sample_s``: until the first new sample is applied. Faust processes nothing before the
  table's recovery ends, so this is start-up + group join + recovery;
- ``all_new_samples_s``: until the new batch of every GPU is applied (each GPU's tracker is rebuilt
  from its snapshot on its first record, the same work for both stores);
- ``recovered_exactly``: every GPU's next ``gpu.state.v1`` counts all its samples, none lost;
- ``changelog_records`` at the restart, and ``changelog_records_replayed`` by the restarted worker
  (``gpuaware_stream_changelog_restored_total{role="active"}``).
The embedded Tansu broker never compacts, so the changelog holds ``rounds`` records per node (and one
``owner:`` record per GPU); on a Kafka that compacts, a memory-store replay shrinks towards one record per
node and GPU plus the uncompacted head.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.bench.stream_bench import GPUS_PER_NODE, Fleet, _produce, _wait_applied
from gpuaware.contract import topics
from gpuaware.contract.events import GpuState, decode
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.local.processes import cpu_seconds, peak_rss_mib
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing.kafka_admin import end_offsets, ensure_topics
from gpuaware.plumbing.kafka_settings import KafkaSettings

RESTORED = 'gpuaware_stream_changelog_restored_total{role="active"}'


async def _ends(kafka: KafkaSettings, topic: str, partitions: int) -> dict[TopicPartition, int]:
    return await end_offsets(kafka, [TopicPartition(topic, p) for p in range(partitions)])


async def _states_after(kafka: KafkaSettings, start: dict[TopicPartition, int], prefix: str, want: int, gpus: int,
                        timeout_s: float) -> tuple[bool, float]:
    """(every GPU of the fleet published a state counting ``want`` samples, monotonic time of the last one)."""
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(None))  # (its fetch_max_wait_ms: 100 by default)
    await consumer.start()
    counts: dict[str, int] = {}
    last = time.monotonic()
    try:
        consumer.assign(list(start))
        for tp, offset in start.items():
            consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(counts) < gpus:
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                for m in msgs:
                    s = decode(m.value)
                    if isinstance(s, GpuState) and s.gpu_uuid.startswith(prefix) and s.samples >= want:
                        counts.setdefault(s.gpu_uuid, s.samples)
                        last = time.monotonic()
    finally:
        await consumer.stop()
    return len(counts) == gpus and all(n == want for n in counts.values()), last


async def run_store(kafka: KafkaSettings, workdir: Path, store: str, gpus: int, rounds: int,
                    samples_per_batch: int, progress=None) -> dict:
    app_id = f"bench-recovery-{store}-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(max(1, gpus // GPUS_PER_NODE), samples_per_batch, prefix=app_id)
    gpus = fleet.nodes * GPUS_PER_NODE
    per_round = gpus * samples_per_batch
    fleet_partitions = topics.spec(topics.TELEMETRY).partitions
    stream = {"store": store, "standby_replicas": 0}
    producer = AIOKafkaProducer(**kafka.producer_kwargs())
    await producer.start()
    worker = StreamWorkerProcess(kafka, app_id, workdir, app_id, node_identity="off", **stream)
    try:
        now = int(time.time() * 1000)
        for r in range(rounds):
            await _produce(fleet.batches(now - (rounds - r) * samples_per_batch * 1000, 1000), producer)
        worker.start()
        began = time.monotonic()
        _, filled, _ = await _wait_applied([worker], rounds * per_round, timeout_s=1200)
        fill_s = filled - began
        fill_rss = peak_rss_mib(worker.pid)
        if progress:
            progress(f"{store}: {rounds * per_round} samples applied in {fill_s:.0f}s; restarting")
        worker.stop(grace_s=60)
        # The table's changelog is co-partitioned with the telemetry.
        data_mib = sum(f.stat().st_size for f in (workdir / app_id).rglob("*") if f.is_file()) / 2**20
        changelog = sum((await _ends(kafka, f"{app_id}-gpus-changelog", fleet_partitions)).values())
        states_from = await _ends(kafka, topics.GPU_STATE, topics.spec(topics.GPU_STATE).partitions)
        await _produce(fleet.batches(int(time.time() * 1000), 1000), producer)
        worker = StreamWorkerProcess(kafka, app_id, workdir, app_id, node_identity="off", **stream)
        worker.start()
        began = time.monotonic()
        first, applied, _ = await _wait_applied([worker], per_round, timeout_s=1200)
        exact, published = await _states_after(kafka, states_from, f"GPU-{app_id}-", (rounds + 1) * samples_per_batch,
                                               gpus, 120)
        return {
            "store": store,
            "gpus": gpus,
            "changelog_records": changelog,
            "fill_s": round(fill_s, 1),
            "filled_worker_rss_mib": round(fill_rss, 1),
            "data_dir_mib": round(data_mib, 1),
            "first_new_sample_s": round(first - began, 2),
            "all_new_samples_s": round(applied - began, 2),
            "all_new_states_s": round(published - began, 2),
            "changelog_records_replayed": int(worker.counter(RESTORED)),
            "recovered_exactly": exact,
            "restarted_worker_cpu_s": round(cpu_seconds(worker.pid), 1),
            "restarted_worker_rss_mib": round(peak_rss_mib(worker.pid), 1),
        }
    finally:
        await producer.stop()
        worker.stop()


def run(bootstrap_servers: str | None, stores: list[str], gpus: int, rounds: int, samples_per_batch: int,
        progress=None) -> dict:
    results = []
    with tempfile.TemporaryDirectory(prefix="gpuaware-bench-recovery-") as tmp:
        for store in stores:
            # A broker of its own per store: a new consumer group reads all the telemetry there is.
            with contextlib.ExitStack() as stack:
                if bootstrap_servers:
                    kafka = KafkaSettings(bootstrap_servers=bootstrap_servers)
                else:
                    kafka = stack.enter_context(LocalBroker(BrokerSettings(port=0))).kafka_settings(
                        session_timeout_ms=2000)
                asyncio.run(ensure_topics(kafka))
                results.append(asyncio.run(run_store(kafka, Path(tmp), store, gpus, rounds, samples_per_batch,
                                                     progress)))
    return {"results": results, "rounds": rounds, "samples_per_batch_per_gpu": samples_per_batch,
            "cpus": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=12, help="batches per node before the restart")
    ap.add_argument("--samples-per-batch", type=int, default=5)
    ap.add_argument("--stores", default="memory,rocksdb")
    ap.add_argument("--bootstrap-servers", default=None, help="a running broker (default: a fresh embedded one)")
    args = ap.parse_args()
    stores = [s for s in args.stores.split(",") if s]

    def progress(text: str) -> None:
        print(f"stream recovery: {text}", file=sys.stderr, flush=True)

    result = run(args.bootstrap_servers, stores, args.gpus, args.rounds, args.samples_per_batch, progress)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
