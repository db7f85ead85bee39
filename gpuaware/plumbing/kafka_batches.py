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

from aiokafka.structs import RecordMetadata

Record = tuple[bytes, bytes | None]  # key, value (None: a tombstone)
Headers = Sequence[tuple[str, bytes]]
# (partition, the records of one batch, its delivery (the first record's offset) or None, the error or None)
Done = Callable[[int, Sequence[Record], RecordMetadata | None, BaseException | None], None]
# The topic's sorted partitions -> the records by partition (a caller that partitions by key, as the client would)
Grouping = Callable[[list[int]], Mapping[int, Sequence[Record]]]


class BatchSender:
    """``producer()``: the started aiokafka producer."""

    def __init__(self, producer: Callable[[], Awaitable[Any]]):
        self.producer = producer
        self._lock = asyncio.Lock()

    async def send(self, topic: str, records: Mapping[int, Sequence[Record]] | Grouping, done: Done,
                   headers: Headers = ()) -> None:
        """Hand ``records`` (partition -> records, in order; or a function of the topic's sorted partitions giving
        them, called in turn) over; ``done`` is told each batch's outcome (a failed hand-over at once, a delivery
        when the broker answers; partition -1 and no records: a function's records not made, the client was not
        there). Whatever the client raises is a failed hand-over, not raised."""
        async with self._lock:  # (taken, or queued for, before this coroutine first suspends: call order kept)
            try:
                producer = await self.producer()
                partitions = sorted(await producer.partitions_for(topic)) if callable(records) else []
            except Exception as exc:  # no client (stopping), no metadata: nothing of this call is handed over
                if not callable(records):
                    for partition, recs in records.items():
                        done(partition, recs, None, exc)
                else:
                    done(-1, [], None, exc)  # (what would have gone is the caller's to count)
                return
            grouped = records(partitions) if callable(records) else records
            hdrs = list(headers)
            for partition, recs in grouped.items():
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
        except Exception as exc:  # (a client stopped meanwhile, a partition it does not know)
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
