"""The stream worker (``StreamWorker``): a Faust app whose agents and timers are the worker's methods, around its
``StreamProcessor``.

Tasks, one per concern:
- ``process``: telemetry (keyed by node) and GPU events re-keyed by node, on co-partitioned topics,
  into the changelog-backed ``gpus`` table; publishes ``gpu.state.v1`` (``gpuaware.stream.publisher``: a batch per
  partition, not a Faust message per state).
- ``rekey_events``: ``gpu.events.v1`` is keyed by GPU UUID; events are forwarded, verbatim, to an
  internal topic keyed by node so each GPU's events meet its telemetry in one partition.
- ``heartbeat`` / ``node_rollup`` timers: bounded-rate republishing and ``node.state.v1`` (batches too); half an
  interval before each rollup, the fleet peer check (``gpuaware.stream.fleet_peers``) of the GPUs this worker owns.
- ``demand_partials`` timer + ``cluster_forecast`` agent: every worker publishes per-model demand of
  its partitions to a one-partition internal topic; its single owner merges them into
  ``cluster.forecast.v1``.
- ``job_runtimes`` agent: the owner of ``job.completions.v1``'s one partition learns each job's runtime and
  publishes the keys it changed on ``job.runtime.v1`` (``gpuaware.stream.runtime_topic``); it restores the
  forecaster from that topic first whenever it (re)gains the partition.
Undecodable or invalid records go to ``<topic>.dlq`` with the error in headers; processing goes on.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import faust.streams as faust_streams
from aiokafka.structs import TopicPartition
from opentelemetry import trace

from gpuaware.contract import topics
from gpuaware.contract.events import (
    ClusterForecast,
    DecodeError,
    GpuEvent,
    JobCompletion,
    TelemetryBatch,
    dead_letter,
    decode,
    encode,
)
from gpuaware.plumbing import observability
from gpuaware.plumbing.kafka_admin import end_offsets
from gpuaware.plumbing.kafka_batches import BatchSender
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.stream import faust_fixes
from gpuaware.stream.changelog import ChangelogTable
from gpuaware.stream.gpu_state import TrackerSettings
from gpuaware.stream.identity import NodeVerifier, without_token
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.processor import InvalidRecord, StreamProcessor, Take, check_event
from gpuaware.stream.publisher import StatePublisher, node_gpus
from gpuaware.stream.rollup import Partial, merge_demand
from gpuaware.stream.runtime import RuntimeForecaster
from gpuaware.stream.runtime_topic import RuntimeLearner, read_runtimes
from gpuaware.stream.settings import StreamSettings

log = logging.getLogger(__name__)

PARTIAL_MAX_AGE_MS = 60_000
STORES = {"rocksdb": "rocksdb://", "memory": "memory://"}
# Faust sizes each partition's RocksDB for a large host (3 x 64 MiB memtables, a 2 GiB block cache),
# and a worker may hold 16 of them (8 actives, 8 standbys) in a 1 GiB pod. Snapshots are written on
# every batch but read only when a GPU's tracker is first loaded, so small memtables and cache do.
ROCKSDB_OPTIONS = {"write_buffer_size": 8 << 20, "max_write_buffer_number": 2, "block_cache_size": 16 << 20}
RAW = {"key_serializer": "raw", "value_serializer": "raw"}  # the contract's records are encoded, and decoded, here


def changelog_spec(settings: StreamSettings) -> topics.TopicSpec:
    """The ``gpus`` table's changelog: compacted node entries (their GPUs' snapshots) and GPU owners."""
    return topics.TopicSpec(f"{settings.app_id}-gpus-changelog", topics.spec(topics.TELEMETRY).partitions,
                            "compact", None, "node:<name>, hist:<name> or owner:<GPU UUID>",
                            "changelog of the per-GPU state table",
                            topics.HIGH_VOLUME_STATE)


def internal_topics(settings: StreamSettings) -> list[topics.TopicSpec]:
    """Faust's own topics, created up front with the right partition counts (Tansu would guess 4)."""
    n = topics.spec(topics.TELEMETRY).partitions
    return [
        topics.TopicSpec(f"{settings.app_id}-events-by-node", n, "delete", topics.HOUR_MS, "node name",
                         "gpu.events.v1 re-keyed by node"),
        changelog_spec(settings),
        topics.TopicSpec(f"{settings.app_id}-model-demand", 1, "delete", topics.HOUR_MS, "partition",
                         "per-partition demand partials"),
        topics.TopicSpec(f"{settings.app_id}-__assignor-__leader", 1, "delete", None, "", "Faust leader election"),
    ]


def _patch_end_offsets(kafka: KafkaSettings) -> None:
    """Tansu answers ListOffsets(latest) wrongly; table recovery must read true ends (see docs/broker.md)."""
    from faust.transport.drivers import aiokafka as driver

    async def _highwaters(self: Any, partitions: list) -> dict:
        if not partitions:
            return {}
        ends = await end_offsets(kafka, [TopicPartition(tp.topic, tp.partition) for tp in partitions])
        return {tp: ends[TopicPartition(tp.topic, tp.partition)] for tp in partitions}

    driver.AIOKafkaConsumerThread._highwaters = _highwaters


def tracker_settings(settings: StreamSettings) -> TrackerSettings:
    """What the ``stream:`` section says about each GPU's state."""
    return TrackerSettings(
        horizons_min=tuple(settings.horizons_min), min_interval_ms=settings.min_publish_interval_ms,
        max_interval_ms=settings.max_publish_interval_ms, every_sample=settings.publish_every_sample,
        max_clock_skew_ms=int(settings.max_clock_skew_s * 1000),
        rehome_after_ms=int(settings.gpu_rehome_after_s * 1000),
    )


def now_ms() -> int:
    return int(time.time() * 1000)


class StreamApp(faust.App):
    """Faust's app, with what the worker's fixes of Faust read from it (gpuaware.stream.faust_fixes)."""

    # What the worker's consumer asks the broker to hold a fetch for (fix 4); None: Faust's own 1,500 ms.
    gpuaware_fetch_max_wait_ms: int | None = None
    # What Faust's producer flush runs before a commit (fix 5): the changelog's failed records stored first.
    gpuaware_after_flush: Callable[[], Awaitable[None]] | None = None


class StreamWorker:
    """One stream worker: its Faust app, its ``StreamProcessor``, and what the app's agents, timers and rebalance
    handlers share (the publishers, the DLQ topics, the consumed positions, the demand partials), one method each.

    ``verifier``: when given, telemetry and events must carry their node's token (gpuaware.stream.identity).
    ``after_revoke``: called once the trackers of revoked partitions are dropped (the worker's collector policy)."""

    def __init__(self, kafka: KafkaSettings, settings: StreamSettings, cluster: str = "local",
                 stats: StreamStats | None = None, verifier: NodeVerifier | None = None,
                 after_revoke: Callable[[], None] | None = None):
        faust_fixes.install()
        if kafka.embedded_broker_compat:
            _patch_end_offsets(kafka)
        self.settings, self.cluster, self.verifier, self.after_revoke = settings, cluster, verifier, after_revoke
        self.kafka = kafka
        self.stats = stats = stats or StreamStats()
        partitions = topics.spec(topics.TELEMETRY).partitions
        self.app = app = StreamApp(
            settings.app_id,
            **kafka.faust_settings(),
            store=STORES[settings.store],
            topic_partitions=partitions,
            topic_replication_factor=settings.replication_factor,
            table_standby_replicas=settings.standby_replicas,
            consumer_auto_offset_reset="earliest",
            web_enabled=False,
            datadir=settings.data_dir,
        )
        by_node_name = f"{settings.app_id}-events-by-node"
        self.events_by_node = app.topic(by_node_name, partitions=partitions, **RAW)
        self.demand_topic = app.topic(f"{settings.app_id}-model-demand", partitions=1, **RAW)
        self.forecasts = app.topic(topics.CLUSTER_FORECAST, **RAW)
        self.runtimes = app.topic(topics.JOB_RUNTIME, **RAW)
        self.learner = RuntimeLearner(RuntimeForecaster(max_keys=settings.runtime_max_keys))
        self.learner_ready = False  # restored from job.runtime.v1 since this worker last gained the completions
        self.dlqs: dict[str, faust.Topic] = {}
        # node:<name> -> its GPUs' GpuTracker snapshots, hist:<name> -> their minute history, owner:<uuid> -> node
        # (gpuaware.stream.processor). Values are bytes (value_type=bytes: Faust's raw codec) that the processor
        # encodes once; Faust's JSON codec would encode each write twice, for the store and for the changelog. The
        # compaction settings also reach a changelog that Faust creates itself (ensure_topics normally creates it
        # first); Faust sets the cleanup policy.
        changelog = {k: v for k, v in changelog_spec(settings).configs().items() if k != "cleanup.policy"}
        table = app.Table("gpus", partitions=partitions, extra_topic_configs=changelog,
                          on_changelog_event=self.restored, value_type=bytes,
                          options=ROCKSDB_OPTIONS if settings.store == "rocksdb" else None)
        # The table partitions this worker owns, as the rebalance signals say (the assignor's actives change only
        # with the next assignment, after a revocation): a changelog delivery sets a persisted offset only for these.
        self.owned: set[int] = set()
        self.changelog = ChangelogTable(table, BatchSender(self.producer), stats, owns=self.owned.__contains__)
        self.states = StatePublisher(topics.GPU_STATE, BatchSender(self.producer), stats)
        # A rollup per node every 5 s at most (1,250 a second at 50,000 GPUs): batches, as the states, not Faust
        # messages.
        self.rollups = StatePublisher(topics.NODE_STATE, BatchSender(self.producer), stats, node_gpus())
        self.processor = StreamProcessor(self.changelog, tracker_settings(settings), stats, scope=_under,
                                         entry_version=settings.node_entry_version)
        self.processor.render = self.states.encoded_state  # states written straight from the trackers
        # A record that waited in the log longer than a heartbeat interval means the worker is catching up.
        self.lag_ms = settings.max_publish_interval_ms
        self.tracer = observability.tracer("gpuaware.stream")
        self.positions: dict[tuple[str, int], int] = {}
        self.turns = itertools.count()
        self.partials: dict[str, tuple[int, Partial]] = {}
        self.last_forecast_ms = 0
        self.consumed = {topics.TELEMETRY, topics.EVENTS, by_node_name, self.demand_topic.get_topic_name(),
                         topics.JOB_COMPLETIONS}

        app.agent(app.topic(topics.TELEMETRY, by_node_name, **RAW), name="process")(self.process)
        app.agent(app.topic(topics.EVENTS, **RAW), name="rekey-events")(self.rekey_events)
        app.timer(1.0, name="heartbeat")(self.heartbeat)
        # Each every node_state_interval_s, half an interval apart: at 50,000 GPUs the fleet check and the rollups
        # took ~0.2 s each, and together they held the loop (and every record behind it) for half a second at a time.
        app.timer(settings.node_state_interval_s / 2, name="node-rollup")(self.node_rollup)
        app.timer(settings.cluster_forecast_interval_s, name="demand-partials")(self.demand_partials)
        app.agent(self.demand_topic, name="cluster-forecast")(self.cluster_forecast)
        app.agent(app.topic(topics.JOB_COMPLETIONS, **RAW), name="job-runtimes")(self.job_runtimes)
        app.on_partitions_revoked.connect(self.on_revoked)
        app.on_partitions_assigned.connect(self.on_assigned)
        app.gpuaware_fetch_max_wait_ms = kafka.fetch_max_wait_ms
        app.gpuaware_after_flush = self.changelog.settle

    async def restored(self, event: Any) -> None:
        self.stats.changelog_restored["standby" if self.app.assignor.is_standby(event.message.tp) else "active"] += 1

    async def producer(self) -> Any:
        # The app's own client, which Faust starts on first use and flushes before it commits offsets.
        return (await self.app.maybe_start_producer())._ensure_producer()

    def assigned(self, topic: str = topics.TELEMETRY) -> set[int]:
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic}

    def to_dlq(self, message: Any, error: Exception) -> None:
        name, headers = dead_letter(message.topic, message.partition, message.offset, error)
        if name not in self.dlqs:
            self.dlqs[name] = self.app.topic(name, **RAW)
        self.dlqs[name].send_soon(key=message.key, value=message.value, headers=headers)
        self.stats.dlq[message.topic] += 1
        log.warning("dead-lettered %s/%s@%s: %s", message.topic, message.partition, message.offset, error)

    def received(self, event: Any) -> Any:
        message = event.message
        self.stats.records[message.topic] += 1
        self.positions[(message.topic, message.partition)] = message.offset
        return message

    async def handle(self, events: list[Any]) -> None:
        """Apply ``events`` as one take: each node's table entry written, each GPU's state considered, once."""
        take = Take()
        now = now_ms()
        contexts = []
        for event in events:
            message = self.received(event)
            try:
                if message.topic == topics.TELEMETRY:
                    batch = decode(message.value, TelemetryBatch)
                    if self.verifier is not None:
                        await self.verifier.check(batch.node, _headers(message))
                    behind = _behind(message, now, self.lag_ms, _highwater(self.app, message.tp))
                    self.processor.apply_telemetry(batch, message.partition, now, take, behind, event)
                else:
                    self.processor.apply_event(decode(message.value, GpuEvent), message.partition, now, take, event)
            except (DecodeError, InvalidRecord) as exc:
                self.to_dlq(message, exc)
                continue
            if message.headers:
                contexts.append(observability.extract_context(_headers(message)))
        # The take's trace goes on from its first traced record (the others are linked) into its states.
        parent, links = _parent_and_links(contexts)
        with self.tracer.start_as_current_span("stream.process", context=parent, links=links,
                                               attributes={"messaging.batch.message_count": len(events)}):
            states = self.processor.finish(take, now_ms())
            # Both before the take's records are acknowledged; the states first: made now, they take their turn
            # before any later ones (a heartbeat's) can.
            await self.states.publish(states, observability.inject_headers() if states else ())
            await self.changelog.flush()

    async def process(self, stream: Any) -> None:
        """Telemetry and the events re-keyed by node, into the table and ``gpu.state.v1``."""
        if self.settings.take_max_records == 1:
            # One record at a time: Faust acks each record once its take is finished.
            async for event in stream.events():
                await self.handle([event])
            return
        # Takes of many records (the default; Faust's take_events, which acks a take's records after this body has
        # handled them): every node's entry is written, and every GPU's state considered, once per take.
        async for events in stream.take_events(self.settings.take_max_records, within=self.settings.take_within_s):
            await self.handle(events)

    async def rekey_events(self, stream: Any) -> None:
        async for event in stream.events():
            message = self.received(event)
            try:
                ev = decode(message.value, GpuEvent)
                check_event(ev)
                if self.verifier is not None:
                    await self.verifier.check(ev.node, _headers(message))
            except (DecodeError, InvalidRecord) as exc:
                self.to_dlq(message, exc)
                continue
            await self.events_by_node.send(key=ev.node.encode(), value=message.value,
                                           headers=without_token(_headers(message)))

    async def heartbeat(self) -> None:
        await self.states.publish(self.processor.heartbeats(now_ms(), self.assigned()))

    async def node_rollup(self) -> None:
        if next(self.turns) % 2 == 0:
            self.processor.fleet_check(now_ms(), self.assigned())
        else:
            await self.rollups.publish(self.processor.node_states(now_ms(), self.assigned()))

    async def demand_partials(self) -> None:
        ts = now_ms()
        for partition, partial in self.processor.demand_partials(sorted(self.assigned())).items():
            body = json.dumps({"ts_ms": ts, "demand": partial}).encode()
            await self.demand_topic.send(key=str(partition).encode(), value=body)

    async def cluster_forecast(self, stream: Any) -> None:
        """The demand partials' single owner: merges the fresh ones into ``cluster.forecast.v1``."""
        async for event in stream.events():
            message = self.received(event)
            try:
                body = json.loads(message.value)
                self.partials[message.key.decode()] = (int(body["ts_ms"]), body["demand"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.to_dlq(message, exc)
                continue
            ts = now_ms()
            if ts - self.last_forecast_ms < self.settings.cluster_forecast_interval_s * 500:
                continue
            self.last_forecast_ms = ts
            fresh = {k: p for k, (t, p) in self.partials.items() if ts - t <= PARTIAL_MAX_AGE_MS}
            self.stats.demand = merge_demand(fresh)
            record = ClusterForecast(self.cluster, ts, self.stats.demand)
            self.forecasts.send_soon(key=record.key(), value=encode(record))
            self.stats.published[topics.CLUSTER_FORECAST] += 1

    async def job_runtimes(self, stream: Any) -> None:
        """``job.completions.v1``'s single owner: learns each completion, publishes what changed on ``job.runtime.v1``
        (sent before the completion's offset is committed: Faust flushes its producer first)."""
        async for event in stream.events():
            message = self.received(event)
            if not self.learner_ready:
                self.learner.restore(await read_runtimes(self.kafka))
                self.learner_ready = True
            try:
                out = self.learner.learn(decode(message.value, JobCompletion), message.offset)
            except (DecodeError, InvalidRecord) as exc:
                self.to_dlq(message, exc)
                continue
            for key, value in out:
                await self.runtimes.send(key=key, value=value)
            self.stats.published[topics.JOB_RUNTIME] += len(out)

    async def on_revoked(self, sender: Any, revoked: set, **_: Any) -> None:
        if any(tp.topic == topics.JOB_COMPLETIONS for tp in revoked):
            self.learner_ready = False  # another worker may learn meanwhile: restore from the topic when back
        gone = {tp.partition for tp in revoked if tp.topic == topics.TELEMETRY}
        if gone:
            await self.changelog.hand_over()  # while they are still this worker's (gpuaware.stream.changelog)
        self.owned.difference_update(gone)
        processor = self.processor
        self.states.forget([k.encode() for k, p in processor.partition_of.items() if p in gone])
        self.rollups.forget([n.encode() for n, p in processor.node_partition.items() if p in gone])
        processor.forget(gone)
        if revoked and self.after_revoke is not None:
            self.after_revoke()  # after the forget: what it dropped is what the next full collection may free

    async def on_assigned(self, sender: Any, assigned_tps: set, **_: Any) -> None:
        # Newly assigned partitions are reloaded from the recovered table, never from a stale cache.
        mine = {tp.partition for tp in assigned_tps if tp.topic == topics.TELEMETRY}
        self.owned.update(mine)
        self.processor.forget(mine)

    def lag(self) -> dict[tuple[str, int], int]:
        """Log end minus position for the partitions this worker processes (not the changelogs it restores)."""
        out: dict[tuple[str, int], int] = {}
        app = self.app
        try:
            actives = app.assignor.assigned_actives()
        except Exception:  # not assigned yet
            return out
        for tp in actives:
            if tp.topic not in self.consumed:
                continue
            try:
                hw = app.consumer.highwater(tp)
            except Exception:
                continue
            if hw is None:
                continue
            out[(tp.topic, tp.partition)] = max(0, hw - self.positions.get((tp.topic, tp.partition), -1) - 1)
        return out


def _behind(message: Any, now_ms: int, lag_ms: int, highwater: int | None) -> bool:
    """Catching up: newer records follow this one in its partition (by the high watermark of the last
    fetch) and it was appended more than ``lag_ms`` ago (its log timestamp; Faust gives seconds). Both,
    so that the last record of a partition is never held back, whatever the producer's clock says."""
    ts = message.timestamp
    return (ts is not None and ts > 0 and now_ms - ts * 1000 > lag_ms
            and highwater is not None and highwater - message.offset > 1)


def _under(event: Any) -> None:
    """The processor's ``scope``: make ``event`` the record Faust's table works under. Faust puts a table write in
    the partition of the current event, and its RocksDB store reads a key only from that partition's database (a
    context variable that its stream iteration sets). An agent handling a take has none of its own, so each
    record is applied under itself (a node's entry, read the first time a record of the node comes, is found in
    the record's partition; left at a previous take's record, a worker that took over a partition read its nodes
    as new and lost their history) and each node is written under the record that last touched it. Set in the
    agent's own task only: the stream's ``current_event`` attribute, which ``take_events`` reads while filling
    the next take, is left alone."""
    faust_streams._current_event.set(weakref.ref(event))


def _parent_and_links(contexts: list[Any]) -> tuple[Any, list[trace.Link] | None]:
    """The first traced record's context as the take's parent, the other traced records' spans as links."""
    spans = [trace.get_current_span(c).get_span_context() for c in contexts]
    traced = [(c, s) for c, s in zip(contexts, spans, strict=True) if s.is_valid]
    if not traced:
        return None, None
    return traced[0][0], [trace.Link(s) for _, s in traced[1:]] or None


def _highwater(app: faust.App, tp: Any) -> int | None:
    try:
        return app.consumer.highwater(tp)
    except Exception:  # not assigned (any more): treated as caught up
        return None


def _headers(message: Any) -> list[tuple[str, bytes]]:
    """Faust gives headers as a list of pairs or as a mapping, depending on the path."""
    headers = message.headers or []
    return list(headers.items()) if hasattr(headers, "items") else list(headers)
