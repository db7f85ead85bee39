"""Records as one record batch per partition per call: the order of the calls, full batches, failures."""

from __future__ import annotations

import asyncio

from aiokafka.errors import KafkaTimeoutError
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from gpuaware.plumbing.kafka_batches import BatchSender


class HeldClient:
    """Takes batches as aiokafka's client does, except that the ``hold``-th batch handed over is held until released:
    the call handing it waits there, as behind a batch of its partition that the client has not sent yet."""

    def __init__(self, hold: int = 0, fail_delivery: bool = False) -> None:
        self.release = asyncio.Event()
        self.hold = hold
        self.fail_delivery = fail_delivery
        self.sent: list[tuple[int, list[tuple[bytes, bytes | None]]]] = []  # (partition, its records)

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(8))

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(16384, 0)  # what the client makes with its default max_batch_size, uncompressed

    async def send_batch(self, batch, topic: str, *, partition: int) -> asyncio.Future:
        if len(self.sent) + 1 == self.hold:
            await self.release.wait()
        self.sent.append((partition, [(r.key, r.value) for r in DefaultRecordBatch(bytearray(batch._build()))]))
        done = asyncio.get_running_loop().create_future()
        if self.fail_delivery:
            done.set_exception(KafkaTimeoutError("expired"))
        else:
            done.set_result(None)
        return done


def _sender(client: HeldClient) -> BatchSender:
    async def producer() -> HeldClient:
        return client

    return BatchSender(producer)


def test_a_call_waiting_on_a_partition_holds_the_next_call_back_so_no_record_overtakes_an_older_one() -> None:
    async def go() -> list:
        client = HeldClient(hold=2)
        sender, outcomes = _sender(client), []
        first = {p: [(f"k{p}-{i}".encode(), b"old") for i in range(3)] for p in range(8)}
        second = {p: [(k, b"new") for k, _ in recs] for p, recs in first.items()}
        older = asyncio.ensure_future(sender.send("t", first, lambda *a: outcomes.append(a)))
        await asyncio.sleep(0.05)  # the first call now waits on its second partition
        newer = asyncio.ensure_future(sender.send("t", second, lambda *a: outcomes.append(a)))
        await asyncio.sleep(0.05)
        client.release.set()
        await asyncio.gather(older, newer)
        await asyncio.sleep(0)
        assert len(outcomes) == 16 and all(error is None for *_, error in outcomes)
        return client.sent

    order: dict[bytes, list[bytes | None]] = {}
    for _, records in asyncio.run(go()):
        for key, value in records:
            order.setdefault(key, []).append(value)
    assert len(order) == 24 and all(values == [b"old", b"new"] for values in order.values())


def test_more_records_than_a_batch_holds_go_in_several_batches_in_order_and_every_failure_is_told() -> None:
    async def go() -> tuple[list, list]:
        client, outcomes = HeldClient(fail_delivery=True), []
        records = [(f"k{i:04d}".encode(), bytes(300)) for i in range(200)]  # 60 KB: over a 16 KiB batch
        records.insert(100, (b"huge", bytes(64 * 1024)))
        await _sender(client).send("t", {3: records}, lambda *a: outcomes.append(a))
        await asyncio.sleep(0)
        return client.sent, outcomes

    sent, outcomes = asyncio.run(go())
    keys = [f"k{i:04d}".encode() for i in range(200)]
    keys.insert(100, b"huge")
    assert len(sent) > 4 and {p for p, _ in sent} == {3}
    assert [k for _, recs in sent for k, _ in recs] == keys
    assert [(b"huge", bytes(64 * 1024))] in [recs for _, recs in sent]  # a batch of its own: the broker judges it
    assert [k for _, recs, _, error in outcomes if isinstance(error, KafkaTimeoutError) for k, _ in recs] == keys
