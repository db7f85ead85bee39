"""Records handed to an aiokafka producer as record batches, one per partition per call, not one send per record.

A send through aiokafka's ``send`` (and Faust's ``send_soon`` around it) costs the sender a serializer call, a
partitioner call, a future and a delivery callback per record, and Faust a FutureMessage, a PendingMessage and a
trip through its producer buffer's queue and task. A stream worker at 50,000 GPUs writes ~1,200 changelog records
and 1,700-3,500 GPU states a second, and that per-record path was about half of its CPU (docs/performance.md, the
stream's "Where the time went"). Here a call's records for a partition are appended to one ``BatchBuilder``
(closed, so the client sends it without its linger) and handed over with ``send_batch``; a full batch is handed
over and the next records go into another (an empty batch takes any record: one too large for the broker fails on
delivery).

Order: ``send`` holds a lock (asyncio's is first come, first served) while it hands its batches over, which awaits
while a partition's previous batch waits to be sent. Callers make their records and call ``send`` without awaiting
in between, so the order of the calls is the order in each partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

Record = tuple[bytes, bytes | None]  # key, value (None: a tombstone)
Headers = Sequence[tuple[str, bytes]]
# (partition, the records of one batch, its delivery (the first record's offset) or None, the error or None)
Done = Callable[[int, Sequence[Record], RecordMetadata | None, BaseException | None], None]


class BatchSender:
    """``producer()``: the started aiokafka producer."""

    def __init__(self, producer: Callable[[], Awaitable[Any]]):
        self.producer = producer
        self._lock = asyncio.Lock()

    async def partitions(self, topic: str) -> list[int]:
        """The topic's partitions, sorted (what the client's partitioner hashes keys over)."""
        return sorted(await (await self.producer()).partitions_for(topic))

    async def send(self, topic: str, records: Mapping[int, Sequence[Record]], done: Done,
                   headers: Headers = ()) -> None:
        """Hand ``records`` (partition -> records, in order) over; ``done`` is told each batch's outcome (a failed
        hand-over at once, a delivery when the broker answers). Raises nothing the client raises."""
        async with self._lock:
            try:
                producer = await self.producer()
            except KafkaError as exc:
                for partition, recs in records.items():
                    done(partition, recs, None, exc)
                return
            hdrs = list(headers)
            for partition, recs in records.items():
                batch, start = producer.create_batch(), 0
                for i, (key, value) in enumerate(recs):
                    if batch.append(key=key, value=value, timestamp=None, headers=hdrs) is not None:
                        continue
                    await self._submit(producer, topic, partition, batch, recs[start:i], done)  # full
                    batch, start = producer.create_batch(), i
                    batch.append(key=key, value=value, timestamp=None, headers=hdrs)  # an empty batch takes any one
                await self._submit(producer, topic, partition, batch, recs[start:], done)

    @staticmethod
    async def _submit(producer: Any, topic: str, partition: int, batch: Any, recs: Sequence[Record],
                      done: Done) -> None:
        if not recs:
            return
        batch.close()
        try:
            delivered = await producer.send_batch(batch, topic, partition=partition)
        except KafkaError as exc:
            done(partition, recs, None, exc)
            return

        def delivery(fut: asyncio.Future) -> None:
            if fut.cancelled():
                done(partition, recs, None, asyncio.CancelledError("the client stopped before delivering"))
            elif fut.exception() is not None:
                done(partition, recs, None, fut.exception())
            else:
                done(partition, recs, fut.result(), None)

        delivered.add_done_callback(delivery)
