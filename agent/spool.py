"""A bounded, ordered, on-disk queue: everything the agent publishes goes through it first.

Records are appended to segment files and removed only once Kafka acknowledged them, so a broker
outage or an agent restart loses nothing. Past ``max_bytes`` the oldest whole segment is dropped
and its unsent records are counted in ``dropped``: the only way a record is ever lost.

Record layout: ``!I`` body length, ``!I`` crc32 of the body, then the body: topic (``!H`` + bytes),
key (``!I`` + bytes), value (``!I`` + bytes), headers (``!H`` count, each ``!H`` name + ``!I`` value).
A torn write at the tail (crash mid-append) is detected by the length/crc and truncated on open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_PREFIX = struct.Struct("!II")


@dataclass(slots=True)
class SpoolRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)

    def encode(self) -> bytes:
        parts = [struct.pack("!H", len(t := self.topic.encode())), t]
        key = self.key if self.key is not None else b""
        parts += [struct.pack("!I", len(key) if self.key is not None else 0xFFFFFFFF), key]
        parts += [struct.pack("!I", len(self.value)), self.value, struct.pack("!H", len(self.headers))]
        for name, value in self.headers:
            n = name.encode()
            parts += [struct.pack("!H", len(n)), n, struct.pack("!I", len(value)), value]
        body = b"".join(parts)
        return _PREFIX.pack(len(body), zlib.crc32(body)) + body

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
            pos += n
            return body[pos - n : pos]

        topic = raw(take("!H")).decode()
        klen = take("!I")
        key = None if klen == 0xFFFFFFFF else raw(klen)
        value = raw(take("!I"))
        headers = [(raw(take("!H")).decode(), raw(take("!I"))) for _ in range(take("!H"))]
        return cls(topic, key, value, headers)


@dataclass
class _Segment:
    seg_id: int
    path: Path
    records: int
    size: int


class DiskSpool:
    def __init__(self, directory: str | Path, max_bytes: int = 256 * 2**20, segment_bytes: int = 4 * 2**20):
        if max_bytes < 2 * segment_bytes:
            raise ValueError(f"max_bytes ({max_bytes}) must be at least two segments ({2 * segment_bytes})")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped = 0
        self.segments: list[_Segment] = []
        self.head_seg = 0
        self.head_off = 0
        self.head_index = 0  # records of the head segment already acknowledged
        self._open()

    # ------------------------------------------------------------------ open / recover

    def _open(self) -> None:
        for path in sorted(self.dir.glob("*.seg")):
            records, size = self._scan(path)
            self.segments.append(_Segment(int(path.stem), path, records, size))
        head = self.dir / "head"
        if head.exists() and self.segments:
            seg_id, off = (int(x) for x in head.read_text().split())
            self.segments = [s for s in self.segments if s.seg_id >= seg_id]
            for path in self.dir.glob("*.seg"):
                if int(path.stem) < seg_id:
                    path.unlink()
            if self.segments and self.segments[0].seg_id == seg_id:
                self.head_seg, self.head_off = seg_id, off
                self.head_index = self._count_until(self.segments[0].path, off)
        if not self.segments:
            self._new_segment(1)
        elif self.head_seg != self.segments[0].seg_id:
            self.head_seg, self.head_off, self.head_index = self.segments[0].seg_id, 0, 0

    @staticmethod
    def _scan(path: Path) -> tuple[int, int]:
        """Count whole records; truncate a torn tail."""
        records, good = 0, 0
        data = path.read_bytes()
        while good + _PREFIX.size <= len(data):
            length, crc = _PREFIX.unpack_from(data, good)
            end = good + _PREFIX.size + length
            if end > len(data) or zlib.crc32(data[good + _PREFIX.size : end]) != crc:
                break
            records, good = records + 1, end
        if good != len(data):
            log.warning("spool %s: truncating %d torn bytes", path.name, len(data) - good)
            with open(path, "r+b") as f:
                f.truncate(good)
        return records, good

    @staticmethod
    def _count_until(path: Path, offset: int) -> int:
        data = path.read_bytes()[:offset]
        n, pos = 0, 0
        while pos + _PREFIX.size <= len(data):
            length, _ = _PREFIX.unpack_from(data, pos)
            pos += _PREFIX.size + length
            n += 1
        return n

    def _new_segment(self, seg_id: int) -> None:
        path = self.dir / f"{seg_id:012d}.seg"
        path.touch()
        self.segments.append(_Segment(seg_id, path, 0, 0))
        if len(self.segments) == 1:
            self.head_seg, self.head_off, self.head_index = seg_id, 0, 0

    # ------------------------------------------------------------------ queue

    @property
    def depth(self) -> int:
        return sum(s.records for s in self.segments) - self.head_index

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments) - self.head_off

    def push(self, record: SpoolRecord) -> None:
        data = record.encode()
        tail = self.segments[-1]
        if tail.size and tail.size + len(data) > self.segment_bytes:
            self._new_segment(tail.seg_id + 1)
            tail = self.segments[-1]
        with open(tail.path, "ab") as f:
            f.write(data)
        tail.records += 1
        tail.size += len(data)
        self._enforce_bound()

    def _enforce_bound(self) -> None:
        while len(self.segments) > 1 and sum(s.size for s in self.segments) > self.max_bytes:
            oldest = self.segments.pop(0)
            lost = oldest.records - (self.head_index if oldest.seg_id == self.head_seg else 0)
            self.dropped += lost
            log.warning("spool full: dropped %d oldest records", lost)
            with contextlib.suppress(FileNotFoundError):
                oldest.path.unlink()
            self.head_seg, self.head_off, self.head_index = self.segments[0].seg_id, 0, 0
            self._save_head()

    def peek(self, limit: int) -> list[SpoolRecord]:
        """Up to ``limit`` records from the head, in order, without removing them."""
        out: list[SpoolRecord] = []
        offset = self.head_off
        for seg in self.segments:
            if seg.seg_id < self.head_seg:
                continue
            with open(seg.path, "rb") as f:
                f.seek(offset if seg.seg_id == self.head_seg else 0)
                data = f.read(seg.size)
            pos = 0
            while pos + _PREFIX.size <= len(data) and len(out) < limit:
                length, _ = _PREFIX.unpack_from(data, pos)
                body = data[pos + _PREFIX.size : pos + _PREFIX.size + length]
                out.append(SpoolRecord.decode(body))
                pos += _PREFIX.size + length
            if len(out) >= limit:
                break
            offset = 0
        return out

    def ack(self, count: int) -> None:
        """Remove ``count`` records from the head (they were delivered)."""
        while count > 0 and self.segments:
            seg = self.segments[0]
            available = seg.records - self.head_index
            if count < available:
                with open(seg.path, "rb") as f:
                    f.seek(self.head_off)
                    data = f.read(seg.size - self.head_off)
                pos = 0
                for _ in range(count):
                    length, _ = _PREFIX.unpack_from(data, pos)
                    pos += _PREFIX.size + length
                self.head_off += pos
                self.head_index += count
                count = 0
            else:
                count -= available
                if len(self.segments) == 1:
                    # The write segment is fully sent: empty it in place.
                    seg.path.write_bytes(b"")
                    seg.records = seg.size = 0
                    self.head_off = self.head_index = 0
                else:
                    self.segments.pop(0)
                    with contextlib.suppress(FileNotFoundError):
                        seg.path.unlink()
                    self.head_seg, self.head_off, self.head_index = self.segments[0].seg_id, 0, 0
        self._save_head()

    def _save_head(self) -> None:
        tmp = self.dir / "head.tmp"
        tmp.write_text(f"{self.head_seg} {self.head_off}")
        os.replace(tmp, self.dir / "head")
