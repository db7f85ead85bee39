"""On a GPU machine: the real agent process (``gpuaware agent --collector nvml``) against the embedded broker.

Starts the embedded broker, runs the agent as its own process for ``--seconds``, scrapes its ``/metrics``
half way, then reads back what it published on the telemetry and event topics and decodes every record
with the contract. Prints one JSON object: the GPUs announced, samples and watch points per GPU, which
sample fields carried values, the event kinds, the DCGM families exported (against the contract's list),
and every record that failed to decode. Exits 1 if nothing was published or a record failed to decode.

Run from the project root: ``python -m gpuaware.bench.nvml_pipeline_check --seconds 40`` (``--collector sim`` runs the
same check without a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpuaware.contract import events, topics
from gpuaware.contract.dcgm import FAMILIES
from gpuaware.local.broker import BrokerSettings, LocalBroker
from gpuaware.plumbing.kafka_settings import KafkaSettings


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> set[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


async def _read_back(kafka: KafkaSettings) -> dict:
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(None))
    await consumer.start()
    try:
        parts = [TopicPartition(t, p) for t in (topics.TELEMETRY, topics.EVENTS)
                 for p in range(topics.spec(t).partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        gpus: dict[str, dict] = {}
        samples: Counter[str] = Counter()
        points: Counter[str] = Counter()
        fields_seen: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        bad: list[str] = []
        batches = 0
        per_field = defaultdict(list)
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            got = await consumer.getmany(timeout_ms=1000)
            for tp, records in got.items():
                for rec in records:
                    try:
                        value = events.decode_for_topic(tp.topic, rec.value)
                    except Exception as exc:  # every failure is reported, not only the first
                        bad.append(f"{tp.topic}@{rec.offset}: {exc}")
                        continue
                    if isinstance(value, events.TelemetryBatch):
                        batches += 1
                        for g in value.gpus:
                            gpus[g.uuid] = {"index": g.index, "model": g.model, "fb_total_mib": g.fb_total_mib}
                        for s in value.samples:
                            samples[f"{value.node}/{s.gpu}"] += 1
                            for name in s.__slots__:
                                v = getattr(s, name)
                                if v is not None:
                                    fields_seen[name] += 1
                                    per_field[name].append(v)
                        for p in value.points:
                            points[f"{value.node}/{p.gpu}"] += 1
                    else:
                        kinds[value.kind.value] += 1
        ranges = {k: [min(v), max(v)] for k, v in per_field.items() if k not in ("gpu", "seq", "dt_ms")}
        return {"telemetry_batches": batches, "gpus": gpus, "samples_per_gpu": dict(samples),
                "watch_points_per_gpu": dict(points), "sample_fields_with_values": dict(fields_seen),
                "sample_field_ranges": ranges, "event_kinds": dict(kinds), "undecodable": bad}
    finally:
        await consumer.stop()


def _scrape_when_up(port: int, agent: subprocess.Popen, until: float) -> set[str]:
    """The families on /metrics once the agent serves them (its start takes seconds on a busy machine); empty, with
    the last error on stderr, when it never did before ``until`` or before it exited."""
    error: OSError | None = None
    while time.monotonic() < until and agent.poll() is None:
        try:
            exported = _scrape(port)
            if any(n in exported for n in FAMILIES):
                return exported
        except OSError as exc:
            error = exc
        time.sleep(0.5)
    print(f"scrape failed: {error or 'no DCGM family served'}", file=sys.stderr)
    return set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0, help="How long the agent runs.")
    ap.add_argument("--collector", choices=["nvml", "sim"], default="nvml")
    args = ap.parse_args()
    port = _free_port()
    with LocalBroker(BrokerSettings(port=0)) as broker, tempfile.TemporaryDirectory() as spool:
        cmd = [sys.executable, "-c", "from gpuaware.cli import main; main()",
               "--bootstrap-servers", broker.bootstrap, "agent", "--collector", args.collector,
               "--node-name", "gpu-check", "--metrics-port", str(port), "--spool-dir", spool,
               "--duration", str(args.seconds)]
        started = time.monotonic()
        env = {**os.environ, "GPUAWARE_KAFKA__EMBEDDED_BROKER_COMPAT": "true"}  # Tansu (docs/broker.md)
        agent = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        try:
            time.sleep(args.seconds / 2)
            exported = _scrape_when_up(port, agent, started + args.seconds)
            _, err = agent.communicate(timeout=args.seconds + 60)
        finally:  # never left running past the broker it publishes to
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        ran_s = time.monotonic() - started
        found = asyncio.run(_read_back(broker.kafka_settings()))
    dcgm = sorted(n for n in FAMILIES if n in exported)
    result = {
        "collector": args.collector, "agent_rc": agent.returncode, "agent_ran_s": round(ran_s, 1), **found,
        "dcgm_families_exported": dcgm, "dcgm_families_absent": sorted(set(FAMILIES) - set(dcgm)),
        "gpuaware_families_exported": sorted(n for n in exported if n.startswith("gpuaware_")),
        "agent_stderr_tail": err.splitlines()[-15:],
    }
    print(json.dumps(result, indent=1, default=str))
    return 0 if agent.returncode == 0 and found["telemetry_batches"] and not found["undecodable"] else 1


if __name__ == "__main__":
    sys.exit(main())
