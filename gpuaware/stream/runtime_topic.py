"""The runtime forecaster on Kafka: completions in (``job.completions.v1``), per-key statistics out
(``job.runtime.v1``, compacted, keyed by signature key).

Single writer. Both topics have one partition, so in a group of stream workers exactly one owns the learning at a
time (the worker assigned ``job.completions.v1``'s partition): every key's statistics have one writer, whichever
workload a completion is of. The volume is one record per job that ends, which one worker keeps up with easily.

What is published per completion, in this order: each key it changed (its signature keys, then its ``declared:``
keys), a tombstone for each key the forecaster dropped (``max_keys``, least recently used first), then ``#z90``
(the p90's score, the completions learned, and ``through``: the completion's offset). A compacted log keeps the
newest record of each key at its offset, so reading it in offset order replays the keys in the order they were
last used: ``restore`` rebuilds the forecaster's ``state()`` exactly, least recently used first, after a restart
or when another worker takes the partition over. A completion at or below ``through`` was learned already (its
statistics were published before its offset was committed) and is skipped: at-least-once delivery, each
completion learned once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.contract.events import DecodeError, JobCompletion, JobRuntime, decode, encode
from gpuaware.plumbing.kafka_admin import end_offsets
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.stream.processor import InvalidRecord
from gpuaware.stream.runtime import RuntimeForecaster

META = "#z90"
Publish = list[tuple[bytes, bytes | None]]  # (key, value; None: a tombstone), in the order to send them


class RuntimeLearner:
    def __init__(self, forecaster: RuntimeForecaster | None = None) -> None:
        self.forecaster = forecaster or RuntimeForecaster()
        self.through = -1  # the offset of the last completion learned

    def learn(self, c: JobCompletion, offset: int) -> Publish:
        """Learn completion ``c`` (at ``offset`` in ``job.completions.v1``); the records that say what changed.
        Raises ``InvalidRecord`` for a completion that cannot be learned (it goes to the DLQ)."""
        if offset <= self.through:
            return []
        if not (c.runtime_s > 0 and math.isfinite(c.runtime_s)) or not c.signature:
            raise InvalidRecord(f"a completion needs a positive runtime and a signature: {c.runtime_s!r}, "
                                f"{c.signature!r}")
        f = self.forecaster
        f.learn_one(c.signature, c.runtime_s)
        touched = list(dict.fromkeys(c.signature))
        if c.declared_s is not None and c.declared_s > 0 and c.declared_keys:
            f.learn_declared(c.declared_keys, c.runtime_s, c.declared_s)
            touched += [k for k in dict.fromkeys(c.declared_keys) if k not in touched]
        self.through = offset
        out: Publish = []
        for key in touched:
            s = f.keys.get(key)
            if s is not None:
                out.append((key.encode(), encode(JobRuntime(key, c.ts_ms, s.n, s.mean, s.m2))))
        out += [(key.encode(), None) for key in f.evicted]
        f.evicted.clear()
        out.append((META.encode(), encode(JobRuntime(META, c.ts_ms, f.learned, f.z90, 0.0, offset))))
        return out

    def restore(self, records: Iterable[tuple[str, JobRuntime | None]]) -> None:
        """Rebuild from ``job.runtime.v1`` read in offset order ((key, record), None: a tombstone)."""
        keys: OrderedDict[str, tuple[int, float, float]] = OrderedDict()
        self.through = -1
        for key, r in records:
            if r is None:
                keys.pop(key, None)
                continue
            keys[key] = (r.n, r.mean, r.m2)
            keys.move_to_end(key)
            if key == META and r.through is not None:
                self.through = r.through
        meta = keys.pop(META, None)
        self.forecaster.restore([*keys.items(), *([(META, meta)] if meta is not None else [])])


async def read_runtimes(kafka: KafkaSettings) -> list[tuple[str, JobRuntime | None]]:
    """``job.runtime.v1`` from its beginning to its end now, in offset order (undecodable records skipped: the
    scheduler's feed dead-letters them)."""
    tp = TopicPartition(topics.JOB_RUNTIME, 0)
    end = (await end_offsets(kafka, [tp]))[tp]
    out: list[tuple[str, JobRuntime | None]] = []
    if end == 0:
        return out
    consumer = AIOKafkaConsumer(**kafka.consumer_kwargs(None))
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while await consumer.position(tp) < end:
            for m in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if m.offset >= end or m.key is None:
                    continue
                try:
                    out.append((m.key.decode(), None if m.value is None else decode(m.value, JobRuntime)))
                except (DecodeError, UnicodeDecodeError):
                    continue
    finally:
        await consumer.stop()
    return out
