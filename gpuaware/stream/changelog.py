"""The ``gpus`` table with its changelog records sent as one record batch per partition per take.

Faust's table sends a changelog record per write through ``send_soon`` (a Faust message, a trip through its producer
buffer, aiokafka's per-record send) and then writes its store. A worker writes a node entry per telemetry record,
~1,200 a second at 50,000 GPUs, and that changelog path cost about a fifth of its CPU: the 50,000-GPU pipeline applied
2,800 samples per worker CPU second with the entries encoded but not written, 2,159 with them written through Faust
(docs/performance.md, the stream's "Where the time went"). ``ChangelogTable`` is the mapping the processor reads and
writes: a write goes to the table's store at once (so the take reads it back) and into a pending list, which
``flush`` hands to the Kafka client (``gpuaware.plumbing.kafka_batches``) before the take's records are acknowledged.

What Faust's own write did is kept: the changelog record is what Faust writes (the key through the table's key
serializer, the value as given, in the partition of the record being handled, Faust's ``partition_for_key``), and a
delivered batch sets the store's persisted offset (its last record's), which is what lets a restarted worker replay
only the changelog's tail. The client is the app's producer, which Faust flushes before it commits offsets.

A batch the client does not take or deliver is not lost: each of its keys not written again since is sent again, with
the value it had, at the next ``flush`` (a key written again since is carried by that newer record, which the sender
keeps after the failed one), and logged and counted (``gpuaware_stream_changelog_failed_total``). Faust's commit waits
for the client's deliveries but not for their success, so ``settle`` runs after the client's flush and before every
commit (``gpuaware.stream.faust_fixes``, fix 5): until every key a failed batch left owing is stored again (the failed
record,
or a newer write of its key) it sends what is pending and waits for the answers, a few times, and fails the commit if
they still fail, so that no offset is committed past a record whose changelog write is missing (a
worker that cannot write its changelog stops, and its successor reads the records again). Before partitions are
revoked, everything pending or owed is stored (``hand_over``): the same partitions may come straight back (eager
rebalancing) with their offsets committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import faust.streams as faust_streams
from aiokafka.structs import RecordMetadata, TopicPartition

from gpuaware.plumbing.kafka_batches import BatchSender, Record
from gpuaware.stream.metrics import StreamStats

log = logging.getLogger(__name__)
SETTLE_TRIES = 5  # each waits for the client's deliveries, after a pause of 0.1 s, 0.2 s, ... (at most 2 s)


class ChangelogTable(MutableMapping[str, bytes]):
    """``owns(partition)``: the table partition is this worker's (a delivery sets its store's persisted offset only
    then: a revoked partition's database is its next owner's business)."""

    def __init__(self, table: Any, sender: BatchSender, stats: StreamStats,
                 owns: Callable[[int], bool] = lambda partition: True):
        self.table = table
        self.sender = sender
        self.stats = stats
        self.owns = owns
        self.topic = table.changelog_topic.get_topic_name()
        self.pending: dict[int, list[Record]] = {}
        self._keys: dict[str, bytes] = {}  # key -> its changelog key (Faust's key serializer: JSON for a str)
        # A failed record is sent again only if no write of its key came after it in its partition (a key may be
        # written in two: a GPU's owner entry, when it moves to a node of another): (partition, changelog key) -> its
        # writes so far, and each record not yet delivered (by identity: the sender hands back the tuples it was
        # given) -> its write.
        self._writes: dict[tuple[int, bytes], int] = {}
        self._write_of: dict[int, int] = {}
        self._retry: dict[tuple[int, bytes], Record] = {}
        # (partition, changelog key) -> the write number a failed record had: owed until a record of the key with that
        # number or a later one is stored (the failed one sent again, or a newer write of the key)
        self._owed: dict[tuple[int, bytes], int] = {}
        self._given_up: str | None = None

    # ------------------------------------------------------------------ reads: the table's

    def __getitem__(self, key: str) -> bytes:
        return self.table[key]

    def __contains__(self, key: object) -> bool:
        return key in self.table

    def __iter__(self) -> Iterator[str]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    # ------------------------------------------------------------------ writes: the store now, the changelog at flush

    def __setitem__(self, key: str, value: bytes) -> None:
        partition = self._partition()
        self.table.data[key] = value
        self._record(partition, key, value)

    def __delitem__(self, key: str) -> None:
        partition = self._partition()
        del self.table.data[key]
        self._record(partition, key, None)

    @staticmethod
    def _partition() -> int:
        """The partition of the record being handled (Faust's ``partition_for_key`` for a table like this one)."""
        event = faust_streams.current_event()
        if event is None:
            raise TypeError("a table write outside of a record's handling has no changelog partition")
        return event.message.partition

    def _record(self, partition: int, key: str, value: bytes | None) -> None:
        raw = self._keys.get(key)
        if raw is None:
            raw = self._keys[key] = self.table.app.serializers.dumps_key(
                self.table.key_type, key, serializer=self.table.key_serializer)
        record = (raw, value)
        self._write_of[id(record)] = self._writes[(partition, raw)] = self._writes.get((partition, raw), 0) + 1
        replaced = self._retry.pop((partition, raw), None)  # this newer record carries the key (and what it owes)
        if replaced is not None:
            self._write_of.pop(id(replaced), None)
        self.pending.setdefault(partition, []).append(record)

    async def flush(self) -> None:
        """Hand the pending changelog records over, after those of failed batches that are still their key's newest."""
        retry, self._retry = self._retry, {}
        for (partition, _), record in retry.items():
            self.pending.setdefault(partition, []).insert(0, record)
        if self.pending:
            pending, self.pending = self.pending, {}
            await self.sender.send(self.topic, pending, self._done)

    async def settle(self) -> None:
        """After the client's flush, before a commit: every key a failed batch left owing is stored (the pending
        records and those sent again handed over, and the client's answers awaited), or RuntimeError (the commit fails
        with it) after ``SETTLE_TRIES``; then at once on every later call (a stop commits too: it must not wait
        through the tries again, nor commit)."""
        if self._given_up is not None:
            raise RuntimeError(self._given_up)
        for attempt in range(SETTLE_TRIES):
            if not self._owed:
                return
            if attempt:
                await asyncio.sleep(min(0.1 * 2 ** (attempt - 1), 2.0))
            await self._send_and_wait()
        if self._owed:
            self._given_up = (f"{len(self._owed)} {self.topic} records not stored after {SETTLE_TRIES} tries: no "
                              f"offset is committed past them")
            raise RuntimeError(self._given_up)

    async def hand_over(self) -> None:
        """Before partitions are revoked: what is pending and what is owed stored now, while this worker still owns
        them: their records' offsets may be committed (by this worker, given the partitions back, as eager
        rebalancing does), and a record sent after the new owner recovered would overwrite its newer writes.
        RuntimeError as ``settle``'s. (Faust waits for the takes to be acknowledged and commits before the
        revocation's receivers run, so this is mostly a check that finds nothing: it stays for a revocation that
        does not wait, with ``stream_wait_empty`` off.)"""
        if not (self.pending or self._owed or self._write_of):  # nothing pending, owed, or unanswered
            return
        await self._send_and_wait()
        await self.settle()

    async def _send_and_wait(self) -> None:
        """What is pending or to be sent again handed over, and the client's answers awaited (a failure owes its key
        again)."""
        await self.flush()
        await (await self.sender.producer()).flush()

    def _done(self, partition: int, records: Sequence[Record], delivered: RecordMetadata | None,
              error: BaseException | None) -> None:
        owed = self._owed
        if error is None:
            for record in records:
                written = self._write_of.pop(id(record), None)
                if owed and written is not None and owed.get((partition, record[0]), written + 1) <= written:
                    del owed[(partition, record[0])]
            if delivered is not None and self.owns(partition):
                self.table.data.set_persisted_offset(TopicPartition(self.topic, partition),
                                                     delivered.offset + len(records) - 1)
            return
        self.stats.changelog_failed += len(records)
        log.error("%d %s records not delivered (%s: %s): sent again before the next commit", len(records),
                  self.topic, type(error).__name__, error)
        for record in records:
            raw = record[0]
            written = self._write_of.get(id(record))
            if written is None or not self.owns(partition):
                self._write_of.pop(id(record), None)  # not this worker's to send again any more
                continue
            owed[(partition, raw)] = max(owed.get((partition, raw), 0), written)
            if written == self._writes.get((partition, raw)):
                self._retry[(partition, raw)] = record  # still the newest of its key (kept: its write number stays)
            else:
                self._write_of.pop(id(record), None)  # a newer write of the key, pending or sent, pays what it owes
