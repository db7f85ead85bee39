"""What a fleet of N GPUs' agents publish, replayed from pre-encoded batches at the fleet's rate.

``gpuaware bench pipeline`` needs 50,000-100,000 GPUs of telemetry on one machine, which simulating
every agent cannot give (512 simulated agents saturated a core). So a **template** of
``TEMPLATE_NODES`` nodes is simulated once with ``gpuaware.agent.replay.simulate`` (the live agent's
AgentCore and BatchBuilder, GenTD26 replay, the default ``SamplingPolicy`` and its 5 s flush):
the real batch sizes, sample mix, events and keys. The start-up minute (every GPU at the 1 s
floor) is skipped; the next ``LOOP_S`` seconds are encoded once with the contract codec.

A fleet of N GPUs is N/8 nodes; node ``i`` replays template node ``i % TEMPLATE_NODES`` with its own
name, GPU UUIDs and ``batch_seq``, shifted in the loop by a per-node offset (tenths of a second), so
nodes neither flush in step nor carry the same curve at the same time. Per batch sent only the
prefix (node, batch_seq, base_ts_ms) is encoded; the GPU list (once per node) and the samples (once
per template batch) are bytes cut from the codec's own output, so every record is what
``gpuaware.contract.events.encode`` writes for that batch (tests/bench/test_fleet_load.py decodes them).
Timestamps follow the wall clock: a batch's base is its send time minus the template's lead, so
sample-to-state latency includes the agents' batching window as it does live. When the loop
wraps a GPU's ``seq`` starts again lower while its timestamps keep growing, which the stream
treats as new samples (it deduplicates on seq *and* time).

Run as its own process (``python -m gpuaware.bench.fleet_load``, Kafka settings from ``GPUAWARE_KAFKA__*``)
with ``--shard k/n`` to split a fleet across processes; it writes one JSON line of counters a
second to ``--stats`` (or stdout): ``samples``, ``batches``, ``events``, ``late_s`` (how far the
send loop is behind the clock: above a second or two, the generator is the bottleneck).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import pickle
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuaware.contract import topics
from gpuaware.contract.events import GpuEvent, GpuInfo, TelemetryBatch, encode
from gpuaware.plumbing.kafka_settings import KafkaSettings

GPUS_PER_NODE = 8
TEMPLATE_NODES = 32
WARMUP_S = 60  # the agents' start-up minute at the sampling floor, not replayed
LOOP_S = 300  # a multiple of the 5 s flush
TICKS_PER_S = 10
MODELS = ["H100", "A100", "V100", "T4"]
# The record ends in its arrays (gpus, samples, light points since v2); empty, each is one 0x00 byte.
EMPTY_ARRAYS = 3
AFTER_GPUS = EMPTY_ARRAYS - 1  # the samples and points arrays: what a template batch's body holds


def node_name(prefix: str, i: int) -> str:
    return f"{prefix}-{i:05d}"


def gpu_uuid(prefix: str, i: int, index: int) -> str:
    return f"GPU-{prefix}-{i:05d}-{index}"


@dataclass
class TemplateBatch:
    second: int  # loop second it is flushed at
    node: int  # template node
    lead_ms: int  # flush time minus base_ts_ms
    samples: int
    slots: tuple[int, ...]  # the GPU indexes the batch lists (an agent lists only the GPUs it sampled)
    body: bytes  # the encoded samples and light-points arrays (the record's tail)
    points: int = 0  # light watch points (utilisation/power between full samples)


@dataclass
class TemplateEvent:
    second: int
    node: int
    gpu: int  # slot on the node
    event: GpuEvent


@dataclass
class Template:
    nodes: int
    loop_s: int
    gpus: list[dict[int, GpuInfo]]  # per template node, by index (UUIDs are replaced per fleet node)
    batches: list[TemplateBatch]
    events: list[TemplateEvent] = field(default_factory=list)

    def samples_per_s_per_gpu(self) -> float:
        return sum(b.samples for b in self.batches) / (self.loop_s * self.nodes * GPUS_PER_NODE)


def _prefix(node: str, batch_seq: int, base_ts_ms: int) -> bytes:
    return encode(TelemetryBatch(node, batch_seq, base_ts_ms, [], []))[:-EMPTY_ARRAYS]


def build_template(nodes: int = TEMPLATE_NODES, loop_s: int = LOOP_S, warmup_s: int = WARMUP_S,
                   seed: int = 0) -> Template:
    """Simulate ``nodes`` agents for ``warmup_s + loop_s`` seconds and cut their output into reusable bytes."""
    from gpuaware.agent.collectors.sim import Scenario
    from gpuaware.agent.replay import simulate
    from gpuaware.agent.sampling import SamplingPolicy

    policy = SamplingPolicy()
    scenario = Scenario(name="fleet-template", seed=seed, nodes=nodes, gpus_per_node=GPUS_PER_NODE, models=MODELS,
                        node_prefix="tpl", duration_s=86400, library=False)
    epoch_s = 1_700_000_000.0
    slot = {scenario.node_name(n): n for n in range(nodes)}
    gpus: list[dict[int, GpuInfo]] = [{} for _ in range(nodes)]
    batches, events = [], []
    for tick in simulate(scenario, warmup_s + loop_s, epoch_s, flush_every_s=int(policy.flush_s), policy=policy):
        second = int(tick.second - epoch_s) - warmup_s
        if second < 0:
            continue
        flushed_ms = int((tick.second + 1) * 1000)
        for b in tick.batches:
            n = slot[b.node]
            gpus[n].update((g.index, g) for g in b.gpus)
            full = encode(b)
            head = len(encode(TelemetryBatch(b.node, b.batch_seq, b.base_ts_ms, b.gpus, []))) - AFTER_GPUS
            batches.append(TemplateBatch(second, n, flushed_ms - b.base_ts_ms, len(b.samples),
                                         tuple(g.index for g in b.gpus), full[head:], len(b.points)))
        for e in tick.events:
            n = slot[e.node]
            index = next((g.index for g in gpus[n].values() if g.uuid == e.gpu_uuid), 0)
            events.append(TemplateEvent(second, n, index, e))
    missing = [n for n, g in enumerate(gpus) if not g]
    if missing:
        raise RuntimeError(f"template nodes {missing} published nothing in {loop_s}s")
    return Template(nodes, loop_s, gpus, batches, events)


def load_template(path: Path | None) -> Template:
    """The template cached at ``path`` (built and written there the first time)."""
    if path is not None and path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    template = build_template()
    if path is not None:
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump(template, f)
        tmp.replace(path)
    return template


class Fleet:
    """The fleet's nodes (this shard's) and the records each sends at a given tick."""

    def __init__(self, template: Template, gpus: int, prefix: str, shard: int = 0, shards: int = 1):
        self.template = template
        self.prefix = prefix
        self.nodes = [i for i in range(max(1, gpus // GPUS_PER_NODE)) if i % shards == shard]
        period = template.loop_s * TICKS_PER_S
        # Knuth's multiplicative hash spreads the offsets; the same node always gets the same one.
        self.offset = {i: (i * 2654435761) % period for i in self.nodes}
        self.by_phase: dict[int, list[int]] = {}
        for i in self.nodes:
            self.by_phase.setdefault(self.offset[i] % TICKS_PER_S, []).append(i)
        self.by_second: dict[tuple[int, int], list[TemplateBatch]] = {}
        for b in template.batches:
            self.by_second.setdefault((b.second, b.node), []).append(b)
        self.events_by_second: dict[tuple[int, int], list[TemplateEvent]] = {}
        for e in template.events:
            self.events_by_second.setdefault((e.second, e.node), []).append(e)
        self.batch_seq = dict.fromkeys(self.nodes, 0)
        self._gpu_bytes: dict[tuple[int, tuple[int, ...]], bytes] = {}

    def gpu_list(self, i: int, slots: tuple[int, ...]) -> bytes:
        """Node ``i``'s encoded GPU array listing ``slots`` (its own UUIDs, the template node's models)."""
        raw = self._gpu_bytes.get((i, slots))
        if raw is None:
            known = self.template.gpus[i % self.template.nodes]
            infos = [dataclasses.replace(known[s], uuid=gpu_uuid(self.prefix, i, s)) for s in slots]
            name = node_name(self.prefix, i)
            raw = encode(TelemetryBatch(name, 0, 0, infos, []))[len(_prefix(name, 0, 0)):-AFTER_GPUS]
            self._gpu_bytes[(i, slots)] = raw
        return raw

    def records(self, tick: int, now_ms: int) -> tuple[list[tuple[str, bytes, bytes]], int]:
        """(topic, key, value) of what the nodes whose phase is this tick send at ``now_ms``; samples in them."""
        out: list[tuple[str, bytes, bytes]] = []
        samples = 0
        for i in self.by_phase.get((-tick) % TICKS_PER_S, ()):
            second = ((tick + self.offset[i]) // TICKS_PER_S) % self.template.loop_s
            n = i % self.template.nodes
            name = node_name(self.prefix, i)
            for b in self.by_second.get((second, n), ()):
                self.batch_seq[i] += 1
                value = _prefix(name, self.batch_seq[i], now_ms - b.lead_ms) + self.gpu_list(i, b.slots) + b.body
                out.append((topics.TELEMETRY, name.encode(), value))
                samples += b.samples
            for e in self.events_by_second.get((second, n), ()):
                ev = dataclasses.replace(e.event, node=name, gpu_uuid=gpu_uuid(self.prefix, i, e.gpu), ts_ms=now_ms,
                                         event_id=f"{e.event.event_id}-{name}-{self.batch_seq[i]}")
                out.append((topics.EVENTS, ev.key(), encode(ev)))
        return out, samples


async def run(kafka: KafkaSettings, fleet: Fleet, seconds: float, stats_out, stop: asyncio.Event) -> dict:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**kafka.producer_kwargs())
    await producer.start()
    counts = {"samples": 0, "batches": 0, "events": 0, "late_s": 0.0}
    started = time.monotonic()
    pending: list[asyncio.Future] = []
    last_report = started
    try:
        tick = 0
        while not stop.is_set() and time.monotonic() - started < seconds:
            due = started + tick / TICKS_PER_S
            delay = due - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            counts["late_s"] = round(max(0.0, -delay), 3)
            records, samples = fleet.records(tick, int(time.time() * 1000))
            for topic, key, value in records:
                pending.append(await producer.send(topic, value, key=key))
                counts["batches" if topic == topics.TELEMETRY else "events"] += 1
            counts["samples"] += samples
            if len(pending) > 5000 or tick % TICKS_PER_S == 0:
                await asyncio.gather(*pending)
                pending.clear()
            tick += 1
            if time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                stats_out.write(json.dumps({"t": round(last_report - started, 1), **counts}) + "\n")
                stats_out.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuaware.bench.fleet_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, required=True, help="fleet size (8 GPUs per node)")
    p.add_argument("--seconds", type=float, default=3600.0)
    p.add_argument("--prefix", default="fleet", help="of node names and GPU UUIDs")
    p.add_argument("--shard", default="0/1", help="k/n: this process sends nodes i with i %% n == k")
    p.add_argument("--template", type=Path, help="cache file of the pre-encoded template (built if absent)")
    p.add_argument("--stats", type=Path, help="JSON lines of counters, one a second (default stdout)")
    args = p.parse_args(argv)
    from gpuaware.config import load_config

    kafka = load_config().kafka
    shard, shards = (int(x) for x in args.shard.split("/"))
    fleet = Fleet(load_template(args.template), args.gpus, args.prefix, shard, shards)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        with (args.stats.open("a") if args.stats else contextlib.nullcontext(sys.stdout)) as out:
            await run(kafka, fleet, args.seconds, out, stop)

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    sys.exit(main())
