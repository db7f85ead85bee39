"""The wire contract: round trips, schema evolution, and clear errors on garbage."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import struct
from importlib import resources

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuaware.contract import avro_dicts, events, topics
from gpuaware.contract.events import (
    AgentControl,
    ClusterForecast,
    ControlKind,
    DecisionAction,
    DecodeError,
    EventKind,
    Forecast,
    GpuAssignment,
    GpuEvent,
    GpuInfo,
    GpuSample,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    ModelDemand,
    NodeGpu,
    NodeState,
    SchedulerDecision,
    Severity,
    TelemetryBatch,
)

UUID = "GPU-0b9e6f3a-55a1-4c7e-9d2f-3f1c2a7b8e90"


def batch(n_gpus: int = 8, per_gpu: int = 5) -> TelemetryBatch:
    gpus = [GpuInfo(f"GPU-{i:08d}-0000-0000-0000-000000000000", i, "H100", 81559) for i in range(n_gpus)]
    samples = [
        GpuSample(g, s, s * 1000, 40 + g, 10, 30000 + s, 3500, 61, sm_clock_mhz=1980, ecc_sbe=0, ecc_dbe=0,
                  throttle_reasons=0, sm_active_pm=512)
        for s in range(per_gpu) for g in range(n_gpus)
    ]
    return TelemetryBatch("node-a", 7, 1_760_000_000_000, gpus, samples)


EXAMPLES = [
    batch(),
    GpuEvent("e-1", 1_760_000_000_123, "node-a", UUID, EventKind.XID, Severity.CRITICAL, metric="xid", value=79.0,
             message="GPU fell off the bus", attributes={"pid": "4242"}),
    GpuState(UUID, "node-a", "H100", 1, 2, 55.5, 20.0, 30000.0, 81559, 410.0, 66.0, 87.5, HealthBand.HEALTHY,
             {"ecc": 100.0, "thermal": 75.0}, [Forecast("util_gpu", 300, 60.0, 40.0, 80.0)], "training-compute",
             0.9, 1234, HealthVerdict.WARNING, ["XID 63 on this GPU: row remap pending"], HealthAction.DRAIN),
    NodeState("node-a", 3, 96000, 1_048_576, [NodeGpu(UUID, 0, "H100", 81559, 0, HealthBand.DEGRADED)], 500, 40000),
    ClusterForecast("local", 4, [ModelDemand("H100", 900, 12.5, 10.0, 15.0, 16.0)]),
    SchedulerDecision("d-1", 5, "ns/pod-1", DecisionAction.PLACE, tenant="team-a", priority="high", node="node-a",
                      assignments=[GpuAssignment(UUID, 500, 20000)], sharing="mps", reasons=["fgd score 0.12"],
                      score=0.12, latency_us=840),
    AgentControl("c-1", 6, "*", ControlKind.POWER_CAP, gpu_uuid=UUID, power_cap_w=350, issued_by="scheduler"),
    events.JobCompletion("ns/pod-2", 7, "team-a", 1800.5, ["owner:team-a/train", "*"], 3600.0,
                         ["declared:team-a/train", "declared:team-a"]),
    events.JobRuntime("owner:team-a/train", 8, 3, 7.5, 0.25),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_type_round_trips(record):
    data = events.encode(record)
    assert data[0] == events.MAGIC
    assert events.decode(data) == record
    rt = events.record_type(type(record))
    assert events.decode_for_topic(rt.topic, data) == record


def test_every_record_type_has_an_example_and_a_topic():
    assert {type(r) for r in EXAMPLES} == {rt.cls for rt in events.RECORD_TYPES.values()}
    contract = {t.name for t in topics.CONTRACT_TOPICS}
    assert {rt.topic for rt in events.RECORD_TYPES.values()} == contract


def test_dataclass_fields_mirror_the_newest_schema():
    for rt in events.RECORD_TYPES.values():
        schema = rt.versions[rt.latest]
        assert [f["name"] for f in schema["fields"]] == [f.name for f in dataclasses.fields(rt.cls)], rt.name


def _schema_files() -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for entry in resources.files("gpuaware.contract").joinpath("schemas").iterdir():
        if entry.name.endswith(".avsc"):
            name, version = entry.name[: -len(".avsc")].rsplit(".v", 1)
            out.setdefault(name, {})[int(version)] = json.loads(entry.read_text())
    return out


def test_schema_versions_only_append_optional_fields():
    """The evolution rule that lets an old reader read a newer record (see gpuaware/contract/events.py)."""
    for name, versions in _schema_files().items():
        ordered = [versions[v] for v in sorted(versions)]
        assert sorted(versions) == list(range(1, len(versions) + 1)), f"{name}: versions must be 1..N"
        for old, new in itertools.pairwise(ordered):
            old_fields, new_fields = old["fields"], new["fields"]
            assert new_fields[: len(old_fields)] == old_fields, f"{name}: a new version may not change old fields"
            for added in new_fields[len(old_fields):]:
                assert "default" in added, f"{name}.{added['name']}: an added field needs a default"


def test_enums_have_a_default_symbol_for_forward_compatibility():
    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "enum":
                yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    enums = [e for versions in _schema_files().values() for s in versions.values() for e in walk(s)]
    assert enums
    for enum in enums:
        assert enum.get("default") in enum["symbols"], enum["name"]


def _v2_of(schema_name: str, extra_field: dict) -> dict:
    v1 = _schema_files()[schema_name][1]
    return {**v1, "fields": [*v1["fields"], extra_field]}


def test_old_reader_reads_a_newer_record_with_an_added_optional_field():
    record = EXAMPLES[1]  # a GpuEvent
    v2 = fastavro.parse_schema(_v2_of("gpu_event", {"name": "cgroup", "type": ["null", "string"], "default": None}),
                               named_schemas={})
    body = io.BytesIO()
    fastavro.schemaless_writer(body, v2, {**avro_dicts.to_avro(record), "cgroup": "/kubepods/pod-1"})
    newer = struct.pack("!BBB", events.MAGIC, 2, 2) + body.getvalue()
    # This code knows only v1 of GpuEvent: it must still read the v2 record.
    assert events.record_type(GpuEvent).latest == 1
    assert events.decode(newer) == record


def test_new_reader_reads_an_older_record(monkeypatch):
    record = EXAMPLES[1]
    old_bytes = events.encode(record)  # written as v1
    rt = events.record_type(GpuEvent)
    v2 = fastavro.parse_schema(_v2_of("gpu_event", {"name": "cgroup", "type": "string", "default": "none"}),
                               named_schemas={})
    newer_rt = dataclasses.replace(rt, loaded_versions={1: rt.versions[1], 2: v2})
    monkeypatch.setitem(events.RECORD_TYPES, 2, newer_rt)
    assert events.decode(old_bytes) == record


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "shorter than the 3-byte header"),
        (b"{\"json\": true}", "bad magic byte"),
        (bytes([events.MAGIC, 99, 1]), "unknown schema id 99"),
        (bytes([events.MAGIC, 2, 0]), "version 0"),
        (bytes([events.MAGIC, 2, 1]) + b"\xff\xff\xff", "corrupt Avro body"),
        (events.encode(EXAMPLES[1]) + b"junk", "trailing bytes"),
        (events.encode(EXAMPLES[1])[:-4], "corrupt Avro body"),
    ],
)
def test_garbage_gives_one_clear_error(data, reason):
    with pytest.raises(DecodeError, match=reason):
        events.decode(data)


def test_record_on_the_wrong_topic_is_rejected():
    with pytest.raises(DecodeError, match="expected a GpuState record, got a GpuEvent"):
        events.decode_for_topic(topics.GPU_STATE, events.encode(EXAMPLES[1]))
    with pytest.raises(DecodeError, match="carries no gpuaware record type"):
        events.decode_for_topic("some.other.topic", events.encode(EXAMPLES[1]))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_decode_error(data):
    with contextlib.suppress(DecodeError):
        decoded = events.decode(data)
        # Whatever decodes is a well-formed record: it encodes again.
        assert isinstance(decoded, events.Record)
        events.encode(decoded)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(sorted(events.RECORD_TYPES)), st.integers(1, 255),
       st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode)))
def test_any_body_behind_a_valid_header_decodes_or_raises_decode_error(schema_id, version, body):
    """Past the header check: every record type, every version (known or newer), any bytes or unicode."""
    data = bytes([events.MAGIC, schema_id, version]) + body
    with contextlib.suppress(DecodeError):
        events.encode(events.decode(data))
    for topic in events.TOPIC_RECORD:  # control records included: the agent's take_control relies on this
        with contextlib.suppress(DecodeError):
            events.decode_for_topic(topic, data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_corrupted_valid_records_decode_or_raise_decode_error(record, data):
    encoded = bytearray(events.encode(record))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(encoded) - 1))
        encoded[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        decoded = events.decode(bytes(encoded))
        assert isinstance(decoded, events.Record)
        events.encode(decoded)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 100), st.integers(0, 2**20), st.integers(0, 10_000),
                  st.integers(-40, 130), st.one_of(st.none(), st.integers(0, 2**40))),
        min_size=1, max_size=50,
    )
)
def test_telemetry_batches_round_trip(values):
    samples = [GpuSample(0, i, i * 500, u, m, fb, p, t, ecc_sbe=e) for i, (u, m, fb, p, t, e) in enumerate(values)]
    record = TelemetryBatch("n", 1, 1_760_000_000_000, [GpuInfo(UUID, 0, "A100", 40960)], samples)
    assert events.decode(events.encode(record)) == record


def test_samples_are_compact():
    """A quantized sample costs about 20 bytes of Avro before the producer compresses the batch."""
    b = batch(n_gpus=8, per_gpu=10)
    per_sample = len(events.encode(b)) / len(b.samples)
    assert per_sample < 40, per_sample


def test_encoding_a_bad_record_fails_clearly():
    bad = GpuEvent("e", 1, "n", UUID, EventKind.XID, Severity.INFO, value="not a number")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot encode GpuEvent"):
        events.encode(bad)


def test_dead_letter_keeps_the_reason_and_the_source():
    dlq, headers = events.dead_letter(topics.TELEMETRY, 3, 42, DecodeError("bad magic byte"), [("traceparent", b"x")])
    assert dlq == "gpu.telemetry.v1.dlq"
    assert dict(headers) == {"traceparent": b"x", events.DLQ_ERROR_HEADER: b"bad magic byte",
                             events.DLQ_SOURCE_HEADER: b"gpu.telemetry.v1/3@42"}


def test_the_contract_imports_without_faust():
    import subprocess
    import sys

    code = ("import sys, gpuaware.contract.events, gpuaware.contract.topics, gpuaware.plumbing.kafka_settings, "
            "gpuaware.plumbing.kafka_admin, gpuaware.plumbing.observability; sys.exit('faust' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_v1_gpu_state_decodes_with_an_unknown_verdict():
    """gpu.state.v1 records written before the verdict fields (v1) still decode, with their defaults."""
    old = dataclasses.replace(EXAMPLES[2], verdict=HealthVerdict.UNKNOWN, verdict_reasons=[],
                              recommended_action=HealthAction.UNKNOWN)
    decoded = events.decode(events.encode(EXAMPLES[2], version=1))
    assert decoded == old
    assert events.decode(events.encode(EXAMPLES[2])) == EXAMPLES[2]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda r: type(r).__name__)
def test_fields_spliced_as_their_own_bytes_give_the_same_record(record):
    """Any field (or set of them) given to ``encode`` as ``encode_field``'s bytes: the same bytes as encoding the
    record whole, in every version of its schema; a field the record does not have is a clear error."""
    rt = events.record_type(type(record))
    for version in rt.versions:
        whole = events.encode(record, version=version)
        names = [f["name"] for f in rt.versions[version]["fields"]]
        for spliced in [[n] for n in names] + [names[::2], names]:
            parts = {n: events.encode_field(type(record), n, getattr(record, n), version=version) for n in spliced}
            assert events.encode(record, version=version, spliced=parts) == whole, (version, spliced)
    with pytest.raises(ValueError, match="no field"):
        events.encode(record, spliced={"no_such_field": b""})
