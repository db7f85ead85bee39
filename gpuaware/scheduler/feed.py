"""The scheduler's view of live state: ``gpu.state.v1``, ``node.state.v1``, ``cluster.forecast.v1`` and
``job.runtime.v1`` (the runtime statistics per signature key, into ``StateView.runtimes``:
``gpuaware.scheduler.runtimes``; a tombstone removes a key).

``StateView`` is pure: it keeps the newest record per key and writes what the scheduling core
needs (health band, live and forecast utilisation, temperature) into a ``ClusterState``. A GPU
whose state is older than ``stale_after_ms`` is treated conservatively: at least degraded, so it
takes only preemptible work, and its forecast is taken as fully busy.

Clocks. Staleness is judged on two clocks, and the older answer wins: the sample time in the
record (the agent's and stream's clocks) and the arrival, on this scheduler's clock, of the record
that last carried a new sample. So a GPU whose stamps run ahead still goes stale once its
samples stop arriving. A record stamped more than ``max_skew_ms`` ahead of its arrival is
rejected and counted (``skew_rejected``): kept, it would win every newest-record comparison and
freeze that GPU (or node) at a value nothing genuine could replace.

Feed outages. The stream republishes every GPU's state at least every 30 s, so a live pipeline
always delivers records; when none has arrived for ``stale_after_ms`` the feed itself is down (a
broker or stream outage), not the GPUs. Then every GPU would look stale at once and be degraded,
and high-priority work could not be placed anywhere. Instead the view freezes time at the last
record it received (``outage``): a GPU is judged stale as of that moment, so a GPU already stale
then stays degraded, and the others keep their last known band; every forecast is taken as fully
busy (no sharing or packing on top of utilisation nobody can see). ``gpuaware_scheduler_feed_outage``
says so and an alert fires (docs/runbooks.md#gpuawareschedulerfeedoutage); it ends with the first
record after the outage.

``StateFeed`` reads the four compacted topics from the beginning with a plain consumer (no
group: every scheduler replica needs all of it), and ``catch_up()`` returns only once it has
read up to the log ends it saw at start, so no decision is made on a partial picture. How long
that takes grows with the log, so the wait is bounded by progress (``gpuaware.scheduler.catchup``), not
by wall time: it fails only when the consumed offsets stop advancing for ``stall_timeout_s``.
Undecodable records go to the topic's ``.dlq`` and are counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from gpuaware.contract import topics
from gpuaware.contract.events import (
    ClusterForecast,
    DecodeError,
    GpuState,
    HealthBand,
    JobRuntime,
    NodeState,
    dead_letter,
    decode_for_topic,
)
from gpuaware.plumbing.kafka_admin import check_topics, end_offsets
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.scheduler.catchup import CatchUp
from gpuaware.scheduler.core.cluster import BAND_CODE, ClusterState
from gpuaware.scheduler.runtimes import RuntimeTable

log = logging.getLogger(__name__)

FEED_TOPICS = (topics.GPU_STATE, topics.NODE_STATE, topics.CLUSTER_FORECAST, topics.JOB_RUNTIME)
FORECAST_HORIZON_S = 300


@dataclass
class StateView:
    stale_after_ms: int = 90_000
    gpus: dict[str, GpuState] = field(default_factory=dict)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    forecast: ClusterForecast | None = None
    runtimes: RuntimeTable = field(default_factory=RuntimeTable)  # job.runtime.v1
    version: int = 0  # bumped by every record learned: readers re-apply only after a change
    # Per GPU, the Kafka headers of the state that last changed its health band: the trace context
    # (agent event -> stream state) that a scheduler action on that GPU continues.
    band_trace: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    max_skew_ms: int = 30_000
    clock: Callable[[], float] = time.time
    skew_rejected: int = 0
    fresh_at: dict[str, int] = field(default_factory=dict)  # GPU -> arrival (ms) of the record with its newest sample
    last_arrival_ms: int | None = None  # the newest record of any kind, on this scheduler's clock
    # What changed since the reader last took it (``take_changes``): at 50,000 GPUs a reader that looked at every
    # GPU per pass spent most of the pass on GPUs nothing had happened to.
    changed_gpus: set[str] = field(default_factory=set)
    changed_nodes: set[str] = field(default_factory=set)
    # Per GPU, in the order first learned (``slot``), what the model is written from, kept as columns as each
    # record is learned: a pass writes the fleet with one vectorised step per column (``apply_slots``), where
    # at 50,000 GPUs reading every record again took most of the pass.
    slot: dict[str, int] = field(default_factory=dict)
    _cols: dict[str, np.ndarray] = field(default_factory=lambda: _columns(1024))

    def silent_ms(self, now_ms: int) -> int:
        """How long since the feed delivered anything (0 before the first record)."""
        return 0 if self.last_arrival_ms is None else max(0, now_ms - self.last_arrival_ms)

    def outage(self, now_ms: int) -> bool:
        """The feed itself has been silent past ``stale_after_ms``: a broker or stream outage (with no GPU
        known there is nothing the stream must republish, so silence means nothing)."""
        return bool(self.gpus) and self.silent_ms(now_ms) > self.stale_after_ms

    def learn(self, record: object, headers: Sequence[tuple[str, bytes]] | None = None,
              arrived_ms: int | None = None) -> None:
        """Learn a record that arrived at ``arrived_ms`` (default: now, on ``clock``)."""
        if isinstance(record, JobRuntime):  # not a sign of the GPU feed's life: judged by its own age
            self.runtimes.learn(record)
            return
        arrived = int(self.clock() * 1000) if arrived_ms is None else arrived_ms
        stamp = record.published_ms if isinstance(record, GpuState) else getattr(record, "ts_ms", None)
        if stamp is not None and stamp > arrived + self.max_skew_ms:
            self.skew_rejected += 1
            log.warning("ignoring a %s stamped %d s ahead of this scheduler's clock", type(record).__name__,
                        (stamp - arrived) // 1000)
            return
        self.version += 1
        self.last_arrival_ms = max(arrived, self.last_arrival_ms or 0)
        if isinstance(record, GpuState):
            old = self.gpus.get(record.gpu_uuid)
            if old is None or record.published_ms >= old.published_ms:
                if old is None or record.sample_ts_ms != old.sample_ts_ms:
                    self.fresh_at[record.gpu_uuid] = arrived
                self.gpus[record.gpu_uuid] = record
                self.changed_gpus.add(record.gpu_uuid)
                self._set_row(record)
                if headers and (old is None or old.health_band != record.health_band):
                    self.band_trace[record.gpu_uuid] = list(headers)
        elif isinstance(record, NodeState):
            old_node = self.nodes.get(record.node)
            if old_node is None or record.ts_ms >= old_node.ts_ms:
                self.nodes[record.node] = record
                self.changed_nodes.add(record.node)
        elif isinstance(record, ClusterForecast) and (self.forecast is None or record.ts_ms >= self.forecast.ts_ms):
            self.forecast = record

    @staticmethod
    def _fresh_ms(state: GpuState, arrived: int | None) -> int:
        # The sample time, not the publish time: a live stream republishing a silent GPU is still stale
        # data. And no later than the arrival of that sample: a clock running ahead cannot keep it fresh.
        return state.sample_ts_ms if arrived is None else min(state.sample_ts_ms, arrived)

    def _set_row(self, s: GpuState) -> None:
        i = self.slot.setdefault(s.gpu_uuid, len(self.slot))
        cols = self._cols
        if i >= len(cols["fresh"]):
            grown = _columns(2 * len(cols["fresh"]))
            for name, col in cols.items():
                grown[name][:len(col)] = col
            self._cols = cols = grown
        cols["fresh"][i] = self._fresh_ms(s, self.fresh_at.get(s.gpu_uuid))
        cols["band"][i] = BAND_CODE[s.health_band]
        cols["util"][i] = s.util_gpu
        # Each metric's forecast at the planning horizon: the upper end of its interval (headroom is for the worst
        # case); without one, its value now. Both in one walk over the forecasts: this runs per record.
        util = mem = None
        for f in s.forecasts:
            if f.horizon_s == FORECAST_HORIZON_S:
                if f.metric == "util_gpu" and util is None:
                    util = f.upper
                elif f.metric == "fb_used_mib" and mem is None:
                    mem = f.upper
        cols["forecast_util"][i] = s.util_gpu if util is None else util
        cols["temp"][i] = s.temp_c
        cols["forecast_mem"][i] = s.fb_used_mib if mem is None else mem
        cols["power"][i] = s.power_w
        cols["fingerprint"][i] = s.workload_class or ""

    def is_stale(self, state: GpuState, now_ms: int) -> bool:
        return now_ms - self._fresh_ms(state, self.fresh_at.get(state.gpu_uuid)) > self.stale_after_ms

    def stale(self, now_ms: int) -> list[str]:
        """The stale GPUs' UUIDs, sorted."""
        names = list(self.slot)
        return sorted(names[i] for i in np.flatnonzero(now_ms - self._cols["fresh"][:len(names)] > self.stale_after_ms))

    def stale_count(self, now_ms: int) -> int:
        return int(np.count_nonzero(now_ms - self._cols["fresh"][:len(self.slot)] > self.stale_after_ms))

    def take_changes(self) -> tuple[set[str], set[str]]:
        """The GPUs and nodes whose state changed since the last call (the live model's reader's)."""
        gpus, nodes = self.changed_gpus, self.changed_nodes
        self.changed_gpus, self.changed_nodes = set(), set()
        return gpus, nodes

    def apply(self, cluster: ClusterState, locate: Callable[[str], tuple[int, int] | None], now_ms: int) -> int:
        """Write live state into ``cluster`` for every GPU ``locate`` places; returns how many were placed."""
        slots = np.full(cluster.band.shape, -1, dtype=np.int64)
        for uuid, i in self.slot.items():
            at = locate(uuid)
            if at is not None:
                slots[at] = i
        return self.apply_slots(cluster, slots, now_ms)

    def apply_slots(self, cluster: ClusterState, slots: np.ndarray, now_ms: int) -> int:
        """Write live state into ``cluster`` where ``slots`` (node, GPU) holds a GPU's ``slot`` (-1: none there:
        left as it is); returns how many were written."""
        outage = self.outage(now_ms)
        judged_at = self.last_arrival_ms if outage and self.last_arrival_ms is not None else now_ms
        at = slots >= 0
        i = slots[at]
        cols = self._cols
        fresh = cols["fresh"][i]
        stale = judged_at - fresh > self.stale_after_ms
        band = cols["band"][i]
        band = np.where(stale, np.where(band == BAND_CODE[HealthBand.CRITICAL], band, BAND_CODE[HealthBand.DEGRADED]),
                        band).astype(np.int8)
        moved = cluster.band[at] != band
        if moved.any():  # as ``set_band``: the node's plugin caches are stale
            np.add.at(cluster.version, np.nonzero(at)[0][moved], 1)
        cluster.band[at] = band
        cluster.util[at] = cols["util"][i]
        # Stale, or fine when the feed went silent (an outage): assumed fully busy.
        cluster.forecast_util[at] = np.where(stale | outage, 100.0, cols["forecast_util"][i])
        cluster.temp[at] = cols["temp"][i]
        # The stream plugins' inputs; a stale GPU is not live, so they fall back to the requests for it.
        cluster.live[at] = now_ms - fresh <= self.stale_after_ms
        cluster.forecast_mem[at] = cols["forecast_mem"][i]
        cluster.power[at] = cols["power"][i]
        cluster.fingerprint[at] = cols["fingerprint"][i]
        return len(i)


def _columns(size: int) -> dict[str, np.ndarray]:
    """``StateView``'s per-GPU columns: the model's live-state arrays, per slot."""
    cols = {name: np.zeros(size, dtype=np.float32) for name in ("util", "forecast_util", "temp", "forecast_mem",
                                                                "power")}
    cols["fresh"] = np.zeros(size, dtype=np.int64)  # when its newest sample stops counting as fresh (ms)
    cols["band"] = np.zeros(size, dtype=np.int8)  # BAND_CODE of its record's band
    cols["fingerprint"] = np.full(size, "", dtype=object)
    return cols


class StateFeed:
    """Follows the derived-state topics into a ``StateView`` (one asyncio task).

    ``progress`` is the catch-up's (``gpuaware.scheduler.catchup.CatchUp``): the scheduler's gauges read it."""

    def __init__(self, kafka: KafkaSettings, view: StateView, *, stall_timeout_s: float = 30.0,
                 report_every_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 retry_s: float = 0.5, max_retry_s: float = 10.0):
        self.kafka = kafka
        self.view = view
        self.records = 0
        self.dead_lettered = 0
        self.errors = 0  # errors after catch-up, each retried (gpuaware_scheduler_feed_errors_total)
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        self.progress = CatchUp(stall_timeout_s, report_every_s, clock)
        self._consumer: Any = None  # an AIOKafkaConsumer, or anything with its getmany/position/stop
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task | None = None
        self._settled = asyncio.Event()  # caught up, or stalled: catch_up() looks at progress to tell which

    async def start(self) -> None:
        # The topics read and their dead-letter topics: a missing one or a missing grant fails here,
        # naming it, rather than as a feed that never catches up.
        counts = await check_topics(self.kafka, [topics.spec(n) for t in FEED_TOPICS for n in (t, topics.dlq_name(t))])
        parts = [TopicPartition(t, p) for t in FEED_TOPICS for p in range(counts[t])]
        targets = await end_offsets(self.kafka, parts)
        consumer = AIOKafkaConsumer(**self.kafka.consumer_kwargs(None))
        await consumer.start()
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        self._producer = AIOKafkaProducer(**self.kafka.producer_kwargs())
        await self._producer.start()
        self.follow(consumer, targets)

    def follow(self, consumer: Any, targets: Mapping[TopicPartition, int]) -> None:
        """Read from ``consumer`` (assigned, started) for good; catch-up ends at ``targets``, the log ends.

        ``start()`` calls this with a real consumer; tests hand in a fake one."""
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(dict(targets)), name="state-feed")

    async def catch_up(self) -> None:
        """Wait until everything published before ``start()`` has been read.

        Raises ``CatchUpStalled`` once the read offsets have not advanced for the stall timeout, or the
        feed task's own error if it died; however long a steadily advancing catch-up takes, it is waited for."""
        assert self._task is not None, "catch_up() before start()"
        settled = asyncio.create_task(self._settled.wait())
        try:
            await asyncio.wait({settled, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()
        if self.progress.done:
            return
        if self._task.done():
            self._task.result()  # raises what killed it
            raise RuntimeError("the state feed ended before it caught up")
        raise self.progress.stall_error()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            (ended,) = await asyncio.gather(self._task, return_exceptions=True)
            if isinstance(ended, Exception):  # catch_up() raised it already if it ended the catch-up
                log.warning("the state feed had stopped: %r", ended)
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    async def _run(self, targets: dict[TopicPartition, int]) -> None:
        consumer, progress = self._consumer, self.progress
        progress.begin(targets, {tp: await consumer.position(tp) for tp in targets})
        if progress.done:
            self._settled.set()
        wait = self.retry_s
        while True:
            try:
                await self._step(consumer, progress)
                wait = self.retry_s
            except Exception as exc:
                if not progress.done:
                    raise  # catch-up fails at once, with this error
                # Once caught up the feed is supervised here: an error (a broker outage surfacing from the
                # consumer, a dead letter that cannot be sent) is logged, counted and retried, never the end.
                self.errors += 1
                log.warning("state feed error (%s: %s), retrying in %.1fs", type(exc).__name__, exc, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, self.max_retry_s)

    async def _step(self, consumer: Any, progress: CatchUp) -> None:
        batches = await consumer.getmany(timeout_ms=500, max_records=2000)
        for msgs in batches.values():
            for m in msgs:
                await self._take(m)
        if progress.done:
            return
        # Positions, not the last offsets seen: compaction may leave gaps before the end.
        progress.observe({tp: await consumer.position(tp) for tp in progress.pending})
        if progress.done:
            log.info("state feed caught up: %d GPUs, %d nodes", len(self.view.gpus), len(self.view.nodes))
        if progress.done or progress.stalled:
            self._settled.set()

    @property
    def failed(self) -> BaseException | None:
        """What ended the feed task, once it ended other than by ``stop()`` (it is not meant to end)."""
        task = self._task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception() or RuntimeError("the state feed task returned")

    async def _take(self, m) -> None:
        self.records += 1
        if m.value is None:  # a tombstone: on job.runtime.v1, a key the forecaster dropped
            if m.topic == topics.JOB_RUNTIME and m.key is not None:
                self.view.runtimes.forget(m.key.decode(errors="replace"))
            return
        try:
            self.view.learn(decode_for_topic(m.topic, m.value), m.headers)
        except DecodeError as exc:
            self.dead_lettered += 1
            name, headers = dead_letter(m.topic, m.partition, m.offset, exc, list(m.headers or []))
            assert self._producer is not None
            await self._producer.send(name, m.value, key=m.key, headers=headers)
            log.warning("dead-lettered %s/%s@%s: %s", m.topic, m.partition, m.offset, exc)
