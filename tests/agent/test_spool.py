"""The disk spool: order kept across restarts, oldest dropped past its bound; against torn, truncated and corrupt
files; its fsync cadence."""

from __future__ import annotations

import logging
import os

import pytest

from gpuaware.agent import spool as spool_module
from gpuaware.agent.spool import DiskSpool, SpoolRecord
from tests.agent.conftest import fill


def _fill(spool: DiskSpool, n: int, start: int = 0, size: int = 60) -> None:
    for i in range(start, start + n):
        spool.push(SpoolRecord("t", f"k{i}".encode(), f"v{i}-".encode().ljust(size, b"x")))


def _keys(records) -> list[int]:
    return [int(r.key[1:]) for r in records]


def _segments(path) -> list:
    return sorted(path.glob("*.seg"))


def test_a_segment_truncated_mid_record_loses_only_that_record(tmp_path, caplog):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 40)
    first = _segments(tmp_path)[0]
    data = first.read_bytes()
    os.truncate(first, len(data) - 10)  # the segment's last record is now torn, newer segments follow
    with caplog.at_level(logging.WARNING):
        again = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    kept = _keys(again.peek(100))
    assert again.corrupt == 1 and len(kept) == 39 and again.depth == 39
    assert kept == sorted(kept) and kept[-1] == 39
    assert any("torn" in r.message or "corrupt" in r.message for r in caplog.records)


def test_a_flipped_byte_mid_segment_skips_that_record_only(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 10)
    seg = _segments(tmp_path)[0]
    data = bytearray(seg.read_bytes())
    data[3 * (len(data) // 10) + 20] ^= 0xFF  # inside the body of the fourth record
    seg.write_bytes(bytes(data))
    again = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert _keys(again.peek(100)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert again.corrupt == 1 and again.depth == 9
    assert list((tmp_path / "quarantine").iterdir())  # the bad bytes are kept for a look


def test_peek_checks_crcs_on_a_live_spool_and_skips_what_went_bad(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 10)
    seg = _segments(tmp_path)[0]
    data = bytearray(seg.read_bytes())
    data[5 * (len(data) // 10) + 30] ^= 0x01  # under the running spool's feet
    seg.write_bytes(bytes(data))
    batch = spool.peek(100)  # never raises
    assert _keys(batch) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert spool.corrupt == 1 and spool.depth == 9
    assert batch[0].value.startswith(b"v0-") and batch[-1].value.startswith(b"v9-")
    spool.ack(batch[-1].position)
    assert spool.depth == 0 and spool.peek(10) == []
    _fill(spool, 3, start=10)
    assert _keys(spool.peek(10)) == [10, 11, 12]


def test_a_live_segment_cut_short_is_read_up_to_the_cut(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 10)
    seg = _segments(tmp_path)[0]
    rec = seg.stat().st_size // 10
    os.truncate(seg, 7 * rec + 20)  # two and a half records gone
    assert _keys(spool.peek(100)) == [0, 1, 2, 3, 4, 5, 6]
    assert spool.depth == 7 and spool.corrupt >= 1
    _fill(spool, 2, start=10)  # appends after the cut are readable
    assert _keys(spool.peek(100)) == [0, 1, 2, 3, 4, 5, 6, 10, 11]


@pytest.mark.parametrize("head", [b"", b"garbage", b"1", b"\x00\xff 12"], ids=["empty", "text", "short", "binary"])
def test_a_zero_length_or_garbage_head_starts_from_the_oldest_segment(tmp_path, caplog, head):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 30)
    (tmp_path / "head").write_bytes(head)
    with caplog.at_level(logging.WARNING):
        again = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert _keys(again.peek(100)) == list(range(30))
    assert any("head" in r.message for r in caplog.records)


def test_a_head_offset_off_a_record_boundary_resends_rather_than_loses(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 10)
    seg_id = int(_segments(tmp_path)[0].stem)
    (tmp_path / "head").write_text(f"{seg_id} 7")
    assert _keys(DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024).peek(100)) == list(range(10))


def test_ack_removes_exactly_what_was_peeked_even_after_the_bound_dropped_the_head(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=4096, segment_bytes=1024)
    _fill(spool, 10)
    in_flight = spool.peek(5)  # being sent...
    _fill(spool, 80, start=10)  # ...while the sampling loop keeps pushing past the bound
    assert spool.dropped > 0
    spool.ack(in_flight[-1].position)  # acknowledged after the head segment was dropped
    kept = _keys(spool.peek(1000))
    assert kept == list(range(90 - len(kept), 90))  # nothing newer than the dropped ones went missing
    assert len(kept) + spool.dropped == 90 and spool.depth == len(kept)


def test_positions_never_repeat_once_the_write_segment_is_emptied(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    _fill(spool, 3)
    old = spool.peek(10)
    spool.ack(old[-1].position)
    _fill(spool, 3, start=3)
    spool.ack(old[-1].position)  # a stale acknowledgement removes nothing new
    assert _keys(spool.peek(10)) == [3, 4, 5]


def test_segments_and_head_are_fsynced_at_the_documented_cadence(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(spool_module.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                             real_fsync(fd)))
    now = [100.0]
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024, fsync_interval_s=1.0, clock=lambda: now[0])
    synced.clear()
    _fill(spool, 2)
    assert not any(p.endswith(".seg") for p in synced)  # within the interval: written, not yet synced
    now[0] += 1.5
    _fill(spool, 1, start=2)
    assert any(p.endswith(".seg") for p in synced)  # the interval passed: the push syncs
    synced.clear()
    spool.ack(spool.peek(2)[-1].position)
    spool.sync()  # what the runtime's sync task calls every interval
    assert any(p.endswith("head.tmp") or p.endswith("head") for p in synced)
    synced.clear()
    _fill(spool, 1, start=3)  # within the interval again...
    assert not synced
    spool.close()  # ...but a clean stop syncs it
    assert any(p.endswith(".seg") for p in synced)


def test_spool_keeps_order_survives_restart_and_drops_oldest_only_past_its_bound(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    for i in range(10):
        spool.push(SpoolRecord("t", f"k{i}".encode(), f"v{i}".encode() * 10, [("h", b"x")]))
    assert [r.key for r in spool.peek(3)] == [b"k0", b"k1", b"k2"]
    spool.ack(spool.peek(4)[-1].position)
    assert spool.depth == 6
    reopened = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert [r.key for r in reopened.peek(100)] == [f"k{i}".encode() for i in range(4, 10)]
    assert reopened.peek(1)[0].headers == [("h", b"x")]
    for i in range(10, 200):
        reopened.push(SpoolRecord("t", f"k{i}".encode(), b"v" * 100))
    assert reopened.dropped > 0
    kept = reopened.peek(1000)
    assert len(kept) + reopened.dropped == 196
    keys = [int(r.key[1:]) for r in kept]
    assert keys == sorted(keys) and keys[-1] == 199  # oldest went first, newest kept


def test_spool_truncates_a_torn_tail(tmp_path):
    spool = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    spool.push(SpoolRecord("t", None, b"complete"))
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x40partial")
    again = DiskSpool(tmp_path, max_bytes=8192, segment_bytes=1024)
    assert [r.value for r in again.peek(10)] == [b"complete"]
    assert again.peek(1)[0].key is None


def test_a_full_disk_is_survived_and_nothing_pushed_is_lost_when_space_returns(small_fs):
    """The drill: a real 1 MiB filesystem fills mid-record; pushes go on, are counted and held in memory;
    once space returns they reach the disk in order, and no torn bytes are left for a reader to cut."""
    spool_dir = small_fs / "spool"
    spool = DiskSpool(spool_dir, max_bytes=8 * 2**20, segment_bytes=2**20, fsync_interval_s=3600)
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * 256 * 1024)  # what an operator frees later
    n = 0
    while spool.write_errors == 0:  # one segment of 1,015-byte records: the one that fails is cut mid-record
        _fill(spool, 1, start=n, size=1000)
        n += 1
    fill(small_fs)  # and every spare byte after it
    _fill(spool, 50, start=n, size=1000)
    n += 50
    assert spool.write_errors >= 51 and spool.held >= 51
    disk_records = spool.depth
    assert disk_records + spool.held == n
    on_disk = sum(p.stat().st_size for p in _segments(spool_dir))
    assert on_disk == spool.bytes  # the torn bytes were cut back to the last whole record

    # Delivered from the disk meanwhile; then the operator frees space and the next sync writes what was held.
    spool.ack(spool.peek(10)[-1].position)
    ballast.unlink()
    spool.sync()
    assert spool.held == 0
    _fill(spool, 5, start=n, size=1000)
    n += 5
    assert _keys(spool.peek(10_000)) == list(range(10, n))
    reopened = DiskSpool(spool_dir, max_bytes=8 * 2**20, segment_bytes=2**20)
    assert _keys(reopened.peek(10_000)) == list(range(10, n))
    assert reopened.corrupt == 0 and reopened.dropped == 0


def test_records_held_in_memory_are_bounded_and_the_oldest_dropped_are_counted(small_fs):
    spool = DiskSpool(small_fs / "spool", max_bytes=8 * 2**20, segment_bytes=256 * 1024, memory_max_bytes=10_000)
    fill(small_fs)
    _fill(spool, 30, size=1000)
    assert spool.depth == 0 and spool.held == 9  # ~1,015 bytes each
    assert spool.dropped == 21
    (small_fs / "filler").unlink()
    spool.sync()
    assert _keys(spool.peek(100)) == list(range(21, 30))
