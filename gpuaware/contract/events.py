"""The wire contract: the records of every topic and their compact, versioned encoding.

A value on the wire is a 3-byte header followed by schemaless Avro:

    byte 0   MAGIC (0xA7): tells a gpuaware record from anything else
    byte 1   schema id: which record type (see ``RECORD_TYPES``)
    byte 2   schema version: which ``gpuaware/contract/schemas/<name>.v<N>.avsc`` wrote it

Evolution rule (checked by the tests): a new version may only append optional fields (with a
default) at the end of the top-level record, and enums carry a default symbol. That keeps both
directions working without a schema registry:

- a newer reader resolves an older record through Avro schema resolution (the writer schema is
  known from the header);
- an older reader reads a newer record with its own newest schema, which is a prefix of the
  writer's, and ignores the trailing bytes of the fields it does not know.

This module is pure (no Kafka, no Faust): agent, stream and scheduler all import it.

The record dataclasses, their schema ids and the codec are one module: they change together (a field added to a
record, its Avro schema and the evolution check in one review), and every component imports the contract from
here. How a record becomes the dicts fastavro writes, which knows no record, is ``gpuaware.contract.avro_dicts``.
"""

from __future__ import annotations

import enum
import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar

import fastavro

from gpuaware.contract import avro_dicts, topics

MAGIC = 0xA7
_HEADER = struct.Struct("!BBB")
HEADER_SIZE = _HEADER.size


class DecodeError(ValueError):
    """A value could not be decoded as a gpuaware record. The message says why."""


# --------------------------------------------------------------------------- enums


class EventKind(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    ANOMALY = "ANOMALY"
    HEALTH_CHANGE = "HEALTH_CHANGE"
    XID = "XID"
    ECC_SBE = "ECC_SBE"
    ECC_DBE = "ECC_DBE"
    THERMAL_THROTTLE_START = "THERMAL_THROTTLE_START"
    THERMAL_THROTTLE_STOP = "THERMAL_THROTTLE_STOP"
    POWER_THROTTLE_START = "POWER_THROTTLE_START"
    POWER_THROTTLE_STOP = "POWER_THROTTLE_STOP"
    SAMPLING_RATE_CHANGE = "SAMPLING_RATE_CHANGE"


class Severity(enum.StrEnum):
    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


class HealthBand(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"
    CRITICAL = "CRITICAL"


class HealthVerdict(enum.StrEnum):
    """NVIDIA Health Validation's grades, worst last but UNKNOWN (no data yet, or lost contact)."""

    UNKNOWN = "UNKNOWN"
    PASS = "PASS"
    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


class HealthAction(enum.StrEnum):
    """The recommended remediation, mildest first (docs/health.md)."""

    UNKNOWN = "UNKNOWN"
    NONE = "NONE"
    WATCH = "WATCH"
    DRAIN = "DRAIN"
    RESET_GPU = "RESET_GPU"
    REBOOT_NODE = "REBOOT_NODE"
    SERVICE_REQUEST = "SERVICE_REQUEST"


class DecisionAction(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    PLACE = "PLACE"
    UNSCHEDULABLE = "UNSCHEDULABLE"
    PREEMPT = "PREEMPT"
    MIGRATE = "MIGRATE"
    THROTTLE = "THROTTLE"
    DEFER = "DEFER"
    RESUME = "RESUME"
    CORDON = "CORDON"


class ControlKind(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    SAMPLING_POLICY = "SAMPLING_POLICY"
    POWER_CAP = "POWER_CAP"


# --------------------------------------------------------------------------- records
# Field names and order mirror the newest .avsc of each record (a test checks it).


@dataclass(slots=True)
class GpuInfo:
    uuid: str
    index: int
    model: str
    fb_total_mib: int


@dataclass(slots=True)
class GpuSample:
    gpu: int
    seq: int
    dt_ms: int
    util_gpu: int
    util_mem: int
    fb_used_mib: int
    power_dw: int
    temp_c: int
    sm_clock_mhz: int | None = None
    mem_temp_c: int | None = None
    ecc_sbe: int | None = None
    ecc_dbe: int | None = None
    throttle_reasons: int | None = None
    pcie_replays: int | None = None
    energy_mj: int | None = None
    sm_active_pm: int | None = None
    tensor_active_pm: int | None = None
    dram_active_pm: int | None = None


@dataclass(slots=True)
class WatchPoint:
    """v2: a cheap watch read published between full samples, because utilisation or power moved."""

    gpu: int
    dt_ms: int
    util_gpu: int
    power_dw: int


@dataclass(slots=True)
class TelemetryBatch:
    SCHEMA: ClassVar[str] = "telemetry_batch"
    node: str
    batch_seq: int
    base_ts_ms: int
    gpus: list[GpuInfo]
    samples: list[GpuSample]
    points: list[WatchPoint] = field(default_factory=list)

    def key(self) -> bytes:
        return self.node.encode()


@dataclass(slots=True)
class GpuEvent:
    SCHEMA: ClassVar[str] = "gpu_event"
    event_id: str
    ts_ms: int
    node: str
    gpu_uuid: str
    kind: EventKind
    severity: Severity
    metric: str | None = None
    value: float | None = None
    score: float | None = None
    message: str = ""
    attributes: dict[str, str] = field(default_factory=dict)

    def key(self) -> bytes:
        return self.gpu_uuid.encode()


@dataclass(slots=True)
class Forecast:
    metric: str
    horizon_s: int
    mean: float
    lower: float
    upper: float


@dataclass(slots=True)
class GpuState:
    SCHEMA: ClassVar[str] = "gpu_state"
    gpu_uuid: str
    node: str
    model: str
    sample_ts_ms: int
    published_ms: int
    util_gpu: float
    util_mem: float
    fb_used_mib: float
    fb_total_mib: int
    power_w: float
    temp_c: float
    health_score: float
    health_band: HealthBand
    health_components: dict[str, float] = field(default_factory=dict)
    forecasts: list[Forecast] = field(default_factory=list)
    workload_class: str | None = None
    class_confidence: float | None = None
    samples: int = 0
    # v2: the graded verdict the agent derived from the score and the XID/ECC rules (docs/health.md).
    verdict: HealthVerdict = HealthVerdict.UNKNOWN
    verdict_reasons: list[str] = field(default_factory=list)
    recommended_action: HealthAction = HealthAction.UNKNOWN

    def key(self) -> bytes:
        return self.gpu_uuid.encode()


@dataclass(slots=True)
class NodeGpu:
    uuid: str
    index: int
    model: str
    fb_total_mib: int
    nvlink_group: int
    health_band: HealthBand


@dataclass(slots=True)
class NodeState:
    SCHEMA: ClassVar[str] = "node_state"
    node: str
    ts_ms: int
    cpu_milli: int | None
    memory_mib: int | None
    gpus: list[NodeGpu]
    free_gpu_milli: int
    free_fb_mib: int

    def key(self) -> bytes:
        return self.node.encode()


@dataclass(slots=True)
class ModelDemand:
    model: str
    horizon_s: int
    demand_gpus: float
    lower: float
    upper: float
    capacity_gpus: float


@dataclass(slots=True)
class ClusterForecast:
    SCHEMA: ClassVar[str] = "cluster_forecast"
    cluster: str
    ts_ms: int
    models: list[ModelDemand]

    def key(self) -> bytes:
        return self.cluster.encode()


@dataclass(slots=True)
class GpuAssignment:
    gpu_uuid: str
    milli: int
    fb_mib: int


@dataclass(slots=True)
class SchedulerDecision:
    SCHEMA: ClassVar[str] = "scheduler_decision"
    decision_id: str
    ts_ms: int
    workload_id: str
    action: DecisionAction
    tenant: str | None = None
    priority: str | None = None
    node: str | None = None
    assignments: list[GpuAssignment] = field(default_factory=list)
    sharing: str | None = None
    reasons: list[str] = field(default_factory=list)
    score: float | None = None
    latency_us: int | None = None
    signals: list[str] = field(default_factory=list)  # stream signals read; added in place, default [] (old records)
    steered_by: list[str] = field(default_factory=list)  # the signals that changed the placement

    def key(self) -> bytes:
        return self.workload_id.encode()


@dataclass(slots=True)
class JobCompletion:
    """A job that ended successfully, on ``job.completions.v1``: what the stream's runtime forecaster learns."""

    SCHEMA: ClassVar[str] = "job_completion"
    workload_id: str
    ts_ms: int
    tenant: str
    runtime_s: float
    signature: list[str]  # contract.runtime.signature_keys, most specific first
    declared_s: float | None = None
    declared_keys: list[str] = field(default_factory=list)  # contract.runtime.declared_keys (with declared_s)

    def key(self) -> bytes:
        return self.workload_id.encode()


@dataclass(slots=True)
class JobRuntime:
    """One key's runtime statistics on ``job.runtime.v1`` (contract.runtime.KeyStats; ``#z90``: the p90's score)."""

    SCHEMA: ClassVar[str] = "job_runtime"
    signature_key: str
    ts_ms: int
    n: int
    mean: float
    m2: float
    through: int | None = None

    def key(self) -> bytes:
        return self.signature_key.encode()


@dataclass(slots=True)
class AgentControl:
    SCHEMA: ClassVar[str] = "agent_control"
    command_id: str
    ts_ms: int
    target: str
    kind: ControlKind
    sampling_policy_yaml: str | None = None
    gpu_uuid: str | None = None
    power_cap_w: int | None = None
    issued_by: str = ""

    def key(self) -> bytes:
        """The target; a power cap on one GPU is keyed by target and GPU, so that compaction keeps the
        newest cap of every GPU (and the node's sampling policy) rather than only the node's newest command."""
        if self.kind is ControlKind.POWER_CAP and self.gpu_uuid:
            return f"{self.target}/{self.gpu_uuid}".encode()
        return self.target.encode()


Record = (TelemetryBatch | GpuEvent | GpuState | NodeState | ClusterForecast | SchedulerDecision | AgentControl
          | JobCompletion | JobRuntime)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class RecordType:
    schema_id: int
    cls: type
    topic: str
    # version -> parsed schema; the highest version is what this code writes. None until first use,
    # so importing the contract reads no file.
    loaded_versions: dict[int, Any] | None = None

    @property
    def versions(self) -> dict[int, Any]:
        if self.loaded_versions is not None:
            return self.loaded_versions
        return _load_schema_versions(self.cls.SCHEMA)

    @property
    def latest(self) -> int:
        return max(self.versions)

    @property
    def name(self) -> str:
        return self.cls.SCHEMA


@cache
def _load_schema_versions(name: str) -> dict[int, Any]:
    found = {version: fastavro.parse_schema(raw, named_schemas={}) for version, raw in _raw_schemas(name).items()}
    if not found:
        raise RuntimeError(f"no schema files gpuaware/contract/schemas/{name}.v*.avsc")
    return found


@cache
def _raw_schemas(name: str) -> dict[int, Any]:
    found: dict[int, Any] = {}
    for entry in resources.files("gpuaware.contract").joinpath("schemas").iterdir():
        stem, _, ext = entry.name.rpartition(".")
        if ext != "avsc" or not stem.startswith(name + ".v"):
            continue
        found[int(stem[len(name) + 2 :])] = json.loads(entry.read_text())
    return found


def _raw_schema(name: str, version: int) -> Any:
    """A fresh copy (fastavro's parsing annotates what it is given)."""
    return json.loads(json.dumps(_raw_schemas(name)[version]))


# Ids are part of the wire format: never renumber, only add.
_TYPES_BY_ID: dict[int, tuple[type, str]] = {
    1: (TelemetryBatch, topics.TELEMETRY),
    2: (GpuEvent, topics.EVENTS),
    3: (GpuState, topics.GPU_STATE),
    4: (NodeState, topics.NODE_STATE),
    5: (ClusterForecast, topics.CLUSTER_FORECAST),
    6: (SchedulerDecision, topics.DECISIONS),
    7: (AgentControl, topics.CONTROL),
    8: (JobRuntime, topics.JOB_RUNTIME),
    9: (JobCompletion, topics.JOB_COMPLETIONS),
}

RECORD_TYPES: dict[int, RecordType] = {
    sid: RecordType(sid, cls, topic) for sid, (cls, topic) in _TYPES_BY_ID.items()
}
_BY_CLASS: dict[type, RecordType] = {rt.cls: rt for rt in RECORD_TYPES.values()}
TOPIC_RECORD: dict[str, RecordType] = {rt.topic: rt for rt in RECORD_TYPES.values()}


def record_type(cls_or_id: type | int) -> RecordType:
    if isinstance(cls_or_id, int):
        return RECORD_TYPES[cls_or_id]
    return _BY_CLASS[cls_or_id]


# --------------------------------------------------------------------------- codec


def encode(record: Record, *, version: int | None = None, spliced: Mapping[str, bytes] | None = None) -> bytes:
    """Encode a record with its newest schema (or an older ``version``, for compatibility tests).

    ``spliced``: fields given as their encoded bytes (``encode_field``'s), written as they are instead of the
    record's values of them. An Avro record is its fields' encodings one after the other, so the result is the same
    bytes; a caller that sends a slowly changing field many times encodes it once (a GPU state's forecasts, which
    change once a minute, were half of encoding a state: gpuaware.stream.publisher)."""
    rt = _BY_CLASS[type(record)]
    version = rt.latest if version is None else version
    buf = io.BytesIO()
    buf.write(_HEADER.pack(MAGIC, rt.schema_id, version))
    try:
        if spliced:
            for name, schema, plan in _segments(type(record), version, frozenset(spliced)):
                if schema is None:
                    buf.write(spliced[name])
                else:
                    fastavro.schemaless_writer(buf, schema, {n: getattr(record, n) if conv is None
                                                             else conv(getattr(record, n)) for n, conv in plan})
        else:
            fastavro.schemaless_writer(buf, rt.versions[version], avro_dicts.encoder(type(record))(record))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"cannot encode {type(record).__name__}: {exc}") from exc
    return buf.getvalue()


def encode_field(cls: type, name: str, value: Any, *, version: int | None = None) -> bytes:
    """``value`` of field ``name`` of record ``cls`` as its bytes in an encoded record (for ``encode``'s
    ``spliced``)."""
    rt = _BY_CLASS[cls]
    version = rt.latest if version is None else version
    ((_, schema, plan),) = _segments(cls, version, frozenset(), only=name)
    buf = io.BytesIO()
    conv = plan[0][1]
    try:
        fastavro.schemaless_writer(buf, schema, {name: value if conv is None else conv(value)})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"cannot encode {cls.__name__}.{name}: {exc}") from exc
    return buf.getvalue()


@cache
def _segments(cls: type, version: int, spliced: frozenset[str],
              only: str | None = None) -> list[tuple[str | None, Any, list[tuple[str, Any]]]]:
    """The record's fields as runs written by one fastavro call each (a sub-record of the run's fields: a record is
    its fields' encodings in order), split at the ``spliced`` fields: (field name, None, []) for a spliced field,
    (None, parsed schema, the run's (name, converter)) for a run. ``only``: the one run of that field alone."""
    rt = _BY_CLASS[cls]
    expanded = fastavro.parse_schema(_raw_schema(rt.name, version), expand=True)
    converters = dict(avro_dicts.field_plan(cls))
    unknown = (spliced | ({only} if only else set())) - {f["name"] for f in expanded["fields"]}
    if unknown:
        raise KeyError(f"{cls.__name__} v{version} has no field {sorted(unknown)}")
    out: list[tuple[str | None, Any, list[tuple[str, Any]]]] = []
    run: list[dict] = []

    def close() -> None:
        if run:
            schema = {"type": "record", "name": f"{expanded['name']}_part{len(out)}", "fields": list(run)}
            try:
                parsed = fastavro.parse_schema(schema, named_schemas={})
            except Exception as exc:  # e.g. a named type used twice in one run (expanded at each use)
                raise ValueError(f"{cls.__name__} v{version} cannot be split at {sorted(spliced)}: {exc}") from exc
            out.append((None, parsed, [(f["name"], converters[f["name"]]) for f in run]))
            run.clear()

    for f in expanded["fields"]:
        if only is not None:
            if f["name"] == only:
                run.append(f)
        elif f["name"] in spliced:
            close()
            out.append((f["name"], None, []))
        else:
            run.append(f)
    close()
    return out


def peek_header(data: bytes) -> tuple[int, int]:
    """(schema id, version) of an encoded value, or DecodeError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) < HEADER_SIZE:
        raise DecodeError(f"value is {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, schema_id, version = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise DecodeError(f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x}): not a gpuaware record")
    if schema_id not in RECORD_TYPES:
        raise DecodeError(f"unknown schema id {schema_id}")
    if version == 0:
        raise DecodeError("schema version 0 does not exist")
    return schema_id, version


def decode(data: bytes, expected: type | None = None) -> Record:
    """Decode one value. Any failure raises :class:`DecodeError` and nothing else."""
    schema_id, version = peek_header(data)
    rt = RECORD_TYPES[schema_id]
    if expected is not None and rt.cls is not expected:
        raise DecodeError(f"expected a {expected.__name__} record, got a {rt.cls.__name__} (schema id {schema_id})")
    reader = rt.versions[rt.latest]
    # Unknown newer version: read the prefix this code knows (see the evolution rule above).
    writer = rt.versions.get(version, reader)
    buf = io.BytesIO(memoryview(data)[HEADER_SIZE:])
    try:
        raw = fastavro.schemaless_reader(buf, writer, reader if writer is not reader else None)
    except Exception as exc:  # fastavro raises many types (EOFError, UnicodeDecodeError, IndexError, ...)
        raise DecodeError(f"{rt.cls.__name__} v{version}: corrupt Avro body: {type(exc).__name__}: {exc}") from exc
    if version <= rt.latest and buf.tell() != len(data) - HEADER_SIZE:
        raise DecodeError(
            f"{rt.cls.__name__} v{version}: {len(data) - HEADER_SIZE - buf.tell()} trailing bytes after the record"
        )
    try:
        return avro_dicts.decoder(rt.cls)(raw)
    except (ValueError, TypeError, KeyError) as exc:
        raise DecodeError(f"{rt.cls.__name__} v{version}: invalid field value: {exc}") from exc


def decode_for_topic(topic: str, data: bytes) -> Record:
    """Decode a value read from a contract topic, checking it is that topic's record type."""
    rt = TOPIC_RECORD.get(topic)
    if rt is None:
        raise DecodeError(f"topic {topic!r} carries no gpuaware record type")
    return decode(data, rt.cls)


# --------------------------------------------------------------------------- dead letters

DLQ_ERROR_HEADER = "gpuaware.dlq.error"
DLQ_SOURCE_HEADER = "gpuaware.dlq.source"


def dead_letter(
    topic: str, partition: int, offset: int, error: Exception | str, headers: list[tuple[str, bytes]] | None = None
) -> tuple[str, list[tuple[str, bytes]]]:
    """Where an undecodable record goes and the headers that say why; the value is kept verbatim."""
    why = str(error)[:2000].encode()
    source = f"{topic}/{partition}@{offset}".encode()
    return topics.dlq_name(topic), [*(headers or []), (DLQ_ERROR_HEADER, why), (DLQ_SOURCE_HEADER, source)]
