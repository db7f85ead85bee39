"""The spool's on-disk record format, and how a segment's bytes split into records.

Record layout: ``!I`` body length, ``!I`` crc32 of the body, then the body: topic (``!H`` + bytes),
key (``!I`` + bytes), value (``!I`` + bytes), headers (``!H`` count, each ``!H`` name + ``!I`` value).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

PREFIX = struct.Struct("!II")


class Position(NamedTuple):
    """Where a record ends: acknowledging it acknowledges everything before it."""

    segment: int
    offset: int


@dataclass(slots=True)
class SpoolRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    position: Position | None = field(default=None, compare=False)  # set by peek(), not stored

    def encode(self) -> bytes:
        parts = [struct.pack("!H", len(t := self.topic.encode())), t]
        key = self.key if self.key is not None else b""
        parts += [struct.pack("!I", len(key) if self.key is not None else 0xFFFFFFFF), key]
        parts += [struct.pack("!I", len(self.value)), self.value, struct.pack("!H", len(self.headers))]
        for name, value in self.headers:
            n = name.encode()
            parts += [struct.pack("!H", len(n)), n, struct.pack("!I", len(value)), value]
        body = b"".join(parts)
        return PREFIX.pack(len(body), zlib.crc32(body)) + body

    @classmethod
    def decode(cls, body: bytes) -> SpoolRecord:
        pos = 0

        def take(fmt: str) -> int:
            nonlocal pos
            (v,) = struct.unpack_from(fmt, body, pos)
            pos += struct.calcsize(fmt)
            return v

        def raw(n: int) -> bytes:
            nonlocal pos
            if pos + n > len(body):
                raise ValueError("field runs past the record")
            pos += n
            return body[pos - n : pos]

        topic = raw(take("!H")).decode()
        klen = take("!I")
        key = None if klen == 0xFFFFFFFF else raw(klen)
        value = raw(take("!I"))
        headers = [(raw(take("!H")).decode(), raw(take("!I"))) for _ in range(take("!H"))]
        return cls(topic, key, value, headers)


OK, BAD, REST = "ok", "bad", "rest"


def _intact_end(data: bytes, pos: int) -> int | None:
    if pos + PREFIX.size > len(data):
        return None
    length, crc = PREFIX.unpack_from(data, pos)
    end = pos + PREFIX.size + length
    if end > len(data) or zlib.crc32(memoryview(data)[pos + PREFIX.size : end]) != crc:
        return None
    return end


def frames(data: bytes) -> Iterator[tuple[int, int, str]]:
    """``(start, end, kind)`` of each record in ``data``: OK (CRC good), BAD (CRC wrong, but its
    length leads to a good record or to the end, so only it is skipped) or REST (the framing is
    lost: everything from here to the end, always the last frame)."""
    pos, n = 0, len(data)
    while pos < n:
        end = _intact_end(data, pos)
        if end is not None:
            yield pos, end, OK
            pos = end
            continue
        if pos + PREFIX.size <= n:
            end = pos + PREFIX.size + PREFIX.unpack_from(data, pos)[0]
            if end == n or (end < n and _intact_end(data, end) is not None):
                yield pos, end, BAD
                pos = end
                continue
        yield pos, n, REST
        return
