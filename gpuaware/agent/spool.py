"""A bounded, ordered, on-disk queue: everything the agent publishes goes through it first.

Records are appended to segment files and removed only once Kafka acknowledged them, so a broker
outage or an agent restart loses nothing.

The record format and the framing of a segment's bytes are in ``gpuaware.agent.spool_records``.

**Positions.** ``peek`` hands out each record with its position (segment id, offset of its end)
and ``ack(position)`` removes exactly the records up to it. Positions only grow: segment ids are
never reused and a segment is never rewritten in place. So an acknowledgement that arrives after
the bound dropped the batch's segment (it was in flight) removes nothing newer.

**Bound.** Past ``max_bytes`` the oldest whole segment is deleted and its records not yet
acknowledged are counted in ``dropped`` (some may have been in flight and still be delivered):
the only way a record pushed intact is lost.

**Durability.** ``push`` writes each record with one ``write`` before it returns, so a process
crash (SIGKILL, OOM kill) loses nothing that was pushed: the kernel holds it. Segments and the
head file are fsynced at most ``fsync_interval_s`` apart (default 1 s): on a push or ack once the
interval has passed, on ``sync()`` (the runtime calls it every interval, so an idle spool is
synced too) and on ``close()``; new and deleted segment files are made durable with the directory
at the same points. A power cut or kernel crash loses at most the records pushed in the last
interval, and may roll the head back by as much, so up to one interval of delivered records is
sent again (delivery is at-least-once; consumers deduplicate).

**A full or failing disk.** A write that fails (ENOSPC, EIO, a quota) never raises out of
``push`` and never leaves a torn record for a later one to follow: the segment is truncated back
to its last whole record, and if even that fails, the next record starts a new segment (a reader
cuts a torn tail off only the segment it ends). The failure is counted in ``write_errors`` and the
record is held in memory (``held``, oldest first, at most ``memory_max_bytes``: past it the oldest
held record is dropped and counted in ``dropped``). Held records are written to disk, in order and
before any newer one, at the next ``push``, ``ack`` or ``sync()`` that finds space again (the
runtime syncs every ``fsync_interval_s``); only then are they handed to ``peek``. A head file that
cannot be written stays dirty and is written at the next sync.

**Corruption.** Every record is CRC-checked when it is read (on open, ``peek`` and ``ack``);
nothing raises. A bad record whose length still leads to a good record (a flipped byte) is
skipped alone; where the framing is lost (a torn or cut-short write) the rest of the segment is
cut off (and a new segment started if it was the one being written). The bad bytes are copied to
``quarantine/`` (the newest ``QUARANTINE_FILES`` kept) and counted in ``corrupt``. A head file
that is empty, unreadable or points inside a record is logged and ignored: the spool starts from
the oldest segment (records sent again rather than lost).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuaware.agent.spool_records import BAD, OK, PREFIX, REST, Position, SpoolRecord, frames

__all__ = ["DiskSpool", "Position", "SpoolRecord"]

log = logging.getLogger(__name__)

QUARANTINE_FILES = 16


@dataclass
class _Segment:
    seg_id: int
    path: Path
    records: int  # good records in the file (known-bad ones excluded)
    size: int


class DiskSpool:
    def __init__(self, directory: str | Path, max_bytes: int = 256 * 2**20, segment_bytes: int = 4 * 2**20,
                 fsync_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 memory_max_bytes: int = 16 * 2**20):
        if max_bytes < 2 * segment_bytes:
            raise ValueError(f"max_bytes ({max_bytes}) must be at least two segments ({2 * segment_bytes})")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync_interval_s = fsync_interval_s
        self.clock = clock
        self.dropped = 0  # records deleted by the bound before they were acknowledged
        self.corrupt = 0  # torn or corrupt records skipped and quarantined
        self.write_errors = 0  # segment or head writes that failed (a full or failing disk)
        self.memory_max_bytes = memory_max_bytes
        self._held: deque[bytes] = deque()  # encoded records waiting for disk space, oldest first
        self._held_bytes = 0
        self._tail_torn = False  # the write segment may end in torn bytes: the next record starts a new one
        self.segments: list[_Segment] = []
        # The head is in segments[0]: bytes and good records of it already acknowledged.
        self.head_off = 0
        self.head_index = 0
        self._bad: set[tuple[int, int]] = set()  # (segment, offset) of bad records already counted
        self._dirty: set[Path] = set()
        self._dir_dirty = False
        self._head_dirty = False
        self._last_sync = clock()
        self._open()

    # ------------------------------------------------------------------ open / recover

    def _open(self) -> None:
        for path in sorted(self.dir.glob("*.seg")):
            try:
                seg_id = int(path.stem)
            except ValueError:
                log.warning("spool: ignoring %s (not a segment name)", path.name)
                continue
            self.segments.append(self._scan(seg_id, path))
        head = self._read_head()
        if head is not None and self.segments:
            seg_id, off = head
            for seg in [s for s in self.segments if s.seg_id < seg_id]:  # fully acknowledged
                self._remove(seg)
            if self.segments and self.segments[0].seg_id == seg_id:
                self._place_head(off)
        if not self.segments:
            self._new_segment(1)

    def _read_head(self) -> tuple[int, int] | None:
        path = self.dir / "head"
        if not path.exists():
            return None
        try:
            seg_id, off = (int(x) for x in path.read_bytes().decode("ascii").split())
            if seg_id < 0 or off < 0:
                raise ValueError("negative")
            return seg_id, off
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            log.warning("spool head file unreadable (%s): starting from the oldest segment; records already "
                        "delivered will be sent again", exc)
            return None

    def _place_head(self, off: int) -> None:
        seg = self.segments[0]
        if off >= seg.size:  # everything acknowledged (or the tail was lost after the head was synced)
            self.head_off, self.head_index = seg.size, seg.records
            return
        data = self._read(seg, 0, off)
        index = 0
        for start, end, kind in frames(data):
            if end > off or kind == REST:
                break
            if kind == OK and (seg.seg_id, start) not in self._bad:
                index += 1
            if end == off:
                self.head_off, self.head_index = off, index
                return
        if off:
            log.warning("spool head %d:%d is not on a record boundary: starting from the start of the segment",
                        seg.seg_id, off)

    def _scan(self, seg_id: int, path: Path) -> _Segment:
        """Count good records; quarantine bad ones; cut a torn tail."""
        data = path.read_bytes()
        records = 0
        for start, end, kind in frames(data):
            if kind == OK:
                records += 1
            elif kind == BAD:
                self._mark_bad(seg_id, start, data[start:end], counted=False)
            else:
                self._quarantine(seg_id, start, data[start:end])
                log.warning("spool %s: %d torn bytes at %d cut off", path.name, end - start, start)
                with open(path, "r+b") as f:
                    f.truncate(start)
                self._dirty.add(path)
                return _Segment(seg_id, path, records, start)
        return _Segment(seg_id, path, records, len(data))

    # ------------------------------------------------------------------ corruption

    def _quarantine(self, seg_id: int, offset: int, data: bytes) -> None:
        self.corrupt += 1
        qdir = self.dir / "quarantine"
        try:
            qdir.mkdir(exist_ok=True)
            (qdir / f"{seg_id:012d}-{offset}.bad").write_bytes(data)
            for old in sorted(qdir.iterdir(), key=lambda p: p.stat().st_mtime_ns)[:-QUARANTINE_FILES]:
                old.unlink()
        except OSError as exc:
            log.warning("spool: could not quarantine %d bad bytes: %s", len(data), exc)

    def _mark_bad(self, seg_id: int, offset: int, data: bytes, counted: bool) -> None:
        """A bad record found for the first time: quarantined, counted, and no longer a record."""
        self._bad.add((seg_id, offset))
        self._quarantine(seg_id, offset, data)
        log.warning("spool segment %d: corrupt record of %d bytes at %d skipped", seg_id, len(data), offset)
        if counted:
            seg = next(s for s in self.segments if s.seg_id == seg_id)
            seg.records = max(0, seg.records - 1)

    def _cut(self, index: int, at: int, rest: bytes, good_before: int) -> None:
        """The framing of segment ``index`` is lost from ``at``: cut it there (a new segment is begun
        if it was the write segment, so no offset is ever used twice)."""
        seg = self.segments[index]
        if rest:
            self._quarantine(seg.seg_id, at, rest)
        else:
            self.corrupt += 1  # the file was cut short under us: the bytes are gone
        log.warning("spool segment %d: unreadable from offset %d (%d bytes), cut off", seg.seg_id, at, seg.size - at)
        with contextlib.suppress(OSError), open(seg.path, "r+b") as f:
            f.truncate(at)
        seg.size, seg.records = at, good_before
        self._dirty.add(seg.path)
        if seg is self.segments[-1]:
            try:
                self._new_segment(seg.seg_id + 1)
            except OSError as exc:
                self._write_failed("a new segment", exc)
                self._tail_torn = True  # _append starts it once the disk allows

    # ------------------------------------------------------------------ segments

    def _new_segment(self, seg_id: int) -> None:
        path = self.dir / f"{seg_id:012d}.seg"
        path.touch()
        self.segments.append(_Segment(seg_id, path, 0, 0))
        self._dir_dirty = True
        if len(self.segments) == 1:
            self.head_off = self.head_index = 0

    def _remove(self, seg: _Segment) -> None:
        self.segments.remove(seg)
        self._bad = {b for b in self._bad if b[0] != seg.seg_id}
        self._dirty.discard(seg.path)
        with contextlib.suppress(FileNotFoundError):
            seg.path.unlink()
        self._dir_dirty = True

    def _pop_head(self) -> None:
        self._remove(self.segments[0])
        self.head_off = self.head_index = 0
        self._save_head()

    @staticmethod
    def _read(seg: _Segment, start: int, end: int) -> bytes:
        try:
            with open(seg.path, "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError:
            return b""

    # ------------------------------------------------------------------ queue

    @property
    def depth(self) -> int:
        return sum(s.records for s in self.segments) - self.head_index

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments) - self.head_off

    @property
    def held(self) -> int:
        """Records held in memory because the disk refused them (not yet visible to ``peek``)."""
        return len(self._held)

    def push(self, record: SpoolRecord) -> None:
        data = record.encode()
        self._drain_held()  # what waits in memory goes first: order is kept
        if self._held or not self._append(data):
            self._hold(data)
        self._enforce_bound()
        self._sync_if_due()

    def _append(self, data: bytes) -> bool:
        """Write one encoded record whole at the end of the write segment; False if the disk refused it."""
        tail = self.segments[-1]
        if self._tail_torn or (tail.size and tail.size + len(data) > self.segment_bytes):
            try:
                self._new_segment(tail.seg_id + 1)
            except OSError as exc:
                self._write_failed("a new segment", exc)
                return False
            self._tail_torn = False
            tail = self.segments[-1]
            if self.head_off >= self.segments[0].size:  # the head segment was fully acknowledged
                self._pop_head()
        try:
            # One os.write per record (looped only for a short write): no user-space buffer that
            # would write part of it later, after the failure was handled.
            fd = os.open(tail.path, os.O_WRONLY | os.O_APPEND)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as exc:
            self._write_failed(tail.path.name, exc)
            try:  # cut the torn bytes off, so the next whole record does not follow them
                os.truncate(tail.path, tail.size)
            except OSError:
                self._tail_torn = True
            return False
        self._dirty.add(tail.path)
        tail.records += 1
        tail.size += len(data)
        return True

    def _write_failed(self, what: str, exc: OSError) -> None:
        self.write_errors += 1
        # Once per outage at warning level: a full disk fails every write until it is freed.
        level = logging.DEBUG if self._held else logging.WARNING
        log.log(level, "spool: writing %s failed (%s): holding records in memory (at most %d bytes) until the "
                "disk takes them again", what, exc, self.memory_max_bytes)

    def _hold(self, data: bytes) -> None:
        self._held.append(data)
        self._held_bytes += len(data)
        while self._held_bytes > self.memory_max_bytes and len(self._held) > 1:
            self._held_bytes -= len(self._held.popleft())
            self.dropped += 1

    def _drain_held(self) -> None:
        """Write the records held in memory, oldest first, for as long as the disk takes them."""
        if not self._held:
            return
        n = len(self._held)
        while self._held and self._append(self._held[0]):
            self._held_bytes -= len(self._held.popleft())
        if not self._held:
            log.warning("spool: the disk takes writes again; %d records held in memory written", n)

    def _enforce_bound(self) -> None:
        while len(self.segments) > 1 and sum(s.size for s in self.segments) > self.max_bytes:
            lost = self.segments[0].records - self.head_index
            self.dropped += lost
            log.warning("spool full: dropped %d oldest records", lost)
            self._pop_head()

    def peek(self, limit: int) -> list[SpoolRecord]:
        """Up to ``limit`` good records from the head, in order, each with its ``position``.

        Bad records are skipped (counted and quarantined the first time); those at the very head
        are stepped over at once, so a spool holding only bad records comes back empty."""
        out: list[SpoolRecord] = []
        i = 0
        while i < len(self.segments) and len(out) < limit:
            seg = self.segments[i]
            start = self.head_off if i == 0 else 0
            data = self._read(seg, start, seg.size)
            good = self.head_index if i == 0 else 0  # good records before the current frame
            consumed = 0
            for off, end, kind in frames(data):
                if kind == REST:
                    self._cut(i, start + off, data[off:], good)
                    break
                consumed = end
                rec = None
                known_bad = (seg.seg_id, start + off) in self._bad
                if kind == OK and not known_bad:
                    try:
                        rec = SpoolRecord.decode(data[off + PREFIX.size : end])
                    except (ValueError, struct.error, UnicodeDecodeError):
                        self._mark_bad(seg.seg_id, start + off, data[off:end], counted=True)
                elif kind == BAD and not known_bad:
                    self._mark_bad(seg.seg_id, start + off, data[off:end], counted=True)
                if rec is None:
                    if not out and i == 0:
                        self.head_off = start + end  # nothing good before it: step over it now
                    continue
                good += 1
                rec.position = Position(seg.seg_id, start + end)
                out.append(rec)
                if len(out) >= limit:
                    break
            else:
                if start + consumed < seg.size:  # the file is shorter than what was written to it
                    self._cut(i, start + consumed, b"", good)
            i += 1
        while len(self.segments) > 1 and self.head_off >= self.segments[0].size:
            self._pop_head()
        return out

    def ack(self, upto: Position) -> None:
        """Remove every record up to ``upto`` (a position ``peek`` handed out): they were delivered."""
        while self.segments:
            seg = self.segments[0]
            if upto.segment < seg.seg_id:
                break  # already acknowledged, or its segment was dropped by the bound
            end = seg.size if upto.segment > seg.seg_id else min(upto.offset, seg.size)
            if end > self.head_off:
                data = self._read(seg, self.head_off, end)
                self.head_index += sum(1 for off, _, kind in frames(data)
                                       if kind == OK and (seg.seg_id, self.head_off + off) not in self._bad)
                self.head_off = end
            if self.head_off < seg.size or len(self.segments) == 1:
                break
            self._pop_head()
        self._save_head()
        self._drain_held()  # acknowledging may have freed space
        self._sync_if_due()

    # ------------------------------------------------------------------ durability

    def _save_head(self) -> None:
        # Atomic (rename), not durable until the next sync(): a process crash keeps it.
        self._head_dirty = True
        tmp = self.dir / "head.tmp"
        try:
            tmp.write_text(f"{self.segments[0].seg_id} {self.head_off}")
            os.replace(tmp, self.dir / "head")
        except OSError as exc:  # a full disk: the head in memory is right; sync() writes it once it can
            self._write_failed("the head", exc)

    def _sync_if_due(self) -> None:
        if self.clock() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self) -> None:
        """Make what was pushed and acknowledged so far survive a power cut (and write what the
        disk refused before, if it takes it now)."""
        self._last_sync = self.clock()
        self._drain_held()
        try:
            for path in list(self._dirty):
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            self._dirty.clear()
            if self._head_dirty:
                tmp = self.dir / "head.tmp"
                with open(tmp, "w") as f:
                    f.write(f"{self.segments[0].seg_id} {self.head_off}")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.dir / "head")
                self._head_dirty = False
                self._dir_dirty = True
            if self._dir_dirty:
                fd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._dir_dirty = False
        except OSError as exc:  # a full or failing disk: keep running on the page cache, say so
            self.write_errors += 1
            log.warning("spool fsync failed: %s", exc)

    def close(self) -> None:
        self.sync()
