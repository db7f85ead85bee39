"""Stream workers as real processes on a real broker: state out, DLQ, sharing, crash recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuaware.contract import topics
from gpuaware.contract.events import (
    DLQ_ERROR_HEADER,
    EventKind,
    GpuEvent,
    GpuState,
    HealthBand,
    NodeState,
    Severity,
    decode,
    encode,
)
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing.kafka_settings import KafkaSettings
from tests.support import fleet_batch, produce, watch

pytestmark = pytest.mark.timeout(300)
MINUTE_MS = 60_000


@pytest.fixture
def workers(kafka_settings: KafkaSettings, tmp_path: Path,
            unique: str) -> Iterator[Callable[..., StreamWorkerProcess]]:
    started: list[StreamWorkerProcess] = []

    def start(name: str, **stream: object) -> StreamWorkerProcess:
        w = StreamWorkerProcess(kafka_settings, f"test-stream-{unique}", tmp_path, name, node_identity="off",
                                cluster_forecast_interval_s=2, node_state_interval_s=1, **stream)
        w.start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def _latest(states: list[GpuState]) -> dict[str, GpuState]:
    out: dict[str, GpuState] = {}
    for s in states:
        out[s.gpu_uuid] = s
    return out


def test_telemetry_in_state_out_with_forecasts_health_and_dlq(kafka_settings, workers, unique) -> None:
    node = f"st-{unique}"
    now = int(time.time() * 1000)
    # 20 minutes of history at 10 s steps, ending now: minutes close, forecasts form.
    batches = [fleet_batch(node, seq, now - 20 * MINUTE_MS + seq * 10_000) for seq in range(1, 121)]
    sick = GpuEvent(f"e-{unique}", now, node, f"GPU-{node}-1", EventKind.HEALTH_CHANGE, Severity.CRITICAL,
                    "health_score", 20.0, None, "health healthy -> critical",
                    {"old_band": "HEALTHY", "new_band": "CRITICAL", "component.ecc": "40.0"})
    poison = b"\xa7\x01\x01not avro at all " + unique.encode()
    records = [(topics.TELEMETRY, node.encode(), encode(b)) for b in batches[:60]]
    records += [(topics.TELEMETRY, node.encode(), poison), (topics.EVENTS, sick.key(), poison)]
    records += [(topics.TELEMETRY, node.encode(), encode(b)) for b in batches[60:]]
    asyncio.run(produce(kafka_settings, records))
    worker = workers("w1")
    mine = {f"GPU-{node}-0", f"GPU-{node}-1"}

    def keep(s: object) -> bool:
        return isinstance(s, GpuState) and s.gpu_uuid in mine

    def applied(states: list[GpuState]) -> bool:
        latest = _latest(states)
        return set(latest) == mine and all(s.samples == 120 and len(s.forecasts) == 6 for s in latest.values())

    asyncio.run(watch(kafka_settings, topics.GPU_STATE, applied, keep))
    # The event comes with the agent's trace context: the state it causes must carry the same trace.
    # (Sent once the telemetry is in: the two topics are consumed independently, and a GPU the stream
    # has no sample of yet gets no state of its own.)
    trace_id = unique.ljust(32, "0")
    traceparent = f"00-{trace_id}-{'1' * 16}-01".encode()
    asyncio.run(produce(kafka_settings, [(topics.EVENTS, sick.key(), encode(sick))], [("traceparent", traceparent)]))

    def complete(states: list[GpuState]) -> bool:
        return applied(states) and _latest(states)[f"GPU-{node}-1"].health_band == HealthBand.CRITICAL

    states = asyncio.run(watch(kafka_settings, topics.GPU_STATE, complete, keep))
    latest = _latest(states)
    traced = asyncio.run(watch(
        kafka_settings, topics.GPU_STATE, lambda seen: bool(seen),
        lambda m: dict(m.headers).get("traceparent", b"").decode().split("-")[1:2] == [trace_id], raw=True))
    assert decode(traced[0].value).gpu_uuid == f"GPU-{node}-1"
    sick_state = latest[f"GPU-{node}-1"]
    assert sick_state.health_score == 20.0 and sick_state.health_components == {"ecc": 40.0}
    for s in latest.values():
        assert s.node == node and s.fb_total_mib == 81920 and s.sample_ts_ms == batches[-1].base_ts_ms
        assert {(f.metric, f.horizon_s) for f in s.forecasts} == {
            (m, h) for m in ("util_gpu", "fb_used_mib") for h in (60, 300, 900)}
        assert all(0 <= f.lower <= f.mean <= f.upper <= 100 for f in s.forecasts if f.metric == "util_gpu")
        assert s.workload_class != "unknown"
    # The poisoned records are in the DLQs, verbatim, with the reason; processing went on past them.
    for topic in (topics.TELEMETRY, topics.EVENTS):
        (dead,) = asyncio.run(watch(kafka_settings, topics.dlq_name(topic), lambda seen: len(seen) == 1,
                                     lambda m: m.value == poison, raw=True))
        assert dict(dead.headers)[DLQ_ERROR_HEADER]
    nodes = asyncio.run(watch(kafka_settings, topics.NODE_STATE, lambda seen: bool(seen),
                               lambda s: isinstance(s, NodeState) and s.node == node))
    assert {g.uuid for g in nodes[-1].gpus} == mine
    text = worker.metrics()
    (dlq_line,) = [x for x in text.splitlines() if x.startswith('gpuaware_stream_dlq_total{topic="gpu.telemetry.v1"}')]
    assert float(dlq_line.split()[1]) >= 1
    assert "gpuaware_stream_forecast_mae" in text
    # The worker's collector policy is installed (gpuaware.plumbing.gc_policy.FreezeSurvivors) and shown.
    assert "gpuaware_gc_freezes_total" in text and "gpuaware_gc_frozen_objects" in text


# Both ways a worker handles records: in takes (the default), each node's entry is read from the partition of the
# record that first needs it, which once went wrong after a rebalance and lost the nodes' history (docs/stream.md).
@pytest.mark.parametrize("take_max_records", [500, 1], ids=["takes", "one-by-one"])
def test_workers_share_partitions_and_a_killed_worker_loses_nothing(kafka_settings, workers, unique,
                                                                    take_max_records) -> None:
    nodes = [f"rc-{unique}-{n}" for n in range(6)]
    mine = {f"GPU-{n}-{i}" for n in nodes for i in range(2)}
    start = int(time.time() * 1000) - 30 * MINUTE_MS
    seq = [0]

    def send_round(count: int) -> None:
        records = []
        for _ in range(count):
            seq[0] += 1
            for n in nodes:
                batch = fleet_batch(n, seq[0], start + seq[0] * 5000)
                records.append((topics.TELEMETRY, n.encode(), encode(batch)))
        asyncio.run(produce(kafka_settings, records))

    def all_at(samples: int) -> Callable[[list[GpuState]], bool]:
        return lambda states: (set(_latest(states)) == mine
                               and all(s.samples == samples for s in _latest(states).values()))

    def keep(s: object) -> bool:
        return isinstance(s, GpuState) and s.gpu_uuid in mine

    a = workers("a", take_max_records=take_max_records)
    send_round(100)
    asyncio.run(watch(kafka_settings, topics.GPU_STATE, all_at(100), keep))
    b = workers("b", take_max_records=take_max_records)  # joins: the partitions are split between a and b
    # Wait for the rebalance to hand b partitions of the telemetry topic (it then reports their lag),
    # rather than a fixed time that a loaded machine overruns.
    deadline = time.monotonic() + 120
    while not _holds_partitions(b, topics.TELEMETRY):
        assert time.monotonic() < deadline, "worker b was never assigned telemetry partitions"
        time.sleep(0.5)
    send_round(100)
    asyncio.run(watch(kafka_settings, topics.GPU_STATE, all_at(200), keep))
    assert "gpuaware_stream_samples_total" in b.metrics()
    a.kill()  # no goodbye: b must take over a's partitions from the changelog
    send_round(100)
    states = asyncio.run(watch(kafka_settings, topics.GPU_STATE, all_at(300), keep, timeout_s=120))
    # Every GPU's state went on from where it was: 300 samples, none lost, none applied twice,
    # and the forecasters (rebuilt from the table's history) kept forecasting.
    for s in _latest(states).values():
        assert s.samples == 300 and len(s.forecasts) == 6
    for uuid in mine:  # in publish order, a GPU's sample count never went back (no state was lost)
        counts = [s.samples for s in states if s.gpu_uuid == uuid]
        assert counts == sorted(counts) and counts[-1] == 300


def _holds_partitions(worker, topic: str) -> bool:
    try:
        text = worker.metrics()
    except OSError:  # its /metrics is not up yet
        return False
    return any(line.startswith("gpuaware_stream_consumer_lag{") and f'topic="{topic}"' in line
               for line in text.splitlines())
