"""``gpu.state.v1`` records written field by field: the bytes ``gpuaware.contract.events.encode`` gives, at a third of
the CPU of the encoder this replaces (fastavro with the forecasts spliced in: ``python -m
gpuaware.bench.state_encoding``, 4.7-5.0 against 14.4-15.5 µs a state).

A worker encodes a state for nearly every sample it applies and refreshes every GPU's state every 30 s: at 50,000 GPUs
~5,700 states a second. Through ``encode`` (a dict built per state, then fastavro's schemaless writer walking the
schema) it was the largest single item of the main thread of a 50,000-GPU worker catching up (py-spy; the heartbeat's
refresh states are most of what such a worker publishes). An Avro record is its fields' encodings one after the other,
so most of a state is cheap to write directly: three doubles at a time with one ``struct`` call, a GPU's identity
(header, UUID, node, model) kept encoded per GPU, its forecasts kept encoded by the numbers they were rendered from
(``KeptForecasts``: new numbers once a minute, ``GpuTracker``), and the few strings of a small vocabulary (health
components, workload classes) kept encoded by value. The worker writes a state straight from its tracker's fields
(``encode_tracker``: ``GpuTracker.state_parts``, the forecasts as their packed numbers), without the ``GpuState``
and ``Forecast`` objects, which were most of a state's cost (``python -m gpuaware.bench.worker_cost``).

The layout is GpuState's newest schema (version 2). ``GpuStateCodec`` refuses to start if the record or its schema
changes (new fields, another version) until it is brought in line; tests/stream/test_state_codec.py checks its bytes
against ``encode`` for any state.
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuaware.contract.events import (
    _HEADER,
    MAGIC,
    Forecast,
    GpuState,
    HealthAction,
    HealthBand,
    HealthVerdict,
    encode_field,
    record_type,
)
from gpuaware.stream.forecast_many import check_packed, label_columns

if TYPE_CHECKING:
    from gpuaware.stream.gpu_state import GpuTracker

VERSION = 2
Encoded = tuple[bytes, bytes]  # a state's key and bytes (``encode_tracker``)
FIELDS = ("gpu_uuid", "node", "model", "sample_ts_ms", "published_ms", "util_gpu", "util_mem", "fb_used_mib",
          "fb_total_mib", "power_w", "temp_c", "health_score", "health_band", "health_components", "forecasts",
          "workload_class", "class_confidence", "samples", "verdict", "verdict_reasons", "recommended_action")
_fields = operator.attrgetter(*FIELDS)
_THREE_DOUBLES = struct.Struct("<ddd").pack
_DOUBLE = struct.Struct("<d").pack
# Small vocabularies only: a verdict's reasons carry figures, so they are encoded each time.
_VOCABULARY_MAX = 4096


class KeptForecasts(list):
    """A state's forecasts rendered from what their GPU keeps of them (``packed``: the same object until they change,
    gpuaware.stream.gpu_state): the codec encodes them again only when ``packed`` is another object, and keeps no
    ``Forecast`` records of its own. The records were ~1.3 KiB of every GPU a worker held (docs/stream.md, "Memory")."""

    __slots__ = ("packed",)

    def __init__(self, items: Iterable = (), packed: bytes = b""):  # dataclasses.asdict makes one from items alone
        super().__init__(items)
        self.packed = packed


def _long(n: int) -> bytes:
    """Avro's int and long: zigzag, then 7 bits a byte, low first."""
    if isinstance(n, str | bytes | bytearray):  # int() would parse it; fastavro refuses it
        raise ValueError(f"{n!r} is not an integer")
    n = int(n)  # as fastavro: a float truncated; and a numpy integer would wrap in the shifts
    if not -(1 << 63) <= n < (1 << 63):
        raise ValueError(f"{n} is out of Avro's long range")
    n = (n << 1) ^ (n >> 63)
    if n <= 0x7F:  # one byte (counts, lengths, small numbers): made once
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))


def _string(s: str) -> bytes:
    raw = s.encode()
    return _long(len(raw)) + raw


def _symbols(enum: type) -> dict[str, bytes]:
    """An enum's symbols as Avro writes them (their index), by value (a StrEnum member finds its own)."""
    schema = {f["name"]: f["type"] for f in record_type(GpuState).versions[VERSION]["fields"]}
    name = {HealthBand: "health_band", HealthVerdict: "verdict", HealthAction: "recommended_action"}[enum]
    return {symbol: _long(i) for i, symbol in enumerate(schema[name]["symbols"])}


class GpuStateCodec:
    """Encodes GPU states for one publisher (``StatePublisher``'s ``kept``): what it keeps per GPU is let go with
    ``forget``."""

    def __init__(self) -> None:
        rt = record_type(GpuState)
        fields = tuple(f.name for f in dataclasses.fields(GpuState))
        if rt.latest != VERSION or fields != FIELDS or tuple(
                f["name"] for f in rt.versions[VERSION]["fields"]) != FIELDS:
            raise RuntimeError(f"GpuState is version {rt.latest} with fields {fields}: gpuaware.stream.state_codec "
                               f"writes version {VERSION} with {FIELDS} and must be brought in line")
        self._header = _HEADER.pack(MAGIC, rt.schema_id, VERSION)
        self._band, self._verdict, self._action = _symbols(HealthBand), _symbols(HealthVerdict), _symbols(HealthAction)
        # key -> [uuid, node, model, fb_total_mib, the header and the first three fields, fb_total_mib, the forecasts
        # last encoded (a list, or a KeptForecasts' ``packed``), their bytes]: one list per GPU, where two dicts of
        # tuples took ~150 bytes more of each
        self._kept: dict[bytes, list] = {}
        self._words: dict[str, bytes] = {}  # health component names, workload classes and forecast metrics
        self._labels: dict[tuple[str, int], bytes] = {}  # a forecast's metric and horizon
        self._published: tuple[object, bytes] = (None, b"")  # the last publishing time and its bytes

    def _word(self, s: str) -> bytes:
        b = self._words.get(s)
        if b is None:
            b = _string(s)
            if len(self._words) < _VOCABULARY_MAX:
                self._words[s] = b
        return b

    def _forecasts(self, forecasts: list) -> bytes:
        """The forecasts field: an Avro array (one block: its count, the items, a zero count), each item a metric's
        string, its horizon's int and three doubles. Through fastavro (``encode_field``: a dict per forecast, then the
        schema walked) it was ~5 % of a 50,000-GPU worker's logic, made once a minute for every GPU."""
        if not forecasts:
            return b"\0"
        if not all(type(f) is Forecast for f in forecasts):  # (e.g. dicts, which fastavro writes too)
            return encode_field(GpuState, "forecasts", forecasts)
        parts = [_long(len(forecasts))]
        for f in forecasts:
            parts.append(self._label(f.metric, f.horizon_s))
            parts.append(_THREE_DOUBLES(f.mean, f.lower, f.upper))
        parts.append(b"\0")
        return b"".join(parts)

    def _label(self, metric: str, horizon_s: int) -> bytes:
        """A forecast's metric and horizon as written, kept by value."""
        label = self._labels.get((metric, horizon_s))
        if label is None:
            label = self._word(metric) + _long(horizon_s)
            if len(self._labels) < _VOCABULARY_MAX:
                self._labels[(metric, horizon_s)] = label
        return label

    def encode(self, s: GpuState, key: bytes) -> bytes:
        """``encode(s)``, the same bytes; ValueError where that raises for a field's value."""
        return self.encode_parts(_fields(s), key)

    def encode_parts(self, parts: tuple, key: bytes, labels: tuple[tuple[str, ...], tuple[int, ...]] | None = None
                     ) -> bytes:
        """A state's bytes from its fields in ``FIELDS`` order, as ``GpuTracker.state_parts`` gives them: the same
        bytes as ``encode`` of the record ``GpuTracker.state`` makes of them. With ``labels`` (the metrics and the
        horizons in seconds, ``label_columns``), the forecasts are the packed numbers, three doubles each;
        without, a list of ``Forecast``."""
        try:
            return self._encode(parts, key, labels)
        except (KeyError, TypeError, struct.error, AttributeError, UnicodeEncodeError) as exc:
            raise ValueError(f"cannot encode GpuState: {type(exc).__name__}: {exc}") from exc

    def encode_tracker(self, t: GpuTracker, now_ms: int) -> Encoded:
        """GPU ``t``'s state at ``now_ms`` as its key and bytes, written straight from the tracker: the bytes of
        ``encode(t.state(now_ms))``."""
        key = t.uuid.encode()
        return key, self.encode_parts(t.state_parts(now_ms), key, label_columns(t.settings.horizons_min))

    def _packed(self, packed: bytes, labels: tuple[tuple[str, ...], tuple[int, ...]]) -> bytes:
        """The forecasts field from their packed numbers: the doubles are already Avro's (little-endian)."""
        if not packed:  # (none yet)
            return b"\0"
        check_packed(packed, len(labels[0]))
        parts = [_long(len(labels[0]))]
        for i, (metric, horizon_s) in enumerate(zip(*labels, strict=True)):
            parts.append(self._label(metric, horizon_s))
            parts.append(packed[24 * i:24 * i + 24])
        parts.append(b"\0")
        return b"".join(parts)

    def _encode(self, parts: tuple, key: bytes, labels: tuple | None) -> bytes:
        (uuid, node, model, sample_ts_ms, published_ms, util_gpu, util_mem, fb_used_mib, fb_total_mib, power_w,
         temp_c, health_score, health_band, components, forecasts, workload_class, class_confidence, samples,
         verdict, reasons, action) = parts
        kept = self._kept.get(key)
        if kept is None or kept[0] != uuid or kept[1] != node or kept[2] != model or kept[3] != fb_total_mib:
            kept = self._kept[key] = [uuid, node, model, fb_total_mib, self._header + _string(uuid)
                                      + _string(node) + _string(model), _long(fb_total_mib), None, b""]
        # A KeptForecasts stands for its packed numbers, the same object until they change; one rebuilt from items
        # alone (``dataclasses.asdict``, ``GpuState(**...)``) has none and stands for itself.
        same = forecasts if labels is not None or type(forecasts) is not KeptForecasts or (
            forecasts and not forecasts.packed) else forecasts.packed
        if kept[6] is not same:
            kept[7] = self._forecasts(forecasts) if labels is None else self._packed(forecasts, labels)
            kept[6] = same
        if components:
            word, items = self._word, [_long(len(components))]
            for name, value in components.items():
                items.append(word(name))
                items.append(_DOUBLE(value))
            items.append(b"\0")
            encoded_components = b"".join(items)
        else:
            encoded_components = b"\0"
        encoded_reasons = (_long(len(reasons)) + b"".join(map(_string, reasons)) + b"\0") if reasons else b"\0"
        published = self._published
        if published[0] != published_ms or type(published_ms) is not int:  # (a take's states share their time)
            published = self._published = (published_ms, _long(published_ms))
        return b"".join((
            kept[4], _long(sample_ts_ms), published[1],
            _THREE_DOUBLES(util_gpu, util_mem, fb_used_mib), kept[5],
            _THREE_DOUBLES(power_w, temp_c, health_score), self._band[health_band], encoded_components,
            kept[7],
            b"\0" if workload_class is None else b"\2" + self._word(workload_class),
            b"\0" if class_confidence is None else b"\2" + _DOUBLE(class_confidence),
            _long(samples), self._verdict[verdict], encoded_reasons, self._action[action],
        ))

    def forget(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._kept.pop(key, None)
