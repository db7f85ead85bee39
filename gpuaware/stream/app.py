"""The Faust app: agents and timers around ``StreamProcessor``.

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
Undecodable or invalid records go to ``<topic>.dlq`` with the error in headers; processing goes on.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import faust
import faust.streams as faust_streams
from aiokafka.structs import TopicPartition
from opentelemetry import trace

from gpuaware.contract import topics
from gpuaware.contract.events import ClusterForecast, DecodeError, GpuEvent, TelemetryBatch, dead_letter, decode, encode
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
from gpuaware.stream.settings import StreamSettings

log = logging.getLogger(__name__)

PARTIAL_MAX_AGE_MS = 60_000
STORES = {"rocksdb": "rocksdb://", "memory": "memory://"}
# Faust sizes each partition's RocksDB for a large host (3 x 64 MiB memtables, a 2 GiB block cache),
# and a worker may hold 16 of them (8 actives, 8 standbys) in a 1 GiB pod. Snapshots are written on
# every batch but read only when a GPU's tracker is first loaded, so small memtables and cache do.
ROCKSDB_OPTIONS = {"write_buffer_size": 8 << 20, "max_write_buffer_number": 2, "block_cache_size": 16 << 20}


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


def create_app(kafka: KafkaSettings, settings: StreamSettings, cluster: str = "local",
               stats: StreamStats | None = None, verifier: NodeVerifier | None = None,
               after_revoke: Callable[[], None] | None = None) -> tuple[faust.App, StreamProcessor]:
    """``verifier``: when given, telemetry and events must carry their node's token (gpuaware.stream.identity).
    ``after_revoke``: called once the trackers of revoked partitions are dropped (the worker's collector policy)."""
    faust_fixes.install()
    if kafka.embedded_broker_compat:
        _patch_end_offsets(kafka)
    stats = stats or StreamStats()
    partitions = topics.spec(topics.TELEMETRY).partitions
    app = faust.App(
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
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    events = app.topic(topics.EVENTS, **raw)
    by_node_name = f"{settings.app_id}-events-by-node"
    events_by_node = app.topic(by_node_name, partitions=partitions, **raw)
    demand_topic = app.topic(f"{settings.app_id}-model-demand", partitions=1, **raw)
    inputs = app.topic(topics.TELEMETRY, by_node_name, **raw)
    out = {topics.CLUSTER_FORECAST: app.topic(topics.CLUSTER_FORECAST, **raw)}
    dlqs: dict[str, faust.Topic] = {}

    async def restored(event: Any) -> None:
        stats.changelog_restored["standby" if app.assignor.is_standby(event.message.tp) else "active"] += 1

    # node:<name> -> its GPUs' GpuTracker snapshots, hist:<name> -> their minute history, owner:<uuid> -> node
    # (gpuaware.stream.processor). Values are bytes (value_type=bytes: Faust's raw codec) that the processor encodes
    # once; Faust's JSON codec would encode each write twice, for the store and for the changelog. The
    # compaction settings also reach a changelog that Faust creates itself (ensure_topics normally creates it
    # first); Faust sets the cleanup policy.
    changelog = {k: v for k, v in changelog_spec(settings).configs().items() if k != "cleanup.policy"}
    table = app.Table("gpus", partitions=partitions, extra_topic_configs=changelog, on_changelog_event=restored,
                      value_type=bytes, options=ROCKSDB_OPTIONS if settings.store == "rocksdb" else None)

    async def producer() -> Any:
        # The app's own client, which Faust starts on first use and flushes before it commits offsets.
        return (await app.maybe_start_producer())._ensure_producer()

    # The table partitions this worker owns, as the rebalance signals say (the assignor's actives change only with
    # the next assignment, after a revocation): a changelog delivery sets a persisted offset only for these.
    owned: set[int] = set()
    changelog_out = ChangelogTable(table, BatchSender(producer), stats, owns=owned.__contains__)
    states_out = StatePublisher(topics.GPU_STATE, BatchSender(producer), stats)
    # A rollup per node every 5 s at most (1,250 a second at 50,000 GPUs): batches, as the states, not Faust messages.
    rollups_out = StatePublisher(topics.NODE_STATE, BatchSender(producer), stats, node_gpus())
    processor = StreamProcessor(changelog_out, tracker_settings(settings), stats, scope=_under)
    # A record that waited in the log longer than a heartbeat interval means the worker is catching up.
    lag_ms = settings.max_publish_interval_ms
    tracer = observability.tracer("gpuaware.stream")
    positions: dict[tuple[str, int], int] = {}

    def assigned(topic: str = topics.TELEMETRY) -> set[int]:
        return {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == topic}

    def send(topic: str, record: Any) -> None:
        out[topic].send_soon(key=record.key(), value=encode(record))
        stats.published[topic] += 1

    def to_dlq(message: Any, error: Exception) -> None:
        name, headers = dead_letter(message.topic, message.partition, message.offset, error)
        if name not in dlqs:
            dlqs[name] = app.topic(name, **raw)
        dlqs[name].send_soon(key=message.key, value=message.value, headers=headers)
        stats.dlq[message.topic] += 1
        log.warning("dead-lettered %s/%s@%s: %s", message.topic, message.partition, message.offset, error)

    def received(event: Any) -> Any:
        message = event.message
        stats.records[message.topic] += 1
        positions[(message.topic, message.partition)] = message.offset
        return message

    async def handle(events: list[Any]) -> None:
        """Apply ``events`` as one take: each node's table entry written, each GPU's state considered, once."""
        take = Take()
        now = now_ms()
        contexts = []
        for event in events:
            message = received(event)
            try:
                if message.topic == topics.TELEMETRY:
                    batch = decode(message.value, TelemetryBatch)
                    if verifier is not None:
                        await verifier.check(batch.node, _headers(message))
                    behind = _behind(message, now, lag_ms, _highwater(app, message.tp))
                    processor.apply_telemetry(batch, message.partition, now, take, behind, event)
                else:
                    processor.apply_event(decode(message.value, GpuEvent), message.partition, now, take, event)
            except (DecodeError, InvalidRecord) as exc:
                to_dlq(message, exc)
                continue
            if message.headers:
                contexts.append(observability.extract_context(_headers(message)))
        # The take's trace goes on from its first traced record (the others are linked) into its states.
        parent, links = _parent_and_links(contexts)
        with tracer.start_as_current_span("stream.process", context=parent, links=links,
                                          attributes={"messaging.batch.message_count": len(events)}):
            states = processor.finish(take, now_ms())
            # Both before the take's records are acknowledged; the states first: made now, they take their turn
            # before any later ones (a heartbeat's) can.
            await states_out.publish(states, observability.inject_headers() if states else ())
            await changelog_out.flush()

    @app.agent(inputs, name="process")
    async def process(stream: Any) -> None:
        if settings.take_max_records == 1:
            # One record at a time: Faust acks each record once its take is finished.
            async for event in stream.events():
                await handle([event])
            return
        # Takes of many records (the default; Faust's take_events, which acks a take's records after this body has
        # handled them): every node's entry is written, and every GPU's state considered, once per take.
        async for events in stream.take_events(settings.take_max_records, within=settings.take_within_s):
            await handle(events)

    @app.agent(events, name="rekey-events")
    async def rekey_events(stream: Any) -> None:
        async for event in stream.events():
            message = received(event)
            try:
                ev = decode(message.value, GpuEvent)
                check_event(ev)
                if verifier is not None:
                    await verifier.check(ev.node, _headers(message))
            except (DecodeError, InvalidRecord) as exc:
                to_dlq(message, exc)
                continue
            await events_by_node.send(key=ev.node.encode(), value=message.value,
                                      headers=without_token(_headers(message)))

    @app.timer(1.0, name="heartbeat")
    async def heartbeat() -> None:
        await states_out.publish(processor.heartbeats(now_ms(), assigned()))

    turns = itertools.count()

    # Each every node_state_interval_s, half an interval apart: at 50,000 GPUs the fleet check and the rollups took
    # ~0.2 s each, and together they held the loop (and every record behind it) for half a second at a time.
    @app.timer(settings.node_state_interval_s / 2, name="node-rollup")
    async def node_rollup() -> None:
        if next(turns) % 2 == 0:
            processor.fleet_check(now_ms(), assigned())
        else:
            await rollups_out.publish(processor.node_states(now_ms(), assigned()))

    @app.timer(settings.cluster_forecast_interval_s, name="demand-partials")
    async def demand_partials() -> None:
        ts = now_ms()
        for partition, partial in processor.demand_partials(sorted(assigned())).items():
            body = json.dumps({"ts_ms": ts, "demand": partial}).encode()
            await demand_topic.send(key=str(partition).encode(), value=body)

    partials: dict[str, tuple[int, Partial]] = {}
    last_forecast = [0]

    @app.agent(demand_topic, name="cluster-forecast")
    async def cluster_forecast(stream: Any) -> None:
        async for event in stream.events():
            message = received(event)
            try:
                body = json.loads(message.value)
                partials[message.key.decode()] = (int(body["ts_ms"]), body["demand"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                to_dlq(message, exc)
                continue
            ts = now_ms()
            if ts - last_forecast[0] < settings.cluster_forecast_interval_s * 500:
                continue
            last_forecast[0] = ts
            fresh = {k: p for k, (t, p) in partials.items() if ts - t <= PARTIAL_MAX_AGE_MS}
            stats.demand = merge_demand(fresh)
            send(topics.CLUSTER_FORECAST, ClusterForecast(cluster, ts, stats.demand))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set, **_: Any) -> None:
        gone = {tp.partition for tp in revoked if tp.topic == topics.TELEMETRY}
        if gone:
            await changelog_out.hand_over()  # while they are still this worker's (gpuaware.stream.changelog)
        owned.difference_update(gone)
        states_out.forget([k.encode() for k, p in processor.partition_of.items() if p in gone])
        rollups_out.forget([n.encode() for n, p in processor.node_partition.items() if p in gone])
        processor.forget(gone)
        if revoked and after_revoke is not None:
            after_revoke()  # after the forget: what it dropped is what the next full collection may free

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned_tps: set, **_: Any) -> None:
        # Newly assigned partitions are reloaded from the recovered table, never from a stale cache.
        mine = {tp.partition for tp in assigned_tps if tp.topic == topics.TELEMETRY}
        owned.update(mine)
        processor.forget(mine)

    consumed = {topics.TELEMETRY, topics.EVENTS, by_node_name, demand_topic.get_topic_name()}
    app.gpuaware_lag = lambda: _lag(app, positions, consumed)  # type: ignore[attr-defined]
    # What the worker's consumer asks the broker to hold a fetch for (faust_fixes, fix 4).
    app.gpuaware_fetch_max_wait_ms = kafka.fetch_max_wait_ms  # type: ignore[attr-defined]
    # What Faust's producer flush runs before a commit: the changelog's failed records stored first (fix 5).
    app.gpuaware_after_flush = changelog_out.settle  # type: ignore[attr-defined]
    return app, processor


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


def _lag(app: faust.App, positions: dict[tuple[str, int], int], consumed: set[str]) -> dict[tuple[str, int], int]:
    """Log end minus position for the partitions this worker processes (not the changelogs it restores)."""
    out: dict[tuple[str, int], int] = {}
    try:
        actives = app.assignor.assigned_actives()
    except Exception:  # not assigned yet
        return out
    for tp in actives:
        if tp.topic not in consumed:
            continue
        try:
            hw = app.consumer.highwater(tp)
        except Exception:
            continue
        if hw is None:
            continue
        out[(tp.topic, tp.partition)] = max(0, hw - positions.get((tp.topic, tp.partition), -1) - 1)
    return out
