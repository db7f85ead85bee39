"""The table's changelog as record batches: what a write sends, the persisted offset, and a failed batch sent again.

The restart tests in tests/stream/test_app.py run it inside a worker on the broker (the records Faust's recovery
reads, and a restart that replays only the tail); these look at the bookkeeping a broker cannot be made to fail."""

from __future__ import annotations

import asyncio
import json
import weakref
from types import SimpleNamespace
from typing import Any

import faust.streams as faust_streams
import pytest
from aiokafka.errors import KafkaTimeoutError
from aiokafka.structs import RecordMetadata, TopicPartition

from gpuaware.plumbing.kafka_batches import BatchSender
from gpuaware.stream.changelog import SETTLE_TRIES, ChangelogTable
from gpuaware.stream.metrics import StreamStats
from tests.plumbing.test_kafka_batches import HeldClient

TOPIC = "app-gpus-changelog"


class _Table:
    """What ChangelogTable uses of a Faust table: its store (``data``), changelog topic and key serializer."""

    def __init__(self) -> None:
        self.data = _Store()
        self.key_type, self.key_serializer = None, "json"
        self.changelog_topic = SimpleNamespace(get_topic_name=lambda: TOPIC)
        self.app = SimpleNamespace(serializers=SimpleNamespace(
            dumps_key=lambda typ, key, serializer: json.dumps(key).encode()))

    def __getitem__(self, key: str) -> bytes:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class _Store(dict):
    def __init__(self) -> None:
        super().__init__()
        self.persisted: dict[TopicPartition, int] = {}

    def set_persisted_offset(self, tp: TopicPartition, offset: int) -> None:
        self.persisted[tp] = offset


class _Client(HeldClient):
    """Delivers with offsets that count up per partition; the batches of the calls in ``failing`` fail (every call
    after ``fail_from`` too)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[int] = set()
        self.fail_from: int | None = None
        self.calls = 0
        self.next_offset: dict[int, int] = {}
        self.flushes = 0

    async def flush(self) -> None:  # aiokafka's: every batch handed over is answered (here at once)
        self.flushes += 1
        self.calls += 1
        await asyncio.sleep(0)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future:
        await super().send_batch(batch, topic, partition=partition)
        done = asyncio.get_running_loop().create_future()
        if self.calls in self.failing or (self.fail_from is not None and self.calls >= self.fail_from):
            done.set_exception(KafkaTimeoutError("expired"))
            return done
        count = len(self.sent[-1][1])
        base = self.next_offset.get(partition, 0)
        self.next_offset[partition] = base + count
        done.set_result(RecordMetadata(topic, partition, TopicPartition(topic, partition), base, -1, 0, 0))
        return done


class _Event:
    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


def _under(partition: int) -> Any:
    """Make a record of ``partition`` the one being handled (what the processor's scope does with Faust's)."""
    event = _Event(partition)
    faust_streams._current_event.set(weakref.ref(event))
    return event  # kept alive by the caller: the context holds a weak reference


def _table(client: _Client, owned: set[int] | None = None) -> tuple[ChangelogTable, _Table, StreamStats]:
    async def producer() -> _Client:
        return client

    table, stats = _Table(), StreamStats()
    owns = (lambda p: True) if owned is None else owned.__contains__
    return ChangelogTable(table, BatchSender(producer), stats, owns=owns), table, stats


async def _flush(changelog: ChangelogTable, client: _Client) -> None:
    client.calls += 1
    await changelog.flush()
    await asyncio.sleep(0)  # delivery callbacks


def test_writes_reach_the_store_at_once_and_the_changelog_at_flush_with_the_persisted_offset() -> None:
    async def go() -> None:
        client = _Client()
        changelog, table, _ = _table(client)
        e3 = _under(3)
        changelog["node:a"] = b"1"
        changelog["owner:GPU-1"] = b'"a"'
        e5 = _under(5)
        changelog["node:b"] = b"2"
        del changelog["owner:GPU-1"]
        assert table.data == {"node:a": b"1", "node:b": b"2"} and client.sent == []
        await _flush(changelog, client)
        assert client.sent == [(3, [(b'"node:a"', b"1"), (b'"owner:GPU-1"', b'"a"')]),
                               (5, [(b'"node:b"', b"2"), (b'"owner:GPU-1"', None)])]
        assert table.data.persisted == {TopicPartition(TOPIC, 3): 1, TopicPartition(TOPIC, 5): 1}
        e3 = _under(3)
        changelog["node:a"] = b"3"
        await _flush(changelog, client)
        assert table.data.persisted[TopicPartition(TOPIC, 3)] == 2
        del e3, e5

    asyncio.run(go())


def test_a_failed_batch_is_sent_again_where_its_key_was_not_written_since() -> None:
    async def go() -> None:
        client = _Client()
        changelog, table, stats = _table(client)
        event = _under(2)
        changelog["node:a"] = b"a1"
        changelog["node:b"] = b"b1"
        changelog["node:b"] = b"b2"  # twice in a take: its newest is what counts
        client.failing = {1}
        await _flush(changelog, client)
        assert stats.changelog_failed == 3 and table.data.persisted == {}
        changelog["node:a"] = b"a2"  # written again since: a1 must not follow it
        await _flush(changelog, client)
        assert client.sent[-1] == (2, [(b'"node:b"', b"b2"), (b'"node:a"', b"a2")])
        assert table.data.persisted == {TopicPartition(TOPIC, 2): 1}
        await _flush(changelog, client)  # nothing left to send again
        assert len(client.sent) == 2
        del event

    asyncio.run(go())


def test_a_batch_that_fails_once_a_newer_write_of_its_key_waits_to_be_sent_is_not_sent_again() -> None:
    async def go() -> None:
        client = _Client()
        changelog, _, stats = _table(client)
        event = _under(1)
        changelog["node:a"] = b"old"
        client.failing = {1}
        client.hold = 1  # the first batch waits to be taken ...
        first = asyncio.ensure_future(_flush(changelog, client))
        await asyncio.sleep(0.01)
        changelog["node:a"] = b"new"  # ... while a newer write of its key comes
        client.release.set()
        await first
        await _flush(changelog, client)
        await _flush(changelog, client)
        assert [recs for _, recs in client.sent] == [[(b'"node:a"', b"old")], [(b'"node:a"', b"new")]]
        assert stats.changelog_failed == 1
        del event

    asyncio.run(go())


def test_a_commit_waits_until_the_failed_records_are_stored_and_fails_if_they_never_are() -> None:
    async def go() -> None:
        client = _Client()
        changelog, table, stats = _table(client)
        event = _under(4)
        changelog["node:a"] = b"a1"
        client.failing = {1}
        await _flush(changelog, client)
        assert stats.changelog_failed == 1 and changelog._retry
        await changelog.settle()  # what Faust's producer flush runs before a commit (faust_fixes, fix 5)
        assert client.sent[-1] == (4, [(b'"node:a"', b"a1")]) and not changelog._retry
        assert table.data.persisted == {TopicPartition(TOPIC, 4): 0}
        changelog["node:b"] = b"b1"
        client.fail_from = client.calls + 1
        await _flush(changelog, client)
        with pytest.raises(RuntimeError, match="no offset is committed past them"):
            await changelog.settle()
        sends = [recs for _, recs in client.sent if recs == [(b'"node:b"', b"b1")]]
        assert len(sends) == 1 + SETTLE_TRIES  # each try sent the record again
        del event

    asyncio.run(go())


def test_before_a_revocation_a_takes_pending_writes_and_what_is_owed_are_stored() -> None:
    async def go() -> None:
        client, owned = _Client(), {1, 2}
        changelog, table, _ = _table(client, owned)
        e1 = _under(1)
        changelog["node:a"] = b"a1"
        client.failing = {1}
        await _flush(changelog, client)  # a1 fails: owed
        e2 = _under(2)
        changelog["node:b"] = b"b1"  # a take's write, its flush not reached when the revocation comes
        client.failing = set()
        await changelog.hand_over()
        assert client.sent == [(1, [(b'"node:a"', b"a1")]), (2, [(b'"node:b"', b"b1")]), (1, [(b'"node:a"', b"a1")])]
        assert not changelog.pending and not changelog._owed and not changelog._write_of
        changelog["node:b"] = b"b2"  # pending, nothing owed: handed over all the same
        await changelog.hand_over()
        assert client.sent[-1] == (2, [(b'"node:b"', b"b2")]) and not changelog._write_of
        sent = len(client.sent)
        await changelog.hand_over()  # nothing left: the client is not even asked
        assert len(client.sent) == sent and client.flushes == 2
        owned.discard(1)  # revoked
        e1 = _under(1)  # a write for a partition no longer owned (a take in flight at the revocation)
        changelog["node:a"] = b"a2"
        await _flush(changelog, client)
        assert client.sent[-1] == (1, [(b'"node:a"', b"a2")])
        assert table.data.persisted[TopicPartition(TOPIC, 1)] == 0  # the delivery of a1, not of a2
        del e1, e2

    asyncio.run(go())


def test_a_write_outside_a_records_handling_is_refused_before_it_reaches_the_store() -> None:
    changelog, table, _ = _table(_Client())
    faust_streams._current_event.set(None)
    with pytest.raises(TypeError, match="no changelog partition"):
        changelog["node:a"] = b"a1"
    with pytest.raises(TypeError):
        del changelog["node:a"]
    assert table.data == {} and not changelog.pending


def test_a_commit_waits_for_the_newer_write_that_pays_for_a_failed_one_and_gives_up_for_good() -> None:
    async def go() -> None:
        client = _Client()
        changelog, _, stats = _table(client)
        event = _under(6)
        changelog["node:a"] = b"old"
        client.failing = {1}
        client.hold = 1
        first = asyncio.ensure_future(_flush(changelog, client))
        await asyncio.sleep(0.01)
        changelog["node:a"] = b"new"  # pending (its take's flush not reached) when the old one fails
        client.release.set()
        await first
        assert stats.changelog_failed == 1 and changelog.pending
        client.failing = set()
        await changelog.settle()  # a commit now: the newer write must be stored first, and pays for the old one
        assert client.sent[-1] == (6, [(b'"node:a"', b"new")]) and not changelog.pending
        assert not changelog._owed and stats.changelog_failed == 1
        changelog["node:b"] = b"b1"
        client.fail_from = 0
        await _flush(changelog, client)
        with pytest.raises(RuntimeError):
            await changelog.settle()
        sent = len(client.sent)
        with pytest.raises(RuntimeError, match="not stored"):
            await changelog.settle()  # given up: a stop's commit fails at once, without the tries again
        assert len(client.sent) == sent
        del event

    asyncio.run(go())


def test_a_key_written_in_two_partitions_is_owed_in_each() -> None:
    async def go() -> None:
        client = _Client()
        changelog, _, _ = _table(client)
        e1 = _under(1)
        changelog["owner:GPU-9"] = b'"n1"'
        client.failing = {1}
        await _flush(changelog, client)
        e2 = _under(2)
        changelog["owner:GPU-9"] = b'"n2"'  # the GPU moved to a node of another partition
        await changelog.settle()  # n1, the newest of partition 1, is sent again: n2 does not pay for it
        assert {p: recs for p, recs in client.sent} == {1: [(b'"owner:GPU-9"', b'"n1"')],
                                                        2: [(b'"owner:GPU-9"', b'"n2"')]}
        assert not changelog._owed
        del e1, e2

    asyncio.run(go())
