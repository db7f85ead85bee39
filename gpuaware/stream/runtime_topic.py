"""The runtime forecaster on Kafka: completions in (``job.completions.v1``), per-key statistics out
(``job.runtime.v1``, compacted, keyed by signature key).

Single writer. Both topics have one partition, so in a group of stream workers exactly one owns the learning at a
time (the worker assigned ``job.completions.v1``'s partition): every key's statistics have one writer, whichever
workload a completion is of. The volume is one record per job that ends, which one worker keeps up with easily.

What is published per completion, in this order: each key it changed (its signature keys, then its ``declared:``
keys), a tombstone for each key the forecaster dropped (``max_keys``, least recently used first), ``#seen:`` and
the completion's workload id and end (and a tombstone for the one that left the last ``remember``), then ``#z90``
(the p90's score and the completions learned). Every record carries ``through``: the offset of the completion it
was published for. A compacted log keeps the newest record of each key at its offset, so reading it in offset
order replays the keys in the order they were last used: ``restore`` rebuilds the forecaster's ``state()``
exactly, least recently used first, after a restart or when another worker takes the partition over.

Each completion is learned once. A completion at or below ``#z90``'s ``through`` was learned already (its
statistics were published before its offset was committed) and is skipped: at-least-once delivery. A worker that
stopped part-way through one completion's records left some keys with a later ``through``: learning that
completion again changes only the keys not published yet. A completion published twice by the scheduler (at a
leader change, or after a restart: ``gpuaware.scheduler.kube.completions``) has a workload id and end among the
last ``remember`` learned (``#seen:``) and is dropped. A completion with a runtime or declared duration that is not
a positive finite number, or no signature, changes nothing and raises ``InvalidRecord`` (the DLQ).
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


SEEN = "#seen:"


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def check(c: JobCompletion) -> None:
    """Raises ``InvalidRecord`` for a completion that cannot be learned."""
    if not _positive(c.runtime_s) or not c.signature or not all(c.signature) or c.ts_ms < 0:
        raise InvalidRecord(f"a completion needs a positive runtime, a signature and an end: {c.runtime_s!r}, "
                            f"{c.signature!r}, {c.ts_ms!r}")
    if (c.declared_s is not None and not _positive(c.declared_s)) or not all(c.declared_keys):
        raise InvalidRecord(f"a declared duration must be a positive number of seconds: {c.declared_s!r}")


class RuntimeLearner:
    def __init__(self, forecaster: RuntimeForecaster | None = None, remember: int = 4096) -> None:
        self.forecaster = forecaster or RuntimeForecaster()
        self.remember = remember
        self.through = -1  # the offset of the last completion learned
        self.seen: OrderedDict[str, int] = OrderedDict()  # workload id@end -> offset, the last ``remember``
        self.ahead: dict[str, int] = {}  # keys published for a completion past ``through`` (a stop part-way)

    def learn(self, c: JobCompletion, offset: int) -> Publish:
        """Learn completion ``c`` (at ``offset`` in ``job.completions.v1``); the records that say what changed.
        Raises ``InvalidRecord`` for a completion that cannot be learned (it goes to the DLQ)."""
        if offset <= self.through:
            return []
        check(c)
        ident = f"{c.workload_id}@{c.ts_ms}"
        if self.seen.get(ident, offset) != offset:
            return []  # published twice: learned at its first offset
        done = {k for k, at in self.ahead.items() if at >= offset}
        f = self.forecaster
        declared = c.declared_s is not None and bool(c.declared_keys)
        try:
            f.learn_one(c.signature, c.runtime_s, skip=done)
            if declared:
                f.learn_declared(c.declared_keys, c.runtime_s, c.declared_s, skip=done)
        except ValueError as exc:  # check() lets none through; never a crash of the agent
            raise InvalidRecord(str(exc)) from exc
        touched = list(dict.fromkeys(c.signature))
        if declared:
            touched += [k for k in dict.fromkeys(c.declared_keys) if k not in touched]
        self.through = offset
        self.ahead = {k: at for k, at in self.ahead.items() if at > offset}
        out: Publish = []
        for key in touched:
            s = f.keys.get(key)
            if s is not None and key not in done:
                out.append((key.encode(), encode(JobRuntime(key, c.ts_ms, s.n, s.mean, s.m2, offset))))
        out += [(key.encode(), None) for key in f.evicted]
        f.evicted.clear()
        if ident not in self.seen:
            self.seen[ident] = offset
            out.append(((SEEN + ident).encode(), encode(JobRuntime(SEEN + ident, c.ts_ms, 1, 0.0, 0.0, offset))))
        while len(self.seen) > self.remember:
            out.append(((SEEN + self.seen.popitem(last=False)[0]).encode(), None))
        out.append((META.encode(), encode(JobRuntime(META, c.ts_ms, f.learned, f.z90, 0.0, offset))))
        return out

    def restore(self, records: Iterable[tuple[str, JobRuntime | None]]) -> None:
        """Rebuild from ``job.runtime.v1`` read in offset order ((key, record), None: a tombstone)."""
        keys: OrderedDict[str, JobRuntime] = OrderedDict()
        for key, r in records:
            if r is None:
                keys.pop(key, None)
                continue
            keys[key] = r
            keys.move_to_end(key)
        meta = keys.pop(META, None)
        self.through = meta.through if meta is not None and meta.through is not None else -1
        self.seen = OrderedDict((k[len(SEEN):], r.through if r.through is not None else -1)
                                for k, r in keys.items() if k.startswith(SEEN))
        stats = [(k, (r.n, r.mean, r.m2)) for k, r in keys.items() if not k.startswith(SEEN)]
        self.ahead = {k: r.through for k, r in keys.items()
                      if not k.startswith(SEEN) and r.through is not None and r.through > self.through}
        self.forecaster.restore([*stats, *([(META, (meta.n, meta.mean, meta.m2))] if meta is not None else [])])


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
