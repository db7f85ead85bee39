"""What one stream worker's own logic costs per sample at fleet size, without Kafka: ``python -m
gpuaware.bench.worker_cost``.

``gpuaware bench pipeline`` measures a worker end to end, but one run at 50,000 GPUs takes six minutes and its
profile mixes the worker's logic with Faust, aiokafka and the broker. This replays the pipeline's load-generator
template (``gpuaware.bench.fleet_load``: the same batches, keys and events) for ``--gpus`` GPUs on a simulated clock
straight
into ``StreamProcessor`` (a dict for the table, as the tests use), in takes of one generator tick (0.1 s), with what
the worker does around it: records decoded, states encoded as ``StatePublisher`` encodes them, node rollups as the
worker encodes them (their GPU lists kept: ``gpuaware.stream.publisher.node_gpus``), table values encoded, and the
timers at
their rates (heartbeat every 1 s, fleet check and rollups every 5 s, half an interval apart, demand partials every
10 s). ``--warmup`` simulated seconds first (every GPU met, most with their forecasters), then ``--seconds``
measured. JSON: ``gpus``, ``samples``, ``states`` (``heartbeat_states`` of them), ``node_states``, ``cpu_s`` and its
split (``process_cpu_s`` for decoding, applying and finishing takes with their states encoded, ``timers_cpu_s``),
``samples_per_cpu_s`` (what a worker could take at most, before Faust and the client), ``published_samples_per_s``
(what the fleet sends), ``headroom`` (the ratio of the two: above 1, the logic alone keeps up), and the table's
writes and bytes a second by kind of key (``table_writes_per_s``, ``table_bytes_per_s``; ``table_bytes_per_gpu_s``
all of them per GPU): what the worker puts to RocksDB and its changelog. A node's history entry grows with its
minutes, up to an hour of them: ``--warmup 3900`` measures a worker that has held its GPUs for an hour.
``--profile FILE`` writes a cProfile of the measured part.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import time
import zlib
from collections import Counter
from pathlib import Path

from gpuaware.bench.fleet_load import TICKS_PER_S, Fleet, load_template
from gpuaware.contract import topics
from gpuaware.contract.events import GpuEvent, TelemetryBatch, decode
from gpuaware.plumbing.gc_policy import FreezeSurvivors
from gpuaware.stream.processor import InvalidRecord, StreamProcessor, Take
from gpuaware.stream.publisher import StatePublisher, node_gpus

PARTITIONS = topics.spec(topics.TELEMETRY).partitions
T0_MS = 1_800_000_000_000


class Table(dict):
    """The processor's table (a dict, as the tests use) counting its writes and their bytes by kind of key (``node``,
    ``hist``, ``owner``: ``gpuaware.stream.processor``): what a worker puts to RocksDB and its changelog."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def __setitem__(self, key: str, value: bytes) -> None:
        kind = key.split(":", 1)[0] if ":" in key else "gpu"
        self.writes[kind] += 1
        self.bytes[kind] += len(value)
        super().__setitem__(key, value)


class Worker:
    """The worker's loop around the processor, on a clock the caller moves."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.table = Table()
        self.processor = StreamProcessor(self.table)
        self.publisher = StatePublisher(topics.GPU_STATE, None, self.processor.stats)  # its encoding only
        self.rollups = StatePublisher(topics.NODE_STATE, None, self.processor.stats, node_gpus())
        self.processor.render = self.publisher.encoded_state  # states encoded as the worker makes them (app.py)
        self.owned = set(range(PARTITIONS))
        self.partition = {}
        self.samples = 0
        self.states = 0
        self.heartbeat_states = 0
        self.node_states = 0
        self.process_s = 0.0
        self.timers_s = 0.0
        self.split = {"heartbeat": 0.0, "rollup": 0.0}

    def _partition(self, key: bytes) -> int:
        p = self.partition.get(key)
        if p is None:
            p = self.partition[key] = zlib.crc32(key) % PARTITIONS
        return p

    def tick(self, tick: int, now_ms: int) -> None:
        records, samples = self.fleet.records(tick, now_ms)  # the generator's part, not timed
        started = time.process_time()
        take = Take()
        proc = self.processor
        for topic, key, value in records:
            try:
                if topic == topics.TELEMETRY:
                    proc.apply_telemetry(decode(value, TelemetryBatch), self._partition(key), now_ms, take)
                else:
                    event = decode(value, GpuEvent)
                    proc.apply_event(event, self._partition(event.node.encode()), now_ms, take)
            except InvalidRecord:
                continue
        states = proc.finish(take, now_ms)  # (encoded)
        self.samples += samples
        self.states += len(states)
        timers = time.process_time()
        self.process_s += timers - started
        if tick % TICKS_PER_S == 0:
            second = tick // TICKS_PER_S
            heartbeats = proc.heartbeats(now_ms, self.owned)  # (encoded)
            self.states += len(heartbeats)
            self.heartbeat_states += len(heartbeats)
            rollup = time.process_time()
            self.split["heartbeat"] += rollup - timers
            if second % 5 == 0:
                proc.fleet_check(now_ms, self.owned)
            self.split["rollup"] += time.process_time() - rollup
            if second % 10 == 0:
                json.dumps(proc.demand_partials(sorted(self.owned)))
        # the rollups, half an interval after (gpuaware.stream.app)
        if tick % (5 * TICKS_PER_S) == 5 * TICKS_PER_S // 2:
            rollup = time.process_time()
            for node in proc.node_states(now_ms, self.owned):
                self.rollups.encode(node, node.key())
                self.node_states += 1
            self.split["rollup"] += time.process_time() - rollup
        self.timers_s += time.process_time() - timers


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m gpuaware.bench.worker_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=50_000)
    ap.add_argument("--warmup", type=int, default=90, help="Simulated seconds before measuring.")
    ap.add_argument("--seconds", type=int, default=30, help="Simulated seconds measured.")
    ap.add_argument("--template", type=Path, default=None, help="Where the generator's template is cached.")
    ap.add_argument("--profile", type=Path, default=None, help="Write a cProfile of the measured seconds here.")
    args = ap.parse_args(argv)
    fleet = Fleet(load_template(args.template), args.gpus, "wc")
    FreezeSurvivors().install()  # the worker's collector policy (gpuaware.stream.main)
    worker = Worker(fleet)
    tick = 0
    for _ in range(args.warmup * TICKS_PER_S):
        worker.tick(tick, T0_MS + tick * 100)
        tick += 1
    worker.samples = worker.states = worker.heartbeat_states = worker.node_states = 0
    worker.process_s = worker.timers_s = 0.0
    worker.table.writes.clear()
    worker.table.bytes.clear()
    worker.split = {"heartbeat": 0.0, "rollup": 0.0}
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    for _ in range(args.seconds * TICKS_PER_S):
        worker.tick(tick, T0_MS + tick * 100)
        tick += 1
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    cpu = worker.process_s + worker.timers_s
    published = worker.samples / args.seconds
    print(json.dumps({
        "gpus": len(fleet.nodes) * 8, "seconds": args.seconds, "samples": worker.samples, "states": worker.states,
        "heartbeat_states": worker.heartbeat_states, "node_states": worker.node_states,
        "cpu_s": round(cpu, 2), "process_cpu_s": round(worker.process_s, 2), "timers_cpu_s": round(worker.timers_s, 2),
        "heartbeat_cpu_s": round(worker.split["heartbeat"], 2),
        "rollup_cpu_s": round(worker.split["rollup"], 2),
        "samples_per_cpu_s": round(worker.samples / cpu, 1), "published_samples_per_s": round(published, 1),
        "headroom": round(worker.samples / cpu / published, 3),
        "forecasting": sum(t.forecasting for t in worker.processor.trackers.values()),
        "table_writes_per_s": {k: round(v / args.seconds, 1) for k, v in sorted(worker.table.writes.items())},
        "table_bytes_per_s": {k: round(v / args.seconds) for k, v in sorted(worker.table.bytes.items())},
        "table_bytes_per_gpu_s": round(sum(worker.table.bytes.values()) / args.seconds / (len(fleet.nodes) * 8), 1),
    }))


if __name__ == "__main__":
    main()
