"""The fleet load generator sends what agents send: records the contract codec decodes, keyed as agents key them."""

from __future__ import annotations

import pytest

from gpuaware.bench.fleet_load import GPUS_PER_NODE, TICKS_PER_S, Fleet, build_template, gpu_uuid, node_name
from gpuaware.contract import topics
from gpuaware.contract.events import GpuEvent, TelemetryBatch, decode, encode


@pytest.fixture(scope="module")
def template():
    return build_template(nodes=2, loop_s=30, warmup_s=5)


def test_template_cuts_the_codec_output_into_reusable_bytes(template):
    assert template.batches and all(b.samples + b.points > 0 and b.lead_ms > 0 for b in template.batches)
    assert {b.node for b in template.batches} == {0, 1}
    assert all(0 < len(g) <= GPUS_PER_NODE for g in template.gpus)


def test_records_decode_with_the_contract_codec_and_are_keyed_by_node(template):
    fleet = Fleet(template, gpus=48, prefix="fl")  # 6 nodes over 2 template nodes
    now_ms = 1_800_000_000_000
    seen: dict[str, list[TelemetryBatch]] = {}
    sent = 0
    for tick in range(template.loop_s * TICKS_PER_S):
        records, samples = fleet.records(tick, now_ms + tick * 100)
        sent += samples
        for topic, key, value in records:
            record = decode(value)
            if topic == topics.TELEMETRY:
                assert isinstance(record, TelemetryBatch)
                assert key == record.key() == record.node.encode()
                seen.setdefault(record.node, []).append(record)
                # Byte-identical to what the codec writes for the decoded batch.
                assert encode(record) == value
            else:
                assert isinstance(record, GpuEvent) and key == record.gpu_uuid.encode()
    assert sorted(seen) == [node_name("fl", i) for i in range(6)]
    assert sent == sum(len(b.samples) for bs in seen.values() for b in bs)
    for name, batches in seen.items():
        i = int(name.rsplit("-", 1)[1])
        for b in batches:
            assert [g.uuid for g in b.gpus] == [gpu_uuid("fl", i, g.index) for g in b.gpus]
            assert [g.model for g in b.gpus] == [template.gpus[i % template.nodes][g.index].model for g in b.gpus]
        assert [b.batch_seq for b in batches] == list(range(1, len(batches) + 1))
        for b in batches:
            # Samples end no later than the send time (the agent's batching window is in front of it).
            reads = [*b.samples, *b.points]  # full samples and light watch points
            assert max(b.base_ts_ms + r.dt_ms for r in reads) <= now_ms + template.loop_s * 1000
            assert all(0 <= r.gpu < GPUS_PER_NODE for r in reads)


def test_the_fleet_publishes_what_its_template_does_per_gpu(template):
    fleet = Fleet(template, gpus=16 * GPUS_PER_NODE, prefix="fl")
    samples = sum(fleet.records(t, 0)[1] for t in range(template.loop_s * TICKS_PER_S))
    assert samples == pytest.approx(template.samples_per_s_per_gpu() * template.loop_s * 16 * GPUS_PER_NODE, rel=0.35)


def test_shards_split_the_nodes():
    from gpuaware.bench.fleet_load import Template

    t = Template(nodes=1, loop_s=5, gpus=[{}], batches=[])
    parts = [Fleet(t, 80, "fl", k, 3).nodes for k in range(3)]
    assert sorted(n for part in parts for n in part) == list(range(10)) and all(parts)
