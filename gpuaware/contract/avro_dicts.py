"""Records (the contract's dataclasses) as the dicts fastavro writes and reads, and back.

Type hints are resolved once per record class into a converter per field (None: the value passes as it is):
walking the hints per value cost more than fastavro itself (a telemetry batch of 40 samples spent ~85 % of its
decode time in get_origin/is_dataclass calls)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any


def to_avro(value: Any) -> Any:
    """Any record value as Avro's dicts (the generic walk; records go through their compiled ``encoder``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encoder(type(value))(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [to_avro(v) for v in value]
    if isinstance(value, dict):
        return {k: to_avro(v) for k, v in value.items()}
    return value


@cache
def type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


PLAIN = (int, float, str, bytes, bool, type(None))


def field_encoder(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [field_encoder(a) for a in typing.get_args(tp) if a is not type(None)]
        if all(f is None for f in inner):
            return None
        return to_avro
    if origin is list:
        (item,) = typing.get_args(tp)
        sub = field_encoder(item)
        if sub is None:
            return list
        return lambda v: [sub(x) for x in v]
    if tp in PLAIN or (origin is dict and all(a in PLAIN for a in typing.get_args(tp))):
        return None
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        enc = encoder(tp)
        return lambda v: enc(v) if type(v) is tp else to_avro(v)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        # A state's band, verdict and action: the generic walk asked is_dataclass() of each first.
        # ``_value_``: what ``.value`` returns, without its descriptor call (a state has three).
        return lambda v: v._value_ if isinstance(v, enum.Enum) else v
    return to_avro  # anything else: the generic walk


@cache
def field_plan(cls: type) -> list[tuple[str, Any]]:
    """Each field of record ``cls`` with its converter to Avro's value (None: as it is)."""
    hints = type_hints(cls)
    return [(f.name, field_encoder(hints[f.name])) for f in dataclasses.fields(cls)]


@cache
def encoder(cls: type) -> Any:
    plan = field_plan(cls)

    def encode_record(value: Any) -> dict[str, Any]:
        return {name: getattr(value, name) if conv is None else conv(getattr(value, name)) for name, conv in plan}

    return encode_record


@cache
def decoder(tp: Any) -> Any:
    """A function from Avro's value to ``tp`` (None where the value is already one)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        sub = decoder(inner[0])
        return None if sub is None else (lambda v: None if v is None else sub(v))
    if origin is list:
        (item,) = typing.get_args(tp)
        sub = decoder(item)
        return list if sub is None else (lambda v: [None if x is None else sub(x) for x in v])
    if origin is dict:
        _, item = typing.get_args(tp)
        sub = decoder(item)
        return dict if sub is None else (lambda v: {k: None if x is None else sub(x) for k, x in v.items()})
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = type_hints(tp)
        plan = [(f.name, decoder(hints[f.name])) for f in dataclasses.fields(tp) if f.init]
        if all(conv is None for _, conv in plan):

            # Plain fields only (a telemetry sample): Avro's dict is the keyword arguments when its names
            # are the record's (TypeError otherwise); skipping the per-field copy halves a sample's conversion.
            def decode_plain(v: dict[str, Any]) -> Any:
                try:
                    return tp(**v)
                except TypeError:
                    return tp(**{name: v[name] for name, _ in plan})

            return decode_plain

        def decode_record(v: dict[str, Any]) -> Any:
            return tp(**{name: v[name] if conv is None or v[name] is None else conv(v[name]) for name, conv in plan})

        return decode_record
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    return None
