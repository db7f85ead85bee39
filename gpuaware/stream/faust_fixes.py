"""Corrections to the pinned Faust (faust-streaming 0.15.3, aiokafka 0.14.0) without which a worker loses records.

Faust pauses and resumes partitions only in its own bookkeeping: aiokafka goes on fetching every assigned
partition, and Faust's fetch asks for the records of its set of active partitions, a set it changes in place.
It counts on the seek to the committed offsets that ends a rebalance to bring back whatever it dropped before.
Three things dropped records after that seek, for good (the consumer's position had moved past them):

1. **The queues cleared after the seek.** ``Recovery.on_recovery_completed`` resumed the input partitions,
   awaited the seek, then resumed the flow, which clears every stream's queue: records fetched in between were
   cleared. ``tests/system/test_stream_workers.py`` lost 41 consecutive batches of one partition in about one
   run in four on a 2-core host (the new owner began at batch 142 of a partition committed at 101). Here the
   seek is made while the input partitions are still paused, and they resume after the queues are cleared.
2. **An emptied set of active partitions read as "all".** aiokafka returns the records of every partition when
   the partitions asked for are an empty collection, and Faust's fetch passes its live set of active ones, which
   is empty between the table's recovery and the inputs' resume when the worker holds no standby partitions: a
   fetch in flight then took the inputs' records, which Faust dropped as not active. With fix 1 alone that
   happened during the seek, and a restarted worker processed nothing (tests/stream/test_app.py, about one run
   in four). Here a fetch is given a view of the live set that is never empty in aiokafka's eyes.
3. **A flush that gave up.** Each table write (a changelog record) goes through Faust's producer buffer, a queue
   that one task hands to the Kafka client, and Faust flushes that buffer before it commits offsets. The flush
   returned after 0.1 s without a message leaving the queue, messages still in it, and never waited for the one
   the task held: offsets could be committed past records whose changelog writes were still queued, and a worker
   killed then lost them. Here the flush waits until every message put before it has been handed to the client
   (not for those put meanwhile, which could starve a commit under load); it warns after 10 s without progress
   and fails (the commit with it) after 60 s, rather than hang or lose writes.

And one without which records wait in the broker:

4. **A fetch held for 1.5 s.** Faust builds its worker's consumer with ``fetch_max_wait_ms=1500``, fixed. aiokafka
   has one fetch in flight per broker, for the partitions whose fetched records have all been taken; while the
   broker holds it (no new record for *those*), records arriving for the others wait for it to return. And the
   embedded broker (Tansu) holds a fetch for part of the wait even when its own partitions get records: a record
   produced at a random moment reached a consumer 0.03-0.70 s later with 1500 ms, 0.00-0.05 s with 100 ms.
   (``bench stream``'s latency phase with two workers: p99 1.83 s; the 16,384-GPU pipeline on Apache Kafka: p99
   beyond batching 2.7-3.7 s, 0.72 s with 100 ms.) Here the consumer asks for the app's
   ``gpuaware_fetch_max_wait_ms`` (``kafka.fetch_max_wait_ms``, as ``KafkaSettings.consumer_kwargs`` gives); an idle
   worker's empty fetches come more often.

And one for the changelog the app writes itself:

5. **A commit past a failed changelog write.** Before committing, Faust flushes its producer: that waits for every
   record handed to the client to be answered, not for it to be stored. The stream app writes its table's changelog
   as record batches (``gpuaware.stream.changelog``), which keeps a failed batch's records to send again; here the app's
   ``gpuaware_after_flush`` (``ChangelogTable.settle``) runs after the producer's flush, so the commit waits until
   they are stored, or fails (and, given up once, fails at once from then on, a stop's commit too). Only the
   at-least-once commit flushes the producer; the stream app does not use Faust's exactly-once mode.

Faust's other resume path (``Recovery._resume_streams``, for apps without tables) has the first ordering too;
the stream app always has a table, so it is left alone. tests/stream/test_faust_fixes.py shows each of the first
four losses with Faust's and aiokafka's own code, and its absence with the fix; for fix 5, that Faust's flush never
asks the app and the patched one does (the losses it prevents are in tests/stream/test_changelog.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Set
from typing import Any

from faust.tables.recovery import Recovery, ServiceStopped
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Producer as AIOKafkaProducerService
from faust.transport.producer import ProducerBuffer

# Faust's own code, kept for the tests that show the losses it has.
FAUST_ON_RECOVERY_COMPLETED = Recovery.on_recovery_completed
FAUST_FETCH_RECORDS = AIOKafkaConsumerThread._fetch_records
FAUST_CREATE_WORKER_CONSUMER = AIOKafkaConsumerThread._create_worker_consumer
FAUST_FLUSH = ProducerBuffer.flush
FAUST_PUT = ProducerBuffer.put
FAUST_SEND_PENDING = ProducerBuffer._send_pending
FAUST_PRODUCER_FLUSH = AIOKafkaProducerService.flush
log = logging.getLogger(__name__)
# How long one wait for the buffer's draining task lasts before the buffer's state is looked at again, how long
# without a message leaving it before a warning, and before the flush fails (the client's own send gives up after
# its request timeout, 30 s by default: a buffer still stuck after that will not drain).
_RECHECK_S = 1.0
_WARN_AFTER_S = 10.0
_FAIL_AFTER_S = 60.0


def install() -> None:
    """Install the five corrections (once per process)."""
    if getattr(Recovery, "_gpuaware_fixed", False):
        return
    Recovery.on_recovery_completed = _on_recovery_completed
    AIOKafkaConsumerThread._fetch_records = _fetch_records
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer
    ProducerBuffer._gpuaware_put = ProducerBuffer._gpuaware_handed = 0  # defaults: a buffer counts from its first put
    ProducerBuffer.put = _put
    ProducerBuffer._send_pending = _send_pending
    ProducerBuffer.flush = _flush
    AIOKafkaProducerService.flush = _producer_flush
    Recovery._gpuaware_fixed = True


async def _producer_flush(self: Any) -> None:
    """Faust's producer flush (its buffer, then the client's records answered), then the app's own check of what the
    answers were (fix 5; ``gpuaware_after_flush``, absent in apps that write no changelog of their own)."""
    await FAUST_PRODUCER_FLUSH(self)
    after = getattr(self.app, "gpuaware_after_flush", None)
    if after is not None:
        await after()


def _create_worker_consumer(self: Any, transport: Any) -> Any:
    """Faust's worker consumer, asking the broker to hold a fetch at most the app's ``gpuaware_fetch_max_wait_ms``
    (fix 4; aiokafka reads the attribute when the consumer starts)."""
    consumer = FAUST_CREATE_WORKER_CONSUMER(self, transport)
    wait = getattr(self.app, "gpuaware_fetch_max_wait_ms", None)
    if wait is not None:
        consumer._fetch_max_wait_ms = wait
    return consumer


async def _on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    """Faust's ``Recovery.on_recovery_completed`` with the seek made before the input partitions resume (fix 1)."""
    consumer = self.app.consumer
    rebalances = self.app.rebalancing_count  # a rebalance starting (its revoke) counts before any await sees it

    def current() -> bool:
        return self.app.rebalancing_count == rebalances and self.app.consumer_generation_id == generation_id

    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    callbacks = [asyncio.ensure_future(table.on_recovery_completed(self.actives_for_table[table],
                                                                   self.standbys_for_table[table]))
                 for table in self.tables.values()]
    if callbacks:
        await asyncio.wait(callbacks)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning(f"Recovery rebalancing again app id {self.app.consumer_generation_id} "
                         f"param {generation_id}")
        return
    inputs = {tp for tp in assignment if not self._is_changelog_tp(tp)}
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        try:
            await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
        except ServiceStopped:
            # A seek past its timeout ends the recovery service, as in Faust's own order, which had resumed the
            # inputs before the seek: they are resumed too rather than left paused for good.
            if current():
                consumer.resume_partitions(inputs)
            raise
        if not current():
            # A rebalance began during the seek; its revoke paused the inputs and its recovery resumes what
            # stays assigned here. Resuming them now would let records be processed in the middle of it.
            self.log.info("Rebalancing again: the next recovery resumes the stream partitions")
            return
    # Nothing awaits from here to the flow's resume, which clears the streams' queues: no record of the
    # partitions resumed can be fetched before that.
    consumer.resume_partitions(inputs)
    self.completed.set()
    self.app.flow_control.resume()
    consumer.resume_flow()
    await self.app._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")


class ActiveView:
    """Faust's live set of active partitions as aiokafka's ``fetched_records`` reads its filter (``partitions
    and tp not in partitions``): membership follows the set as Faust changes it, and an emptied set means no
    partition rather than every one (fix 2)."""

    __slots__ = ("live",)

    def __init__(self, live: Set) -> None:
        self.live = live

    def __contains__(self, tp: object) -> bool:
        return tp in self.live

    def __bool__(self) -> bool:
        return True


async def _fetch_records(self: Any, consumer: Any, active_partitions: Any, timeout: float | None = None,
                         max_records: int | None = None) -> Any:
    view = active_partitions if active_partitions is None else ActiveView(active_partitions)
    return await FAUST_FETCH_RECORDS(self, consumer, view, timeout=timeout, max_records=max_records)


def _put(self: Any, fut: Any) -> None:
    FAUST_PUT(self, fut)
    if not self.app.conf.producer_threaded:  # (a threaded producer's own queue is not this buffer's)
        self._gpuaware_put += 1


async def _send_pending(self: Any, fut: Any) -> None:
    try:
        await FAUST_SEND_PENDING(self, fut)
    finally:  # handed over (or failed, which Faust's producer reports): ``flush`` counts it done
        self._gpuaware_handed += 1


async def _flush(self: Any) -> None:
    """``ProducerBuffer.flush`` that returns once every message put before it was handed to the client (fix 3).

    The queue is first in, first out, so the messages put before the flush are the first ``put`` ones handed
    over; the flush waits for those only, not for the messages the worker keeps putting meanwhile (waiting for
    an empty queue could starve a commit under load)."""
    loop = asyncio.get_running_loop()
    target, handed = self._gpuaware_put, self._gpuaware_handed
    progress = warned = loop.time()
    while handed < target:
        if self.state != "running":
            if self.size:  # as Faust's own flush: a stopped buffer cannot drain
                raise RuntimeError("Cannot flush: Producer not Running")
            return
        self.message_sent.clear()  # set by the draining task after each message it hands over
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.message_sent.wait(), timeout=_RECHECK_S)
        if self._gpuaware_handed != handed:
            handed = self._gpuaware_handed
            progress = warned = loop.time()
            continue
        stuck = loop.time() - progress
        waiting = f"{target - handed} messages put before the flush not handed over"
        if stuck >= _FAIL_AFTER_S:
            raise RuntimeError(f"producer buffer made no progress in {stuck:.0f} s ({waiting}): the offsets "
                               f"of the records that wrote them are not committed")
        if loop.time() - warned >= _WARN_AFTER_S:
            warned = loop.time()
            log.warning("producer buffer: no message has left it for %.0f s (%s); waiting before a commit",
                        stuck, waiting)
