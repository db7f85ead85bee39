"""The stream's logic without Faust: records in, per-GPU state in a table, derived records out.

``StreamProcessor`` owns the in-memory ``GpuTracker`` of every GPU in the partitions this worker
holds, backed by a mapping of snapshots (a Faust table with a changelog in the app, a dict in
tests). Records are applied in takes (``Take``: one record, or the many a worker handles together);
finishing a take writes each touched node's entry, one value holding the snapshots of all the node's
GPUs, before the take's records are acknowledged, so a worker that takes over a partition carries on
from the last processed take; duplicates replayed after a crash are recognised per GPU and applied once.

One entry per node, not per GPU: each table write is a RocksDB put and a changelog record produced
through Faust, and that per-record work, not the bytes, was most of a worker's time (docs/performance.md).
The minute history (an hour per GPU, two thirds of a snapshot's JSON then) changes only when a minute
closes, so it has its own entry per node (``hist:<name>``); the node entry written for every batch holds the rest,
and each GPU's minutes closed since its node's history entry was written (``closed``, at most ``MAX_CLOSED``). The
history entry is written again once every GPU of the node that has a history has closed a minute since, or one has
closed more than ``MAX_CLOSED``: about once a minute per node, where it was written with every take that closed a
minute of any of its GPUs, 3.1 times a minute once they have an hour of history (``python -m
gpuaware.bench.worker_cost``, ``table_writes_per_s``; docs/stream.md).
The table's keys and values, and the versions of their layout: ``gpuaware.stream.table_entries``.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, MutableMapping

from gpuaware.contract.events import GpuEvent, GpuState, NodeState, TelemetryBatch
from gpuaware.stream import fleet_peers
from gpuaware.stream.forecast_many import ClosedMinutes
from gpuaware.stream.gpu_state import HISTORY_MINUTES, GpuTracker, Learned, TrackerSettings
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.readings import READINGS, Readings
from gpuaware.stream.rollup import Partial, headroom, model_demand, node_record, ordered
from gpuaware.stream.state_codec import Encoded
from gpuaware.stream.table_entries import (
    SNAPSHOT_VERSION,
    decode_value,
    encode_value,
    entry_snapshots,
    history_key,
    node_entry,
    node_key,
    owner_key,
)

log = logging.getLogger(__name__)

NODE_HEARTBEAT_MS = 30_000
MAX_CLOSED = 2  # a GPU's minutes closed since its node's history entry was written, carried in the node entry
Rendered = GpuState | Encoded  # a state due: its record, or its key and bytes (``StreamProcessor.render``)


class InvalidRecord(ValueError):
    """A record that decodes but breaks the contract's rules (dead-lettered like undecodable ones)."""


class UnreadableEntry(InvalidRecord):
    """A node's stored entry that cannot be read back (corrupt, or of a layout this worker does not know): the
    records of that node are dead-lettered, naming it, and the entry is left as it is, never overwritten by GPUs
    started afresh; replay them once it is repaired or deleted."""


def check_batch(batch: TelemetryBatch) -> None:
    slots = len(batch.gpus)
    bad = sorted({s.gpu for s in batch.samples if not 0 <= s.gpu < slots})
    if bad:
        raise InvalidRecord(f"telemetry batch {batch.node}#{batch.batch_seq}: samples name GPU slots {bad} "
                            f"but the batch lists {slots} GPUs")
    if not batch.node:
        raise InvalidRecord("telemetry batch without a node name")
    for g in batch.gpus:
        if not g.uuid or g.fb_total_mib <= 0:
            raise InvalidRecord(f"telemetry batch {batch.node}#{batch.batch_seq}: GPU slot {g.index} needs a UUID "
                                f"and a positive framebuffer size (got {g.uuid!r}, {g.fb_total_mib} MiB)")
    # Before 1970 is no sample's time; the minute history keeps minutes as 32-bit numbers (GpuTracker.minutes).
    if any(batch.base_ts_ms + s.dt_ms < 0 for s in batch.samples) \
            or any(batch.base_ts_ms + p.dt_ms < 0 for p in batch.points):
        raise InvalidRecord(f"telemetry batch {batch.node}#{batch.batch_seq}: a sample or watch point is stamped "
                            f"before 1970 (base {batch.base_ts_ms} ms)")
    for s in batch.samples:
        if not (0 <= s.util_gpu <= 100 and 0 <= s.util_mem <= 100 and s.fb_used_mib >= 0 and s.power_dw >= 0):
            raise InvalidRecord(f"telemetry batch {batch.node}#{batch.batch_seq}: sample seq {s.seq} of slot {s.gpu} "
                                f"is out of physical range (util {s.util_gpu}/{s.util_mem} %, fb {s.fb_used_mib} MiB, "
                                f"power {s.power_dw} dW)")
    for p in batch.points:
        if not 0 <= p.gpu < slots or not 0 <= p.util_gpu <= 100 or p.power_dw < 0:
            raise InvalidRecord(f"telemetry batch {batch.node}#{batch.batch_seq}: watch point of slot {p.gpu} is out "
                                f"of range (util {p.util_gpu} %, power {p.power_dw} dW)")


def check_event(event: GpuEvent) -> None:
    if not event.gpu_uuid:
        raise InvalidRecord("GPU event without a GPU UUID")
    for name in ("value", "score"):
        v = getattr(event, name)
        if v is not None and not math.isfinite(v):
            raise InvalidRecord(f"GPU event {event.event_id}: {name} is {v}")


class GpuClaimedElsewhere(InvalidRecord):
    """A node reports a GPU UUID that another node reports too, and that node is not silent."""


class Take:
    """What the records of one take (the records a worker handles together) touched: each node's entry is
    written, and each GPU's state considered, once per take instead of once per record (docs/performance.md)."""

    __slots__ = ("nodes", "observed", "sources", "unobserved")

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, GpuTracker]] = {}  # node -> its GPUs touched, in order of last touch
        self.sources: dict[str, object] = {}  # node -> the last record that touched it (what it is written under)
        self.observed: dict[str, GpuTracker] = {}  # GPUs given samples: their states count towards latency
        self.unobserved: dict[str, GpuTracker] = {}  # GPUs given events or watch points only

    def touch(self, node: str, source: object = None) -> dict[str, GpuTracker]:
        touched = self.nodes.pop(node, None)
        if touched is None:
            touched = {}
        self.nodes[node] = touched  # re-inserted: the last node to take a moved GPU is written last
        self.sources[node] = source
        return touched


class StreamProcessor:
    def __init__(self, snapshots: MutableMapping[str, bytes], settings: TrackerSettings | None = None,
                 stats: StreamStats | None = None, scope: Callable[[object], None] | None = None,
                 entry_version: int = SNAPSHOT_VERSION):
        """``scope(source)``: the table reads and writes keys in the partition of the record being handled
        (Faust's RocksDB store: one database per partition), so it is told the record before the reads its
        apply makes and before each node's writes (the last record that touched the node). ``entry_version``: the
        layout node entries are written in (``node_entry``; both are read)."""
        if entry_version not in (4, SNAPSHOT_VERSION):
            raise ValueError(f"node entries are written in version 4 or {SNAPSHOT_VERSION}, not {entry_version!r}")
        self.entry_version = entry_version
        self.snapshots = snapshots
        self.scope = scope
        self.settings = settings or TrackerSettings()
        self.stats = stats or StreamStats()
        self.trackers: dict[str, GpuTracker] = {}
        # Where every tracker made here takes its row (the fleet check gathers the rows of one store)
        self.readings: Readings = READINGS
        self.partition_of: dict[str, int] = {}
        self.node_published: dict[str, tuple[int, tuple]] = {}
        self.fleet_settings = fleet_peers.FleetPeerSettings()
        # node -> its GPUs' trackers, for every node whose entry has been loaded (what its entry is written from)
        self.members: dict[str, dict[str, GpuTracker]] = {}
        self.member_of: dict[str, str] = {}  # GPU UUID -> the node whose members hold it
        self.node_partition: dict[str, int] = {}
        self.legacy: set[str] = set()  # version 1 keys loaded but not yet deleted
        # GPU UUID -> (node, its tracker's ``history_changes``) when its history was last in that node's entry
        self.history_written: dict[str, tuple[str, int]] = {}
        self.history_seq: dict[str, int] = {}  # node -> the number of its last history entry written or read
        self.behind: set[int] = set()  # partitions whose last record came from a log being caught up on
        # Nodes loaded, or whose GPUs changed, since the last rollup (a node's rollup reads nothing else); with
        # the rollups ``NODE_HEARTBEAT_MS`` old (``node_published`` is in publishing order), all that can be due.
        self.rollup_due: set[str] = set()
        # What the heartbeat looks at instead of every GPU: the GPUs that may have changed since their last state
        # (each registers itself: GpuTracker.mark_changed; a GPU is held changed from when it is loaded or met), and
        # the states published, by time, for the refresh of those not published for ``max_interval_ms``.
        self.unsettled: dict[str, GpuTracker] = {}
        # The minutes closed in the take being applied, learned together when it is finished (None: each at once).
        self.closed: ClosedMinutes | None = ClosedMinutes()
        # A heap of (a state's time, the GPU's UUID): a number and a string, which the cyclic collector stops tracking.
        # One entry per GPU (its tracker's ``queued_ms``), not one per state: an entry brought up by a GPU published
        # since goes back with that state's time. An entry per state was ~30 s of states per GPU, ~0.7 KiB of each
        # (docs/stream.md, "Memory").
        self.published: list[tuple[int, str]] = []
        self._oldest = 0  # the heartbeat's refresh boundary, which only moves forward
        # What a GPU's state due is made with: its record, or (the worker's) its key and bytes straight from the
        # tracker, as its publisher encodes them (``StatePublisher.encoded_state``).
        self.render: Callable[[GpuTracker, int], Rendered] = GpuTracker.state

    # ------------------------------------------------------------------ state

    def _under(self, source: object) -> None:
        """Make the table work under ``source`` (the ``scope``), where there is a record to work under."""
        if self.scope is not None and source is not None:
            self.scope(source)

    def _node(self, node: str, partition: int) -> dict[str, GpuTracker]:
        """The node's GPUs, loaded from its entry the first time the node is seen here; ``UnreadableEntry`` (nothing
        held, the entry left as it is) when the entry cannot be read back."""
        members = self.members.get(node)
        if members is None:
            split, seq, keys, restored = self._read(node)
            members = self.members[node] = {}
            # Held here now: rolled up at the next rollup even when no record of its own follows (a node whose
            # batches are refused for naming a live node's GPU was still heartbeated by the walk over every GPU).
            self.rollup_due.add(node)
            self.history_seq[node] = seq
            for key, t in restored.items():
                self._hold(key, t)
                self.partition_of[key] = partition
                if split:  # (its minutes the history entry lacks: ``history_changes``, from its ``closed``)
                    self.history_written[key] = (node, 0)
            for key in keys:
                t = self.trackers[key]
                if t.node in (node, "") and key not in self.member_of:  # a moved board stays with its new node
                    members[key] = t
                    self.member_of[key] = node
        self.node_partition[node] = partition
        return members

    def _read(self, node: str) -> tuple[bool, int, list[str], dict[str, GpuTracker]]:
        """(whether its history is apart, its history entry's number, the GPUs of ``node``'s entry in its order, a
        tracker for each of them not held yet) read from the table, changing nothing held."""
        try:
            entry = decode_value(self.snapshots.get(node_key(node))) or {}
            # Version 2 entries hold each GPU's history; from version 3 it is in the node's history entry.
            split = entry.get("v", 0) >= 3
            stored = (decode_value(self.snapshots.get(history_key(node))) or {}) if split else {}
            histories = stored.get("gpus", {})
            carried = stored.get("seq", 0) == entry.get("hist", 0)  # else the history holds the carried minutes
            snapshots = entry_snapshots(entry)
            restored = {}
            for key, stored_gpu in snapshots.items():
                if key not in self.trackers:
                    restored[key] = GpuTracker.from_dict(stored_gpu, self.settings,
                                                         histories.get(key, []) if split else None, self.readings,
                                                         carried)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Not started afresh: the GPUs' next write would replace what the entry holds.
            raise UnreadableEntry(f"node {node!r}: its stored entry cannot be read back ({type(exc).__name__}: "
                                  f"{exc}); its records are dead-lettered until the entry is repaired or deleted") \
                from exc
        return split, stored.get("seq", 0), list(snapshots), restored

    def tracker(self, key: str, partition: int, node: str = "") -> GpuTracker:
        """GPU ``key`` as reported by ``node``: from memory, its node's entry, a version 1 entry, or new."""
        if node:
            self._node(node, partition)
        t = self.trackers.get(key)
        if t is None:
            owner = decode_value(self.snapshots.get(owner_key(key)))
            if owner and owner != node:
                self._node(owner, partition)
                t = self.trackers.get(key)
        if t is None:
            legacy = decode_value(self.snapshots.get(key))
            if legacy:
                t = GpuTracker.from_dict(legacy, self.settings, readings=self.readings)
                self.legacy.add(key)
            else:
                t = GpuTracker(uuid=key, settings=self.settings, readings=self.readings)
            self._hold(key, t)
        self.partition_of[key] = partition
        return t

    def _hold(self, key: str, t: GpuTracker) -> GpuTracker:
        """``t`` becomes GPU ``key``'s tracker here, looked at by the next heartbeat (its state, loaded or new, is
        not published yet) and by every heartbeat after a change."""
        self.trackers[key] = t
        t.unsettled = self.unsettled
        t.closed = self.closed
        t.mark_changed()
        return t

    def snapshot(self, key: str) -> dict | None:
        """GPU ``key``'s stored snapshot (from its node's entry and the node's history entry)."""
        t = self.trackers.get(key)
        if t is None or not t.node:
            return None
        entry = decode_value(self.snapshots.get(node_key(t.node)))
        stored_gpu = entry_snapshots(entry).get(key) if entry else None
        if stored_gpu is None or "history" in stored_gpu:
            return stored_gpu
        stored = decode_value(self.snapshots.get(history_key(t.node))) or {"gpus": {}}
        closed = stored_gpu.pop("closed", [])
        if stored.get("seq", 0) != entry.get("hist", 0):
            closed = []  # a newer history entry holds them
        return {**stored_gpu, "history": [*stored["gpus"].get(key, []), *closed][-HISTORY_MINUTES:]}

    def _write(self, node: str, touched: Iterable[GpuTracker]) -> None:
        """Write ``node``'s entry after ``touched`` (its GPUs in the record just applied) changed."""
        members = self.members.setdefault(node, {})
        for t in touched:
            if t.node != node:
                continue
            if t.uuid not in members:  # new here, or moved from another node: it leaves that node's entry
                before = self.member_of.get(t.uuid)
                if before is not None and before in self.members:
                    self.members[before].pop(t.uuid, None)
                members[t.uuid] = t
                self.member_of[t.uuid] = node
                if before != node:
                    self.snapshots[owner_key(t.uuid)] = encode_value(node)
                    if before is not None:
                        self.rollup_due.add(before)  # its rollup loses the GPU
        closed = self._closed_since(node, members)
        if closed is None:
            # The whole node's history, so that the entry alone restores it.
            seq = self.history_seq[node] = self.history_seq.get(node, 0) + 1
            self.snapshots[history_key(node)] = encode_value(
                {"v": self.entry_version, "seq": seq,
                 "gpus": {k: list(t.history) for k, t in members.items() if t.history}})
            for k, t in members.items():
                self.history_written[k] = (node, t.history_changes)
            closed = {}
        self.snapshots[node_key(node)] = node_entry(members, closed, self.history_seq.get(node, 0), self.entry_version)
        for key in [k for k in self.legacy if k in members]:
            self.legacy.discard(key)
            with contextlib.suppress(KeyError):
                del self.snapshots[key]  # a tombstone in the changelog: compaction drops the old entry

    def _closed_since(self, node: str, members: dict[str, GpuTracker]) -> dict[str, int] | None:
        """Per GPU of ``node`` with minutes its history entry lacks, how many; None when the entry is to be written
        now: every GPU with a history has closed a minute since, one has closed more than ``MAX_CLOSED``, or one
        is not in it (it joined the node, or its entry was read in an older layout)."""
        written = self.history_written
        closed = {}
        # ``minutes``, not ``history``: the history is put together from the forecasters' rows on each read.
        with_minutes = 0
        for k, t in members.items():
            if not t.minutes:
                continue
            with_minutes += 1
            mark = written.get(k)
            if mark is None or mark[0] != node:
                return None
            n = t.history_changes - mark[1]
            if n:
                if n > MAX_CLOSED:
                    return None
                closed[k] = n
        return None if closed and len(closed) == with_minutes else closed

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop cached trackers of these partitions: they are reloaded from the table when next needed."""
        gone = set(partitions)
        if self.closed is not None:
            self.closed.learn()  # (the minutes waiting: learned, so that it holds no dropped tracker)
        self.behind -= gone
        for key in [k for k, p in self.partition_of.items() if p in gone]:
            t = self.trackers.pop(key, None)
            if t is not None:
                t.unsettled = None
            self.unsettled.pop(key, None)
            self.partition_of.pop(key, None)
            self.legacy.discard(key)
            self.history_written.pop(key, None)
        for node in [n for n, p in self.node_partition.items() if p in gone]:
            for key in self.members.pop(node, {}):
                if self.member_of.get(key) == node:
                    del self.member_of[key]
            self.node_partition.pop(node, None)
            self.history_seq.pop(node, None)

    def owned(self, partitions: set[int] | None) -> list[GpuTracker]:
        return [t for k, t in self.trackers.items() if partitions is None or self.partition_of.get(k) in partitions]

    # ------------------------------------------------------------------ input

    def _check_owners(self, keys: list[str], node: str, partition: int, now_ms: int, what: str) -> None:
        """A GPU belongs to the node that reports it until that node has been silent ``rehome_after_ms``
        (a board moved to another host): one node cannot take over, or speak for, another's GPU. A record
        refused for any of ``keys`` moves none of the GPUs this worker held: each stays in the partition it was
        held in (one first met in the refused record, its owner's entry loaded, stays under this partition)."""
        held_in = {key: self.partition_of.get(key) for key in keys}
        for key in keys:
            t = self.tracker(key, partition, node)
            if t.node and t.node != node and now_ms - t.arrived_ms < self.settings.rehome_after_ms:
                self.stats.gpu_claimed_elsewhere += 1
                for k, p in held_in.items():
                    if p is not None:
                        self.partition_of[k] = p
                raise GpuClaimedElsewhere(f"{what} from node {node!r} names GPU {key}, which node {t.node!r} "
                                          f"reported {(now_ms - t.arrived_ms) // 1000} s ago")

    def apply_telemetry(self, batch: TelemetryBatch, partition: int, now_ms: int, take: Take,
                        behind: bool = False, source: object = None) -> None:
        """Apply a batch into ``take`` (written and published by ``finish``); ``InvalidRecord`` changes nothing.
        ``behind``: the worker is catching up on this partition (``GpuTracker.due``). ``source``: the record
        it came from (the processor's ``scope``)."""
        check_batch(batch)
        self._under(source)
        self._check_owners([info.uuid for info in batch.gpus], batch.node, partition, now_ms,
                           f"telemetry batch #{batch.batch_seq}")
        if behind:
            self.behind.add(partition)
        else:
            self.behind.discard(partition)
        touched = take.touch(batch.node, source)
        stats = self.stats
        gpus = batch.gpus
        base = batch.base_ts_ms
        for sample in batch.samples:
            info = gpus[sample.gpu]
            key = info.uuid
            t = touched.get(key) or self.tracker(key, partition, batch.node)
            learned = t.learn_sample(batch.node, info, sample, base + sample.dt_ms, now_ms)
            if learned is Learned.APPLIED:
                stats.samples += 1
            elif learned is Learned.DUPLICATE:
                stats.duplicates += 1
            else:
                stats.clock_skew_rejected += 1
            touched[key] = t
            take.observed[key] = t
        for point in batch.points:
            key = gpus[point.gpu].uuid
            t = touched.get(key) or self.tracker(key, partition, batch.node)
            if t.learn_point(point, base + point.dt_ms, now_ms):
                stats.points += 1
            touched[key] = t
            # Published like the rest, but not a sample-to-state latency: the state carries the time of the GPU's
            # last full sample, up to the sampling policy's ceiling (30 s) old, not the point's.
            take.unobserved.setdefault(key, t)

    def apply_event(self, event: GpuEvent, partition: int, now_ms: int, take: Take, source: object = None) -> None:
        """Apply an event into ``take``; ``InvalidRecord`` changes nothing."""
        check_event(event)
        self._under(source)
        key = event.gpu_uuid
        self._check_owners([key], event.node, partition, now_ms, f"event {event.event_id}")
        t = self.tracker(key, partition, event.node)
        t.learn_event(event)
        if t.node == event.node:
            self._node(t.node, partition)
            take.touch(t.node, source)[key] = t
        # else the GPU is still another node's (silent past the rehome time; only a sample moves a GPU, and
        # records its arrival): its state goes out with the event, and its entry, in that node's partition, is
        # not written under this record, which is in the event's node's partition.
        take.unobserved.setdefault(key, t)

    def finish(self, take: Take, now_ms: int) -> list[Rendered]:
        """Write each node ``take`` touched once, in the order they were last touched, each under the last record
        that touched it (``scope``); the states due, one per GPU."""
        if self.closed is not None:
            self.closed.learn()
        for node, touched in take.nodes.items():
            self._under(take.sources[node])
            self._write(node, touched.values())
        self.rollup_due.update(take.nodes)
        states = self._due(take.observed.values(), now_ms, observe=True)
        return states + self._due([t for k, t in take.unobserved.items() if k not in take.observed], now_ms,
                                  observe=False)

    def on_telemetry(self, batch: TelemetryBatch, partition: int, now_ms: int,
                     behind: bool = False) -> list[Rendered]:
        """One batch on its own: applied, its node written, the states due."""
        take = Take()
        self.apply_telemetry(batch, partition, now_ms, take, behind)
        return self.finish(take, now_ms)

    def on_event(self, event: GpuEvent, partition: int, now_ms: int) -> list[Rendered]:
        take = Take()
        self.apply_event(event, partition, now_ms, take)
        return self.finish(take, now_ms)

    # ------------------------------------------------------------------ output

    def _due(self, trackers: Iterable[GpuTracker], now_ms: int, observe: bool) -> list[Rendered]:
        out = []
        behind = self.behind
        for t in trackers:
            if t.samples and t.due(now_ms, bool(behind) and self.partition_of.get(t.uuid) in behind):
                try:
                    state = self.render(t, now_ms)
                except ValueError as exc:
                    # Lost, as a state the client cannot deliver, and held published (due again at its refresh):
                    # left due, it failed every heartbeat, and the GPUs after it were never looked at.
                    self.stats.publish_failed += 1
                    log.warning("GPU %s: state not published: %s", t.uuid, exc)
                    state = None
                t.mark_published(now_ms)
                if t.queued_ms is None or now_ms < t.queued_ms:  # (the clock stepped back: an earlier entry)
                    t.queued_ms = now_ms
                    heapq.heappush(self.published, (now_ms, t.uuid))
                if state is None:
                    continue
                if observe:
                    self.stats.observe_latency(max(0.0, (now_ms - t.fresh_ms) / 1000.0))
                out.append(state)
        return out

    def heartbeats(self, now_ms: int, partitions: set[int] | None) -> list[Rendered]:
        """States not published for ``max_interval_ms`` (their freshness timestamps tell how old the data is),
        and changes held back by ``min_interval_ms`` (not while their partition is being caught up on)."""
        # Only a GPU changed since its last state, or whose state is max_interval_ms old, can be due: the GPUs
        # ``unsettled`` holds, and those whose last state the ``published`` heap brings to the top now. The rest are
        # not looked at (at 50,000 GPUs a pass over every GPU every second was ~7 % of the worker's logic;
        # before it, a call on each was most of the heartbeat's cost). The processor's settings are every tracker's:
        # it builds them all with them.
        # Never earlier than at the last heartbeat: a GPU the heap brought up stays looked at until it is published
        # again, even if the clock steps back (it would be dropped with no entry left to bring it up again).
        oldest = self._oldest = max(self._oldest, now_ms - self.settings.max_interval_ms)
        trackers, unsettled, published = self.trackers, self.unsettled, self.published
        while published and published[0][0] <= oldest:
            at, key = heapq.heappop(published)
            t = trackers.get(key)
            if t is None or t.queued_ms != at:
                continue  # no longer held here (or held by a tracker built since, which has its own entry)
            if t.last_published_ms == at:  # not published since
                t.queued_ms = None
                unsettled[key] = t
            else:  # published since: up again when that state is as old
                t.queued_ms = t.last_published_ms
                heapq.heappush(published, (t.queued_ms, key))
        # Those settled since (published, or moved below the signature's steps) are let go here, at the next heartbeat;
        # ``forget`` lets go of those it drops.
        partition_of = self.partition_of
        looked_at = []
        for key, t in list(unsettled.items()):
            if not (t.changed or t.last_published_ms <= oldest):
                del unsettled[key]
            elif partitions is None or partition_of.get(key) in partitions:
                looked_at.append(t)
        return self._due(looked_at, now_ms, observe=False)

    def fleet_check(self, now_ms: int, partitions: set[int] | None) -> None:
        """Judge the owned GPUs against their model's fleet (gpuaware.stream.fleet_peers); a reason found shows on the
        GPU's next state."""
        fleet_peers.check(self.owned(partitions), now_ms, self.fleet_settings)

    def node_states(self, now_ms: int, partitions: set[int] | None) -> list[NodeState]:
        """Node rollups that changed, or that were last published ``NODE_HEARTBEAT_MS`` ago.

        Looked at: the nodes loaded or changed since the last rollup (``rollup_due``) and those whose rollup is
        ``NODE_HEARTBEAT_MS`` old, not every GPU: that walk was a tenth of a worker's time at 50,000 GPUs
        (docs/performance.md)."""
        candidates, self.rollup_due = self.rollup_due, set()
        for node, (published_ms, _) in self.node_published.items():  # oldest first
            if now_ms - published_ms < NODE_HEARTBEAT_MS:
                break
            candidates.add(node)
        out = []
        for node in sorted(candidates):
            gpus = [t for t in self.members.get(node, {}).values() if t.node == node and t.samples]
            if not gpus or (partitions is not None and self.node_partition.get(node) not in partitions):
                self.node_published.pop(node, None)  # nothing to roll up here now; a record brings it back
                continue
            gpus = ordered(gpus)
            free = headroom(gpus)
            # What a rollup is republished for; the record is built only when it is
            signature = (tuple((g.uuid, g.health_band) for g in gpus), free[0] // 250, free[1] // 4096)
            last = self.node_published.get(node)
            if last is None or last[1] != signature or now_ms - last[0] >= NODE_HEARTBEAT_MS:
                self.node_published.pop(node, None)  # re-inserted last: the dict stays in publishing order
                self.node_published[node] = (now_ms, signature)
                out.append(node_record(node, gpus, free, now_ms))
        return out

    def demand_partials(self, partitions: Iterable[int]) -> dict[int, Partial]:
        by_partition: dict[int, list[GpuTracker]] = defaultdict(list)
        for key, t in self.trackers.items():
            by_partition[self.partition_of[key]].append(t)
        return {p: model_demand(by_partition.get(p, [])) for p in partitions}
