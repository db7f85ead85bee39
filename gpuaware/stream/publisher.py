"""``gpu.state.v1`` and ``node.state.v1`` as one record batch per partition per call
(``gpuaware.plumbing.kafka_batches``), not
a Faust message per state.

Through Faust's ``send_soon`` each state cost a FutureMessage, a PendingMessage, a trip through the producer
buffer's queue and task, and aiokafka's per-record serializer, partitioner, future and callback. At 50,000 GPUs
(1,700-3,500 states a second) that was about a third of a worker's CPU: the 50,000-GPU pipeline applied 2,454
samples per worker CPU second with the states encoded but not sent, 1,647-1,733 with them sent through Faust, and
2,159 with them sent in batches (docs/performance.md, the stream's "Where the time went").

Order: the scheduler keeps the newest record per key, so a GPU's states must reach its partition in the order they
were made: callers (a take, the heartbeat) make their states and call ``publish`` without awaiting in between, and
``publish`` takes its turn with the sender before anything else (the topic's partitions, and the encoding of records
not encoded yet, come in that turn), so the order of the calls is the order in each partition. The worker's states
come encoded already (``encoded_state``, when the processor makes them).

The client is the Faust app's producer, which Faust flushes before committing offsets, so a take's states are handed
to the broker before its records count as processed, as they were through Faust's buffer. Keys are hashed with the
client's default partitioner (murmur2, as Kafka's Java client), so a GPU's states go to the partition earlier
versions wrote them to. A failed hand-over or delivery is logged and counted (``gpuaware_stream_publish_failed_total``);
the worker goes on, and the GPU's next state (at the latest its ``max_publish_interval_ms`` refresh) replaces the
lost one; a node's next rollup (within ``gpuaware.stream.processor.NODE_HEARTBEAT_MS``) likewise.

A GPU state is written by ``gpuaware.stream.state_codec`` (the contract's bytes, its identity and forecasts kept
encoded per GPU); ``KeptField`` keeps one field of any other record encoded per key and splices it in
(``gpuaware.contract.events.encode``'s ``spliced``: the same bytes): node rollups keep their GPU lists that way
(``node_gpus``).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import RecordMetadata

from gpuaware.contract.events import GpuState, NodeState, encode, encode_field
from gpuaware.contract.events import Record as ContractRecord
from gpuaware.plumbing.kafka_batches import BatchSender, Headers, Record
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.state_codec import Encoded, GpuStateCodec

if TYPE_CHECKING:
    from gpuaware.stream.gpu_state import GpuTracker

log = logging.getLogger(__name__)


class KeptField:
    """Records of class ``cls`` encoded with their field ``name`` kept encoded per key and spliced in: the field is
    encoded again only when a record brings a value that is not ``same`` as the kept one."""

    def __init__(self, cls: type, name: str, same: Callable[[Any, Any], bool] = operator.is_):
        self.cls, self.name, self.same = cls, name, same
        self._kept: dict[bytes, tuple[Any, bytes]] = {}  # key -> the value and its bytes

    def encode(self, record: ContractRecord, key: bytes) -> bytes:
        """``encode(record)``, the same bytes."""
        value = getattr(record, self.name)
        kept = self._kept.get(key)
        if kept is None or not self.same(kept[0], value):
            kept = self._kept[key] = (value, encode_field(self.cls, self.name, value))
        return encode(record, spliced={self.name: kept[1]})

    def forget(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._kept.pop(key, None)


def node_gpus() -> KeptField:
    """A node rollup's GPU list, by value: it is built anew for every rollup (``gpuaware.stream.rollup.node_record``)
    and
    changes only when a GPU joins, leaves or changes band, while the headroom around it moves with every rollup. A
    rollup of 8 GPUs took 26 µs to encode, 19 of them fastavro's over the list; 6,250 nodes every 5 s at 50,000 GPUs."""
    return KeptField(NodeState, "gpus", operator.eq)


class StatePublisher:
    """``kept``: what encodes the records, keeping parts of them encoded per key (default: GPU states'
    ``GpuStateCodec``; ``node_gpus`` for node rollups, which go out the same way)."""

    def __init__(self, topic: str, sender: BatchSender, stats: StreamStats,
                 kept: KeptField | GpuStateCodec | None = None):
        self.topic = topic
        self.sender = sender
        self.stats = stats
        self._partitions: list[int] = []
        self._partition_of: dict[bytes, int] = {}  # murmur2 in pure Python costs more than the rest of an append
        self._kept = kept or GpuStateCodec()

    def _partition(self, key: bytes) -> int:
        p = self._partition_of.get(key)
        if p is None:
            p = self._partition_of[key] = DefaultPartitioner()(key, self._partitions, self._partitions)
        return p

    def encode(self, state: GpuState | NodeState, key: bytes) -> bytes:
        """``encode(state)``, with what is kept encoded per key spliced in."""
        return self._kept.encode(state, key)

    def encoded_state(self, t: GpuTracker, now_ms: int) -> Encoded:
        """GPU ``t``'s state now, encoded as ``publish`` encodes ``t.state(now_ms)`` (key, bytes): what the processor
        renders states with (``StreamProcessor.render``) where this publisher sends them; GPU states only."""
        return self._kept.encode_tracker(t, now_ms)

    def forget(self, keys: Iterable[bytes]) -> None:
        """Let go of these keys' kept fields (their GPUs' trackers, or their nodes, are dropped)."""
        self._kept.forget(keys)

    async def publish(self, states: Sequence[GpuState | NodeState | Encoded], headers: Headers = ()) -> None:
        if not states:
            return

        def by_partition(partitions: list[int]) -> dict[int, list[Record]]:
            if partitions != self._partitions:  # (a topic given more partitions: keys move, as in the client)
                self._partitions, self._partition_of = partitions, {}
            out: dict[int, list[Record]] = {}
            for state in states:
                if type(state) is tuple:  # (already encoded: ``encoded_state``)
                    key, value = state
                else:
                    key = state.key()
                    value = self.encode(state, key)
                out.setdefault(self._partition(key), []).append((key, value))
            return out

        def done(partition: int, records: Sequence[Record], delivered: RecordMetadata | None,
                 error: BaseException | None) -> None:
            if error is None:
                self.stats.published[self.topic] += len(records)
            else:
                self._failed(len(states) if partition < 0 else len(records), error)

        # The first await: the sender takes its turn now, so the order of the calls is the order of the states.
        await self.sender.send(self.topic, by_partition, done, headers)

    def _failed(self, count: int, error: BaseException) -> None:
        self.stats.publish_failed += count
        log.warning("%d %s records not published: %s: %s", count, self.topic, type(error).__name__, error)
