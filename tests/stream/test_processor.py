"""The processor's checks on records that decode: invalid ones are rejected and change nothing, and no
decodable record crashes it (hypothesis)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import MutableMapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaware.contract.events import (
    EventKind,
    GpuEvent,
    GpuInfo,
    GpuSample,
    GpuState,
    Severity,
    TelemetryBatch,
    WatchPoint,
)
from gpuaware.stream.gpu_state import TrackerSettings
from gpuaware.stream.processor import (
    MAX_CLOSED,
    GpuClaimedElsewhere,
    InvalidRecord,
    StreamProcessor,
    Take,
    UnreadableEntry,
)
from gpuaware.stream.table_entries import (
    SNAPSHOT_VERSION,
    decode_value,
    encode_value,
    entry_snapshots,
    history_key,
    node_key,
    owner_key,
)
from tests.support import KINDS_SCENARIO, replay_scenario, telemetry_batch


def test_a_batch_naming_a_missing_gpu_slot_is_invalid() -> None:
    bad = telemetry_batch("n", 1, 0)
    bad.samples[0].gpu = 3
    with pytest.raises(InvalidRecord, match="GPU slots \\[3\\]"):
        StreamProcessor({}).on_telemetry(bad, 0, 0)


def test_non_physical_values_are_invalid_and_change_nothing() -> None:
    proc = StreamProcessor({})
    bad = telemetry_batch("n", 1, 0)
    bad.samples[0].util_gpu = 250
    with pytest.raises(InvalidRecord, match="out of physical range"):
        proc.on_telemetry(bad, 0, 0)
    ev = GpuEvent("e", 0, "n", "GPU-n-0", EventKind.HEALTH_CHANGE, Severity.INFO, "health_score", float("nan"))
    with pytest.raises(InvalidRecord, match="value is nan"):
        proc.on_event(ev, 0, 0)
    assert proc.trackers == {} and proc.snapshots == {}


def test_a_batch_stamped_before_1970_is_invalid() -> None:
    """The minute history keeps 32-bit minutes: a sample's minute from a time far before 1970 would not fit, and no
    sample is from before 1970."""
    proc = StreamProcessor({})
    bad = telemetry_batch("n", 1, 0)
    bad.base_ts_ms = -(2**62)
    with pytest.raises(InvalidRecord, match="before 1970"):
        proc.on_telemetry(bad, 0, 0)
    ok = telemetry_batch("n", 1, 0)
    ok.base_ts_ms = 0
    proc.on_telemetry(ok, 0, 0)
    assert proc.trackers


_int = st.integers(-(2**31), 2**31 - 1)


@st.composite
def _batches(draw) -> TelemetryBatch:
    n = draw(st.integers(0, 3))
    gpus = [GpuInfo(draw(st.sampled_from(["GPU-a", "GPU-b", ""])), i, draw(st.text(max_size=5)),
                    draw(_int)) for i in range(n)]
    samples = [GpuSample(draw(st.integers(-1, 4)), draw(_int), draw(_int), draw(_int), draw(_int), draw(_int),
                         draw(_int), draw(_int)) for _ in range(draw(st.integers(0, 6)))]
    return TelemetryBatch(draw(st.sampled_from(["n", ""])), draw(_int), draw(_int), gpus, samples)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_batches(), st.builds(
    GpuEvent, st.text(max_size=4), _int, st.text(max_size=4), st.sampled_from(["GPU-a", "GPU-b"]),
    st.sampled_from(list(EventKind)), st.sampled_from(list(Severity)), st.none() | st.text(max_size=4),
    st.none() | st.floats(allow_nan=True), st.none() | st.floats(), st.text(max_size=8),
    st.dictionaries(st.sampled_from(["new_band", "component.ecc", "old_band", "x"]), st.text(max_size=8)))),
    max_size=12))
def test_any_decodable_record_is_applied_or_rejected_as_invalid_never_crashes(records) -> None:
    proc = StreamProcessor({})
    now = 1_700_000_000_000
    for r in records:
        try:
            if isinstance(r, TelemetryBatch):
                proc.on_telemetry(r, 0, now)
            else:
                proc.on_event(r, 0, now)
        except InvalidRecord:
            continue
        now += 1000
    for t in proc.trackers.values():
        state = t.state(now)  # every tracker can still render a valid, encodable record
        from gpuaware.contract.events import decode, encode

        assert decode(encode(state)) == state
    proc.heartbeats(now + 60_000, None)
    proc.node_states(now, None)


class _Recording(dict):
    """A table that counts writes and deletes, each of which is a changelog record in the app."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.writes: list[str] = []

    def __setitem__(self, key, value) -> None:
        assert isinstance(value, bytes)  # the app's table stores and logs the processor's bytes as they are
        self.writes.append(key)
        super().__setitem__(key, value)

    def entry(self, key) -> dict:
        return decode_value(self[key])

    def __delitem__(self, key) -> None:
        self.writes.append(f"-{key}")
        super().__delitem__(key)


T0 = 1_700_000_000_000


def test_a_batch_writes_one_entry_for_its_node_not_one_per_gpu() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    proc.on_telemetry(telemetry_batch("n", 1, T0, gpus=8), 0, T0)
    # The first batch also says, once per GPU, which node's entry holds it.
    assert sorted(table.writes) == sorted([node_key("n")] + [owner_key(f"GPU-n-{i}") for i in range(8)])
    table.writes.clear()
    proc.on_telemetry(telemetry_batch("n", 2, T0 + 1000, gpus=8), 0, T0 + 1000)
    assert table.writes == [node_key("n")]
    assert sorted(entry_snapshots(table.entry(node_key("n")))) == [f"GPU-n-{i}" for i in range(8)]


def test_a_restarted_processor_carries_on_exactly_from_the_node_entries() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    for seq in range(1, 6):
        proc.on_telemetry(telemetry_batch("n", seq, T0 + seq * 1000, gpus=4), 0, T0 + seq * 1000)
    ev = GpuEvent("e1", T0 + 5500, "n", "GPU-n-2", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 20.0,
                  None, "x", {"new_band": "CRITICAL"})
    proc.on_event(ev, 0, T0 + 5500)
    before = {k: t.to_dict() for k, t in proc.trackers.items()}
    again = StreamProcessor(table)
    for seq in range(4, 7):  # the re-read tail after a crash, then one new batch
        again.on_telemetry(telemetry_batch("n", seq, T0 + seq * 1000, gpus=4), 0, T0 + 7000)
    assert again.stats.duplicates == 8 and again.stats.samples == 4
    for key, snapshot in before.items():
        t = again.trackers[key]
        assert (t.samples, t.last_seq) == (snapshot["samples"] + 1, 6)
    assert again.trackers["GPU-n-2"].health_band == "CRITICAL"
    # A node seen only through an event still has its GPUs' entry loaded before the entry is written.
    third = StreamProcessor(table)
    third.on_event(dataclasses.replace(ev, event_id="e2", ts_ms=T0 + 8000), 0, T0 + 8000)
    assert sorted(entry_snapshots(table.entry(node_key("n")))) == [f"GPU-n-{i}" for i in range(4)]


def test_version_1_per_gpu_entries_are_migrated_into_the_node_entry_and_deleted() -> None:
    old = StreamProcessor({})
    for seq in range(1, 4):
        old.on_telemetry(telemetry_batch("n", seq, T0 + seq * 1000, gpus=2), 0, T0 + seq * 1000)
    v1 = _Recording({k: json.dumps(t.to_dict()).encode() for k, t in old.trackers.items()})  # the old layout
    proc = StreamProcessor(v1)
    proc.on_telemetry(telemetry_batch("n", 4, T0 + 4000, gpus=2), 0, T0 + 4000)
    assert [t.samples for t in proc.trackers.values()] == [4, 4]  # nothing lost in the move
    assert sorted(v1) == [node_key("n"), owner_key("GPU-n-0"), owner_key("GPU-n-1")]
    assert sorted(v1.writes) == sorted([node_key("n"), "-GPU-n-0", "-GPU-n-1", owner_key("GPU-n-0"),
                                        owner_key("GPU-n-1")])
    assert sorted(entry_snapshots(v1.entry(node_key("n")))) == ["GPU-n-0", "GPU-n-1"]


def test_a_moved_gpu_leaves_its_old_nodes_entry() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    proc.on_telemetry(telemetry_batch("a", 1, T0, gpus=2), 0, T0)
    later = T0 + proc.settings.rehome_after_ms + 1
    moved = dataclasses.replace(telemetry_batch("b", 1, later), gpus=[GpuInfo("GPU-a-1", 0, "A100", 81920)])
    proc.on_telemetry(moved, 0, later)
    proc.on_telemetry(telemetry_batch("a", 2, later + 1000), 0, later + 1000)  # node a is back with one GPU
    assert sorted(entry_snapshots(table.entry(node_key("b")))) == ["GPU-a-1"]
    assert sorted(entry_snapshots(table.entry(node_key("a")))) == ["GPU-a-0"]


def test_a_restarted_processor_still_knows_whose_gpu_it_is() -> None:
    table = _Recording()
    StreamProcessor(table).on_telemetry(telemetry_batch("b", 1, T0), 0, T0)
    again = StreamProcessor(table)  # restarted: no tracker in memory, node b has not reported since
    forged = dataclasses.replace(telemetry_batch("a", 1, T0 + 1000), gpus=[GpuInfo("GPU-b-0", 0, "A100", 81920)])
    with pytest.raises(GpuClaimedElsewhere, match="node 'b'"):
        again.on_telemetry(forged, 0, T0 + 1000)


class _Partitioned(MutableMapping):
    """The table as Faust's RocksDB store is to the processor: a database per partition, each key read and written
    in the partition of the record being handled, which ``scope`` sets (the records here are their partitions).
    A ``MutableMapping``, not a dict, so that every way in (``get``, ``in``, ``pop``) goes through the scoping."""

    def __init__(self) -> None:
        self.dbs: dict[int, dict[str, bytes]] = {}
        self.current: int | None = None

    def scope(self, source: object) -> None:
        assert isinstance(source, int)
        self.current = source

    def _db(self) -> dict[str, bytes]:
        assert self.current is not None, "Faust writes only under a record"
        return self.dbs.setdefault(self.current, {})

    def __getitem__(self, key):
        if self.current is None:  # no record yet: Faust looks in every partition's database
            for db in self.dbs.values():
                if key in db:
                    return db[key]
            raise KeyError(key)
        return self._db()[key]

    def __setitem__(self, key, value) -> None:
        self._db()[key] = value

    def __delitem__(self, key) -> None:
        del self._db()[key]

    def __iter__(self):
        return iter(self._db())

    def __len__(self) -> int:
        return len(self._db())


def _applied(proc: StreamProcessor, *records: tuple[TelemetryBatch, int], now: int) -> None:
    """``records`` (batch, partition) applied as one take, each under its own record, as the app does."""
    take = Take()
    for batch, partition in records:
        proc.apply_telemetry(batch, partition, now, take, source=partition)
    proc.finish(take, now)


def test_after_a_restart_each_nodes_entry_is_read_from_its_own_partition() -> None:
    """The bug takes had: the table was left on the partition of the last record written, so a restarted worker
    (or one given a partition in a rebalance) read another partition for a node it met first, found nothing, and
    started the node's GPUs afresh."""
    table = _Partitioned()
    proc = StreamProcessor(table, scope=table.scope)
    _applied(proc, (telemetry_batch("b", 1, T0), 2), (telemetry_batch("a", 1, T0), 1), now=T0)
    assert set(table.dbs[2]) == {node_key("b"), owner_key("GPU-b-0")} and node_key("a") in table.dbs[1]
    assert table.current == 1  # where the last write left it
    again = StreamProcessor(table, scope=table.scope)
    _applied(again, (telemetry_batch("b", 2, T0 + 1000), 2), now=T0 + 1000)
    assert again.trackers["GPU-b-0"].samples == 2
    assert set(table.dbs[1]) == {node_key("a"), owner_key("GPU-a-0")}  # nothing of b's written there


def test_an_event_naming_another_nodes_gpu_writes_nothing_into_its_own_partition() -> None:
    """An event from node x about a GPU of node y (silent past the rehome time, so not refused) was written as
    y's entry under x's record: into x's partition, where y's worker never reads it."""
    table = _Partitioned()
    proc = StreamProcessor(table, scope=table.scope)
    _applied(proc, (telemetry_batch("y", 1, T0, gpus=2), 1), now=T0)
    before = dict(table.dbs[1])
    later = T0 + proc.settings.rehome_after_ms + 1
    ev = GpuEvent("e1", later, "x", "GPU-y-1", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 20.0,
                  None, "x", {"new_band": "CRITICAL"})
    take = Take()
    proc.apply_event(ev, 2, later, take, source=2)
    (state,) = proc.finish(take, later)
    assert state.gpu_uuid == "GPU-y-1" and state.health_band.value == "CRITICAL"  # published all the same
    assert state.node == "y"  # an event does not move a GPU (a sample does, and records when it arrived)
    assert table.dbs[1] == before and table.dbs.get(2, {}) == {}


def test_a_state_moved_by_a_watch_point_is_published_but_not_counted_as_sample_to_state_latency() -> None:
    """A stable GPU is fully sampled every 30 s (the sampling policy's ceiling) and sends watch points between;
    a state a point moves carries the last full sample's time, so counting it as that sample's latency put the
    sampling interval into the histogram (its p99 read ~30 s while the worker kept up)."""
    proc = StreamProcessor({})
    proc.on_telemetry(telemetry_batch("n", 1, T0, util=10), 0, T0 + 1000)
    assert proc.stats.latency.count == 1 and proc.stats.latency.sum == pytest.approx(1.0)
    later = T0 + 25_000
    points = dataclasses.replace(telemetry_batch("n", 2, later, util=90), samples=[],
                                 points=[WatchPoint(0, 0, 90, 3000)])
    (state,) = proc.on_telemetry(points, 0, later + 1000)
    assert state.sample_ts_ms == T0 and state.util_gpu > 10  # the point moved it; its time is the sample's
    assert proc.stats.latency.count == 1  # not a 26 s "latency"
    proc.on_telemetry(telemetry_batch("n", 3, later + 5000, util=10), 0, later + 6000)
    assert proc.stats.latency.count == 2 and proc.stats.latency.sum == pytest.approx(2.0)


def test_a_take_writes_each_nodes_entry_once_and_publishes_one_state_per_gpu() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    proc.on_telemetry(telemetry_batch("a", 1, T0, gpus=2), 0, T0)  # known GPUs: no owner: writes below
    table.writes.clear()
    observed = proc.stats.latency.count
    take = Take()
    now = T0 + 60_000
    for seq in range(2, 12):
        for node in ("a", "b"):
            proc.apply_telemetry(telemetry_batch(node, seq, T0 + seq * 1000, gpus=2), 0, now, take)
    ev = GpuEvent("e1", now, "a", "GPU-a-1", EventKind.HEALTH_CHANGE, Severity.CRITICAL, "health_score", 20.0,
                  None, "x", {"new_band": "CRITICAL"})
    proc.apply_event(ev, 0, now, take)
    assert table.writes == []  # nothing written before the take is finished
    states = proc.finish(take, now)
    assert sorted(table.writes) == sorted([node_key("a"), node_key("b"), owner_key("GPU-b-0"), owner_key("GPU-b-1")])
    assert sorted(s.gpu_uuid for s in states) == ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1"]
    assert {s.gpu_uuid: s.samples for s in states} == {"GPU-a-0": 11, "GPU-a-1": 11, "GPU-b-0": 10, "GPU-b-1": 10}
    assert proc.stats.latency.count - observed == 4  # one sample-to-state observation per state, not per record


def test_a_take_leaves_the_same_state_and_table_as_the_same_records_one_by_one() -> None:
    records = [telemetry_batch(n, seq, T0 + seq * 1000, util=10 * seq % 100, gpus=3)
               for seq in range(1, 150) for n in ("a", "b")]  # over two minutes: forecasts are rendered
    one_by_one, taken = _Recording(), _Recording()
    serial, batched = StreamProcessor(one_by_one), StreamProcessor(taken)
    now = T0 + 200_000
    for r in records:
        serial.on_telemetry(r, 0, now)
    for start in range(0, len(records), 64):
        take = Take()
        for r in records[start:start + 64]:
            batched.apply_telemetry(r, 0, now, take)
        batched.finish(take, now)
    assert dict(taken) == dict(one_by_one)
    # And a processor restarted from the batched table carries on exactly: the last take's records replayed
    # are duplicates, a new batch applies.
    again = StreamProcessor(taken)
    take = Take()
    for r in [*records[-64:], telemetry_batch("a", 150, T0 + 150_000, gpus=3)]:
        again.apply_telemetry(r, 0, now, take)
    again.finish(take, now)
    assert again.stats.duplicates == 64 * 3 and again.stats.samples == 3
    assert {k: t.samples for k, t in again.trackers.items()} == {
        **{f"GPU-a-{i}": 150 for i in range(3)}, **{f"GPU-b-{i}": 149 for i in range(3)}}


def test_minutes_learned_together_at_the_end_of_a_take_publish_and_store_what_learning_each_at_once_does() -> None:
    """The minutes a take closes wait in the processor's ``ClosedMinutes`` and are learned together when it is
    finished (``forecast_many.learn_many``); a processor that learns each at once (``closed`` None) is the oracle:
    the same states, byte for byte, and the same table, over a fleet of the pipeline's load (young and older
    forecasters, many GPUs closing minutes in one take) and takes that close two minutes of a GPU (the first learned
    before the second waits: ``GpuTracker.settle``)."""
    from gpuaware.bench.fleet_load import TICKS_PER_S, Fleet, build_template
    from gpuaware.contract import topics
    from gpuaware.contract.events import TelemetryBatch, decode
    from gpuaware.stream.publisher import StatePublisher

    fleet = Fleet(build_template(nodes=4, loop_s=60, warmup_s=5), gpus=64, prefix="wc")
    together, at_once = StreamProcessor(_Recording()), StreamProcessor(_Recording())
    at_once.closed = None
    encoders = [StatePublisher(topics.GPU_STATE, None, p.stats) for p in (together, at_once)]
    most_waiting, most_closed, late, seq = 0, 0, T0 - 160_000, 0
    for tick in range(200 * TICKS_PER_S):
        now = T0 + tick * 100
        records, _ = fleet.records(tick, now)
        batches = [decode(value, TelemetryBatch) for topic, _, value in records if topic == topics.TELEMETRY]
        if tick in (35 * TICKS_PER_S, 175 * TICKS_PER_S):  # a node's minutes caught up on: two or more in one take
            while late + 20_000 <= now:
                late, seq = late + 20_000, seq + 1
                batches.append(telemetry_batch("late", seq, late, util=(17 * seq) % 100, gpus=8))
        published = []
        for proc, encoder in zip((together, at_once), encoders, strict=True):
            before = len(proc.trackers["GPU-late-0"].minutes) if "GPU-late-0" in proc.trackers else 0
            take = Take()
            mid_take = []
            for i, batch in enumerate(batches):
                proc.apply_telemetry(batch, 0, now, take)
                if i == len(batches) // 2 and tick % 50 == 0:
                    # what the timers read while a take is applied (the app awaits between records): the minutes
                    # waiting are learned first
                    mid_take += [json.dumps(t.history).encode() for t in proc.trackers.values()]
                    mid_take.append(json.dumps(proc.demand_partials([0])).encode())
                    mid_take += [encoder.encode(s, s.key()) for s in proc.heartbeats(now, None)]
            if proc.closed is not None:
                most_waiting = max(most_waiting, len(proc.closed.trackers))
                if "GPU-late-0" in proc.trackers:
                    most_closed = max(most_closed, len(proc.trackers["GPU-late-0"].minutes) - before)
            published.append(mid_take + [encoder.encode(s, s.key()) for s in proc.finish(take, now)])
            published[-1] += [encoder.encode(s, s.key()) for s in proc.heartbeats(now, None)]
        assert published[0] == published[1]
    assert dict(together.snapshots) == dict(at_once.snapshots)
    assert most_waiting >= 8 and most_closed >= 2
    assert sum(t.forecasting for t in together.trackers.values()) == 72
    for key, t in together.trackers.items():
        assert t.packed_forecasts == at_once.trackers[key].packed_forecasts and t.history


def test_an_invalid_record_in_a_take_changes_nothing_and_the_rest_of_the_take_applies() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    take = Take()
    proc.apply_telemetry(telemetry_batch("a", 1, T0), 0, T0, take)
    bad = telemetry_batch("b", 1, T0)
    bad.samples[0].util_gpu = 250
    with pytest.raises(InvalidRecord):
        proc.apply_telemetry(bad, 0, T0, take)
    proc.apply_telemetry(telemetry_batch("a", 2, T0 + 1000), 0, T0 + 1000, take)
    states = proc.finish(take, T0 + 1000)
    assert [(s.gpu_uuid, s.samples) for s in states] == [("GPU-a-0", 2)]
    assert node_key("b") not in table and "GPU-b-0" not in proc.trackers


def _minutes(node: str, first: int, last: int, gpus: int = 2) -> list[TelemetryBatch]:
    """A batch every 20 s from ``first`` to ``last`` (seq), so minutes close and forecasts are rendered."""
    return [telemetry_batch(node, seq, T0 + seq * 20_000, util=(17 * seq) % 100, gpus=gpus)
            for seq in range(first, last + 1)]


def test_the_minute_history_is_written_only_in_takes_that_close_a_minute() -> None:
    table = _Recording()
    proc = StreamProcessor(table)
    closing = []
    for batch in _minutes("n", 1, 14):
        table.writes.clear()
        proc.on_telemetry(batch, 0, batch.base_ts_ms)
        if history_key("n") in table.writes:
            closing.append(batch.batch_seq)
    # Minutes close with the first sample of the next one: T0 is 20 s into its minute.
    assert closing == [2, 5, 8, 11, 14]
    assert "history" not in entry_snapshots(table.entry(node_key("n")))["GPU-n-0"]
    assert table.entry(history_key("n"))["gpus"]["GPU-n-0"] == [list(h) for h in proc.trackers["GPU-n-0"].history]
    # What the two entries hold restores each GPU exactly, forecasters included.
    again = StreamProcessor(table)
    for batch in _minutes("n", 14, 20):  # the last batch again (a duplicate), then new ones
        again.on_telemetry(batch, 0, batch.base_ts_ms)
        proc.on_telemetry(batch, 0, batch.base_ts_ms)
    assert again.stats.duplicates == 2
    for key, t in proc.trackers.items():
        assert again.trackers[key].to_dict() == t.to_dict()
        assert again.trackers[key].forecasts == t.forecasts


def _one_gpu(node: str, gpu: int, seq: int, ts: int, gpus: int = 3) -> TelemetryBatch:
    """A batch of ``node`` with the sample of one of its ``gpus`` GPUs only."""
    batch = telemetry_batch(node, seq, ts, util=(13 * seq + 7 * gpu) % 100, gpus=gpus)
    return dataclasses.replace(batch, samples=[dataclasses.replace(batch.samples[gpu], gpu=gpu)])


def test_the_history_entry_is_written_once_every_gpu_closed_a_minute_and_the_node_entry_carries_the_rest() -> None:
    """A node's GPUs close their minutes in different takes: the minutes its history entry lacks ride in the node
    entry (``closed``) until every GPU with a history has closed one, or one has closed more than ``MAX_CLOSED``; a
    processor restarted from the table after any take restores every GPU exactly."""
    table = _Recording()
    proc = StreamProcessor(table)
    seq, ts = 0, T0

    def sample(gpu: int, step_ms: int) -> tuple[bool, bool, int]:
        """One GPU's sample in its own batch: whether it closed a minute, whether the history entry was written,
        and the most minutes any node entry carries."""
        nonlocal seq, ts
        seq, ts = seq + 1, ts + step_ms
        table.writes.clear()
        minutes = len(proc.trackers[f"GPU-n-{gpu}"].minutes) if f"GPU-n-{gpu}" in proc.trackers else 0
        proc.on_telemetry(_one_gpu("n", gpu, seq, ts), 0, ts)
        again = StreamProcessor(_Recording(dict(table)))
        for key, t in proc.trackers.items():
            if not t.samples:
                continue
            restored = again.tracker(key, 0, "n")
            # (a state is published after the take's writes: the entry holds the time of the one before)
            assert {**restored.to_dict(), "last_published_ms": 0} == {**t.to_dict(), "last_published_ms": 0}
            assert restored.forecasts == t.forecasts
            assert again.snapshot(key)["history"] == [list(h) for h in t.history]
        carried = max(len(g.get("closed", ())) for g in entry_snapshots(table.entry(node_key("n"))).values())
        return len(proc.trackers[f"GPU-n-{gpu}"].minutes) > minutes, history_key("n") in table.writes, carried

    # Each GPU sampled every 45 s, 15 s after the one before: the node's minutes close GPU by GPU.
    taken = [sample(gpu, 15_000) for _ in range(12) for gpu in range(3)]
    closing = sum(c for c, _, _ in taken)
    written = sum(w for _, w, _ in taken)
    assert closing >= 24 and written <= closing // 3 + 2, (closing, written)  # written at every closing take before
    assert 1 <= max(c for _, _, c in taken) <= MAX_CLOSED
    # GPU 2 silent: the others' minutes are carried up to MAX_CLOSED, then the entry is written
    taken = [sample(gpu, 30_000) for _ in range(6) for gpu in (0, 1)]
    assert sum(w for _, w, _ in taken) >= 2 and max(c for _, _, c in taken) == MAX_CLOSED


def test_a_node_entry_read_with_a_newer_history_entry_adds_only_the_minutes_it_lacks() -> None:
    """A worker stopped between writing a node's history entry and its node entry leaves an older node entry whose
    ``closed`` minutes the history already holds: restored, each minute is in the history once."""
    table = _Recording()
    proc = StreamProcessor(table)
    seq, ts, carried = 0, T0, None
    for _ in range(12):
        for gpu in range(3):
            seq, ts = seq + 1, ts + 15_000
            table.writes.clear()
            before = dict(table)
            proc.on_telemetry(_one_gpu("n", gpu, seq, ts), 0, ts)
            if history_key("n") in table.writes and any(
                    "closed" in g for g in entry_snapshots(decode_value(before[node_key("n")])).values()):
                carried = {**before, history_key("n"): table[history_key("n")]}
    assert carried is not None
    again = StreamProcessor(_Recording(carried))
    for key in proc.trackers:
        minutes = [m for m, _, _ in again.tracker(key, 0, "n").history]
        assert minutes == sorted(set(minutes))
        assert again.snapshot(key)["history"][-len(minutes):] == [list(h) for h in again.trackers[key].history]


@pytest.mark.parametrize("back_min", [2, 3, 5])
def test_minutes_carried_after_the_clock_stepped_back_are_restored(back_min) -> None:
    """A worker's clock stepped back (or a partition moved to a worker behind): a GPU's new minutes can be earlier than
    its history's last; carried in its node entry, a restore still adds every one of them."""
    table = _Recording()
    proc = StreamProcessor(table)
    start = (T0 + 40_000) // 60_000 * 60_000
    seq = 0
    for ts in range(start, start + 300_000, 20_000):
        for gpu in (1, 0):
            seq += 1
            proc.on_telemetry(_one_gpu("n", gpu, seq, ts, gpus=2), 0, ts)
    back = start + 300_000 - back_min * 60_000
    for ts in range(back, back + 200_000, 20_000):
        seq += 1
        proc.on_telemetry(_one_gpu("n", 0, seq, ts, gpus=2), 0, ts)
        restored = StreamProcessor(_Recording(dict(table))).tracker("GPU-n-0", 0, "n")
        assert restored.history == proc.trackers["GPU-n-0"].history


def test_version_2_node_entries_are_read_after_an_upgrade_and_rewritten_split() -> None:
    from faust.serializers import codecs

    old = StreamProcessor({})
    for batch in _minutes("n", 1, 9):
        old.on_telemetry(batch, 0, batch.base_ts_ms)
    # The table as the version 2 worker left it: Faust's JSON codec over its node entry and owner entries.
    v2 = _Recording({node_key("n"): codecs.dumps("json", {"v": 2, "gpus": {k: t.to_dict()
                                                                          for k, t in old.trackers.items()}}),
                     **{owner_key(k): codecs.dumps("json", "n") for k in old.trackers}})
    proc = StreamProcessor(v2)
    assert proc.snapshot("GPU-n-0") is None  # nothing loaded yet
    for batch in _minutes("n", 9, 10):  # the last batch replayed, then one within the same minute
        proc.on_telemetry(batch, 0, batch.base_ts_ms)
        old.on_telemetry(batch, 0, batch.base_ts_ms)
    assert proc.stats.duplicates == 2 and proc.stats.samples == 2
    for key, t in old.trackers.items():
        assert proc.trackers[key].to_dict() == t.to_dict() and proc.trackers[key].forecasts == t.forecasts
        assert proc.snapshot(key)["history"] == [list(h) for h in t.history]  # read back from the history entry
    # Rewritten in the new layout at its first write, history included although no minute closed since.
    assert v2.writes == [history_key("n"), node_key("n"), node_key("n")]
    assert v2.entry(node_key("n"))["v"] == SNAPSHOT_VERSION and len(v2.entry(history_key("n"))["gpus"]["GPU-n-1"]) == 3
    # And a worker restarted from the migrated table (owner entries still version 2) carries on exactly.
    third = StreamProcessor(v2)
    forged = dataclasses.replace(telemetry_batch("m", 1, T0 + 210_000), gpus=[GpuInfo("GPU-n-0", 0, "A100", 81920)])
    with pytest.raises(GpuClaimedElsewhere, match="node 'n'"):
        third.on_telemetry(forged, 0, T0 + 210_000)
    for batch in _minutes("n", 11, 12):
        third.on_telemetry(batch, 0, batch.base_ts_ms)
        old.on_telemetry(batch, 0, batch.base_ts_ms)
    for key, t in old.trackers.items():
        assert third.trackers[key].to_dict() == t.to_dict() and third.trackers[key].forecasts == t.forecasts


def test_a_table_written_in_version_4_restores_as_the_same_table_written_as_rows() -> None:
    """Two processors fed the same records, one writing version 4 (a dict per GPU, what workers before 5 read: the
    ``node_entry_version`` of a rolling upgrade) and one writing rows: after every take, a processor restarted
    from either table holds the same GPUs, and the history the live one holds."""
    dicts, rows = _Recording(), _Recording()
    as_dicts, as_rows = StreamProcessor(dicts, entry_version=4), StreamProcessor(rows)
    seq, ts, carried = 0, T0, 0
    for _ in range(12):
        for gpu in range(3):
            seq, ts = seq + 1, ts + 15_000
            for proc in (as_dicts, as_rows):
                proc.on_telemetry(_one_gpu("n", gpu, seq, ts), 0, ts)
            v4, v5 = dicts.entry(node_key("n")), rows.entry(node_key("n"))
            assert v4["v"] == 4 and "rows" not in v4 and "gpus" not in v5
            if history_key("n") in dicts:
                assert dicts.entry(history_key("n"))["v"] == 4
            carried += any("closed" in g for g in v4["gpus"].values())
            from_dicts, from_rows = StreamProcessor(_Recording(dict(dicts))), StreamProcessor(_Recording(dict(rows)))
            for key, t in as_rows.trackers.items():
                a, b = from_dicts.tracker(key, 0, "n"), from_rows.tracker(key, 0, "n")
                assert a.to_dict() == b.to_dict() and a.forecasts == b.forecasts and a.history == t.history
    assert carried  # some entries carried minutes their history entry lacked
    # The rows' processor, restarted on the version 4 table, carries on and writes rows from its next take.
    upgraded = StreamProcessor(dicts)
    batch = _one_gpu("n", 0, seq + 1, ts + 15_000)
    upgraded.on_telemetry(batch, 0, batch.base_ts_ms)
    entry = dicts.entry(node_key("n"))
    assert entry["v"] == SNAPSHOT_VERSION and "gpus" not in entry and sorted(entry["rows"]) == sorted(as_rows.trackers)


def test_an_unreadable_node_entry_dead_letters_the_nodes_records_and_is_never_overwritten() -> None:
    """A row of another layout (or any entry that cannot be read back): the node's records are refused naming it
    (``UnreadableEntry``, an ``InvalidRecord``: the app dead-letters them), every time, and nothing is written over
    the entry; its GPUs are not started afresh."""
    table = _Recording()
    StreamProcessor(table).on_telemetry(telemetry_batch("n", 1, T0, gpus=2), 0, T0)
    entry = table.entry(node_key("n"))
    entry["rows"]["GPU-n-1"] = entry["rows"]["GPU-n-1"][:-1]
    broken = {**table, node_key("n"): encode_value(entry)}
    proc = StreamProcessor(_Recording(broken))
    assert issubclass(UnreadableEntry, InvalidRecord)
    for seq in (2, 3):
        with pytest.raises(UnreadableEntry, match=r"node 'n'.*GPU GPU-n-1: a snapshot row has"):
            proc.on_telemetry(telemetry_batch("n", seq, T0 + seq * 1000, gpus=2), 0, T0 + seq * 1000)
        assert proc.snapshots.writes == [] and not proc.trackers and "n" not in proc.members
    assert proc.snapshots[node_key("n")] == broken[node_key("n")]
    # Another node of the same worker goes on.
    proc.on_telemetry(telemetry_batch("m", 1, T0, gpus=2), 0, T0)
    assert sorted(proc.trackers) == ["GPU-m-0", "GPU-m-1"]


def _rollups_walking_every_gpu(proc: StreamProcessor, published: dict, now: int, partitions) -> list[str]:
    """The rollups as they were found before they were kept incrementally: every owned GPU looked at."""
    from collections import defaultdict

    from gpuaware.stream.processor import NODE_HEARTBEAT_MS
    from gpuaware.stream.rollup import node_state

    by_node = defaultdict(list)
    for t in proc.owned(partitions):
        if t.node and t.samples:
            by_node[t.node].append(t)
    out = []
    for node, gpus in sorted(by_node.items()):
        state = node_state(node, gpus, now)
        signature = (tuple((g.uuid, g.health_band) for g in state.gpus), state.free_gpu_milli // 250,
                     state.free_fb_mib // 4096)
        last = published.get(node)
        if last is None or last[1] != signature or now - last[0] >= NODE_HEARTBEAT_MS:
            published[node] = (now, signature)
            out.append(state)
    return out


@pytest.mark.parametrize("seed", range(32))  # seeds 12 and 21 once found a node loaded by a refused batch
def test_node_rollups_kept_incrementally_are_those_walking_every_gpu_finds(seed) -> None:
    """Samples that move a node's headroom or not, health bands changed by events, a board moved to another
    node, a partition revoked and assigned again, nodes falling silent: rollup by rollup, the same states."""
    import random



    rng = random.Random(seed)
    proc, published = StreamProcessor({}, TrackerSettings(rehome_after_ms=4000)), {}  # boards move often
    now, seq = T0, 0
    owned = {0, 1}
    for step in range(400):
        now += rng.choice([700, 1000, 2500])
        seq += 1
        node = f"n{rng.randrange(12)}"
        partition = int(node[1:]) % 2
        if partition not in owned:
            continue
        batch = telemetry_batch(node, seq, now, util=rng.choice([10, 12, 60, 95]), fb=rng.choice([1000, 9000]),
                                gpus=3)
        if rng.random() < 0.05:  # a board moves: the GPU of another node shows up here
            other = f"n{rng.randrange(12)}"
            batch.gpus[0] = dataclasses.replace(batch.gpus[0], uuid=f"GPU-{other}-1")
        with contextlib.suppress(InvalidRecord):
            proc.on_telemetry(batch, partition, now)
        if rng.random() < 0.1:
            band = rng.choice(["HEALTHY", "DEGRADED", "CRITICAL"])
            proc.on_event(GpuEvent(f"e{step}", now, node, f"GPU-{node}-2", EventKind.HEALTH_CHANGE, Severity.WARNING,
                                   "health_score", 0.5, None, "band", {"new_band": band}), partition, now)
        if step == 150:  # partition 1 is revoked and comes back later, reloaded from the table
            owned = {0}
            proc.forget({1})
        if step == 250:
            owned = {0, 1}
        if step % 5 == 0:
            got = proc.node_states(now, owned)
            want = _rollups_walking_every_gpu(proc, published, now, owned)
            assert [s.node for s in got] == [s.node for s in want]
            assert got == want


def test_a_refused_claim_leaves_the_gpu_in_its_owners_partition() -> None:
    proc = StreamProcessor({})
    proc.on_telemetry(telemetry_batch("a", 1, T0), 1, T0)
    claim = telemetry_batch("b", 1, T0 + 1000)
    claim.gpus[0] = dataclasses.replace(claim.gpus[0], uuid="GPU-a-0")
    with pytest.raises(GpuClaimedElsewhere):
        proc.on_telemetry(claim, 0, T0 + 1000)
    assert proc.partition_of["GPU-a-0"] == 1
    proc.forget({1})  # partition 1 goes to another worker: this one keeps nothing of node a
    assert "GPU-a-0" not in proc.trackers and proc.heartbeats(T0 + 60_000, {0}) == []


def test_a_batch_refused_for_one_gpu_moves_none_of_its_gpus() -> None:


    proc = StreamProcessor({}, TrackerSettings(rehome_after_ms=10_000))
    proc.on_telemetry(telemetry_batch("a", 1, T0), 1, T0)  # then silent: its GPU could move
    proc.on_telemetry(telemetry_batch("c", 1, T0 + 20_000), 0, T0 + 20_000)  # live
    claim = telemetry_batch("b", 1, T0 + 21_000, gpus=2)
    claim.gpus[0] = dataclasses.replace(claim.gpus[0], uuid="GPU-a-0")
    claim.gpus[1] = dataclasses.replace(claim.gpus[1], uuid="GPU-c-0")
    with pytest.raises(GpuClaimedElsewhere, match="GPU-c-0"):
        proc.on_telemetry(claim, 0, T0 + 21_000)
    assert proc.partition_of["GPU-a-0"] == 1 and proc.trackers["GPU-a-0"].node == "a"


def test_a_node_loaded_after_a_restart_is_rolled_up_though_its_batches_are_refused() -> None:
    """Its batches name a GPU a live node reports, so no take of its own is finished; it is still held here."""
    table: dict = {}
    proc = StreamProcessor(table)
    proc.on_telemetry(telemetry_batch("a", 1, T0), 0, T0)
    proc.on_telemetry(telemetry_batch("b", 1, T0, gpus=2), 0, T0)
    proc = StreamProcessor(table)  # restarted on the same table
    rolled = []
    for i, now in enumerate(range(T0 + 1000, T0 + 70_000, 5000)):
        proc.on_telemetry(telemetry_batch("a", 2 + i, now), 0, now)
        claim = telemetry_batch("b", 2 + i, now, gpus=2)
        claim.gpus[1] = dataclasses.replace(claim.gpus[1], uuid="GPU-a-0")
        with pytest.raises(GpuClaimedElsewhere):
            proc.on_telemetry(claim, 0, now)
        rolled += [s.node for s in proc.node_states(now + 1, {0})]
    assert rolled.count("b") >= 2  # at once, then every NODE_HEARTBEAT_MS


@pytest.mark.parametrize("every_sample", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_the_heartbeat_passing_over_unchanged_gpus_publishes_what_asking_every_gpu_would(seed, every_sample) -> None:
    """Samples, watch points, records of a log being caught up on, held-back changes, health events, fleet verdicts
    coming and going, a partition revoked and assigned again, a restart on the same table, GPUs silent past the refresh
    and the clock stepping back: second by second, the heartbeat's states are those of asking every owned GPU whether
    it is due (on a copy of the processor), one per GPU (their order across GPUs means nothing)."""
    import copy
    import random

    from gpuaware.stream.fleet_peers import FleetPeerSettings

    rng = random.Random(seed)
    proc = StreamProcessor({}, TrackerSettings(max_interval_ms=20_000, every_sample=every_sample))
    proc.fleet_settings = FleetPeerSettings(min_peers=4, strikes=2)
    now, seq, owned = T0, 0, {0, 1, 2}
    hot, verdicts, refreshed = False, 0, 0
    for step in range(300):
        now += 1000
        if step % 40 == 0:
            hot = not hot  # GPU-n0-1 runs hot against its peers, then cools down: a fleet verdict comes and goes
        for _ in range(rng.randrange(4)):
            seq += 1
            node = f"n{rng.randrange(9 if step < 200 else 5)}"  # the last four nodes fall silent
            batch = telemetry_batch(node, seq, now - rng.randrange(3000), util=rng.choice([5, 50, 90]), gpus=2)
            if node == "n0" and hot:
                batch.samples[1] = dataclasses.replace(batch.samples[1], temp_c=95)
            if rng.random() < 0.2:  # utilisation and power between full samples
                batch = dataclasses.replace(batch, samples=[], points=[
                    WatchPoint(rng.randrange(2), rng.randrange(-2000, 0), rng.randrange(100), 2000)])
            with contextlib.suppress(InvalidRecord):
                proc.on_telemetry(batch, int(node[1:]) % 3, now, behind=rng.random() < 0.15)
        if rng.random() < 0.1:
            node = f"n{rng.randrange(9)}"
            band = rng.choice(["HEALTHY", "DEGRADED", "CRITICAL"])
            proc.on_event(GpuEvent(f"e{step}", now, node, f"GPU-{node}-1", EventKind.HEALTH_CHANGE, Severity.WARNING,
                                   "health_score", 0.5, None, "band", {"new_band": band}), int(node[1:]) % 3, now)
        if step % 5 == 0:
            proc.fleet_check(now, owned)
        if step == 120:
            owned = {0, 2}
            proc.forget({1})
        if step == 160:
            restarted = StreamProcessor(proc.snapshots, proc.settings)
            restarted.fleet_settings = proc.fleet_settings
            proc = restarted
        if step == 190:  # partition 1 assigned again: reloaded from the table (gpuaware.stream.app's on_assigned)
            owned = {0, 1, 2}
            proc.forget({1})
        if step == 260:
            now -= 15_000  # the worker's clock steps back
        reference = copy.deepcopy(proc)
        want = reference._due(reference.owned(owned), now, observe=False)
        got = proc.heartbeats(now, owned)
        assert sorted(got, key=GpuState.key) == sorted(want, key=GpuState.key)
        verdicts += any(s.verdict_reasons and "fleet peers" in s.verdict_reasons[-1] for s in got)
        refreshed += any(s.gpu_uuid.startswith("GPU-n8") for s in got) and step > 230
    assert verdicts and refreshed  # the fleet verdicts and the refresh of silent GPUs were exercised


def test_a_gpu_due_for_its_refresh_while_its_partition_is_not_asked_for_is_still_refreshed_after_the_clock_steps_back(
) -> None:
    """The heartbeat brings a GPU up for its refresh once (the heap of states published): it must keep it until it is
    published again, whatever the clock does meanwhile, or nothing brings it up again."""
    proc = StreamProcessor({}, TrackerSettings(max_interval_ms=10_000))
    assert len(proc.on_telemetry(telemetry_batch("n", 1, T0), 1, T0)) == 1
    assert proc.heartbeats(T0 + 12_000, {0}) == []  # due for its refresh, but its partition is not asked for
    assert proc.heartbeats(T0 + 5_000, {0}) == []  # the clock steps back
    (refresh,) = proc.heartbeats(T0 + 11_000, {0, 1})  # asking every GPU: last published at T0, due since T0 + 10 s
    assert refresh.gpu_uuid == "GPU-n-0"


def test_the_heap_of_states_published_holds_one_entry_per_gpu_and_still_brings_each_up_for_its_refresh() -> None:
    """An entry per state was ~30 s of states per GPU; an entry brought up by a GPU published since goes back with
    that state's time, and the GPU is refreshed ``max_interval_ms`` after its last state, as before."""
    proc = StreamProcessor({}, TrackerSettings(max_interval_ms=10_000))
    now = T0
    for seq in range(1, 31):  # a state every 2 s for a minute
        now = T0 + 2000 * seq
        assert len(proc.on_telemetry(telemetry_batch("n", seq, now, util=seq % 2 * 90, gpus=2), 0, now)) == 2
        assert proc.heartbeats(now, None) == []
        assert len(proc.published) == 2
    last = now
    assert proc.heartbeats(last + 9_000, None) == []
    assert {s.gpu_uuid for s in proc.heartbeats(last + 10_000, None)} == {"GPU-n-0", "GPU-n-1"}
    assert len(proc.published) == 2


def test_table_values_read_back_as_what_the_json_module_wrote() -> None:
    # Every value a replay writes (node entries, history entries, owners), with an event among the records: orjson's
    # text reads back to what json.dumps's did, and is the same text for these (no exponents, ASCII but the event's).
    proc, _ = replay_scenario(KINDS_SCENARIO, 240)
    uuid, tracker = next(iter(proc.trackers.items()))
    proc.on_event(GpuEvent("e1", tracker.sample_ts_ms, tracker.node, uuid, EventKind.HEALTH_CHANGE, Severity.WARNING,
                           "health_score", 61.5, None, "health healthy -> degraded (ECC, 2 °C over)",
                           {"new_band": "DEGRADED", "component.ecc": "40.0"}), 0, tracker.sample_ts_ms)
    snapshots = [t.to_dict() for t in proc.trackers.values()]
    assert any(s["recent_events"] for s in snapshots) and len(proc.snapshots) > 10
    for value in [*snapshots, *(json.loads(raw) for raw in proc.snapshots.values())]:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        assert json.loads(encode_value(value)) == json.loads(json.dumps(value))
        if text.isascii():
            assert encode_value(value) == text.encode()
    odd = {"reason": "+12.0 °C", "x": 0.1 + 0.2, "tiny": 1e-7, "big": 1e16, "none": None, "ms": 1_800_000_000_000,
           1: "an int key", "huge": 2**70}  # the last: beyond orjson, through json
    assert json.loads(encode_value(odd)) == json.loads(json.dumps(odd))


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("seed", range(4))
def test_a_node_entry_written_is_what_encoding_every_gpu_gives(seed, version) -> None:
    """Samples, replayed batches, samples stamped too far ahead, watch points, health events, heartbeats and fleet
    checks in any order: each node entry written reads back as every GPU's snapshot then (``to_dict``, through
    JSON), with the minutes its node's history entry lacks (``closed``); as rows, or in version 4 byte for byte
    what a version 4 worker wrote (a dict per GPU, its ``closed`` in it)."""
    import random

    rng = random.Random(seed)
    written: list[tuple[bytes, bytes]] = []

    def snapshot(key: str, t) -> dict:
        data = t.to_dict(history=False)
        lacking = t.history_changes - proc.history_written[key][1] if t.minutes else 0
        if lacking:
            data["closed"] = t.history[-lacking:]
        return data

    class Checking(dict):
        def __setitem__(self, key, value) -> None:
            if key.startswith("node:"):
                members = proc.members[key.removeprefix("node:")]
                hist = proc.history_seq.get(key.removeprefix("node:"), 0)
                gpus = {k: snapshot(k, t) for k, t in members.items()}
                if version == 4:
                    written.append((value, encode_value({"v": 4, "hist": hist, "gpus": gpus})))
                else:
                    written.append((value, {"v": version, "hist": hist, "gpus": json.loads(encode_value(gpus))}))
            super().__setitem__(key, value)

    proc = StreamProcessor(Checking(), entry_version=version)
    now, seqs = T0, {}
    for step in range(300):
        now += 1000
        node = f"n{rng.randrange(4)}"
        kind = rng.random()
        if kind < 0.5:
            seq = seqs[node] = seqs.get(node, 0) + 1
            if rng.random() < 0.15 and seq > 3:
                seq -= 2  # a replayed batch: its samples are duplicates
            ahead = 120_000 if rng.random() < 0.05 else 0
            batch = telemetry_batch(node, seq, now - rng.randrange(3000) + ahead, util=rng.choice([5, 50, 90]),
                                    gpus=3)
            batch = dataclasses.replace(batch, samples=batch.samples[:rng.randrange(1, 4)])
            proc.on_telemetry(batch, 0, now)
        elif kind < 0.7 and node in seqs:
            batch = telemetry_batch(node, seqs[node], now, gpus=3)
            points = [WatchPoint(rng.randrange(3), rng.randrange(-2000, 0), rng.randrange(100), 2000)]
            proc.on_telemetry(dataclasses.replace(batch, samples=[], points=points), 0, now)
        elif kind < 0.8 and node in seqs:
            band = rng.choice(["HEALTHY", "DEGRADED", "CRITICAL"])
            proc.on_event(GpuEvent(f"e{step}", now, node, f"GPU-{node}-{rng.randrange(3)}", EventKind.HEALTH_CHANGE,
                                   Severity.WARNING, "health_score", rng.random() * 100, None, "band",
                                   {"new_band": band}), 0, now)
        elif kind < 0.95:
            proc.heartbeats(now, None)
        else:
            proc.fleet_check(now, None)
    assert len(written) > 100
    for value, want in written:
        if version == 4:
            assert value == want
            continue
        entry = decode_value(value)
        assert "gpus" not in entry and all(isinstance(r, list) for r in entry["rows"].values())
        assert {"v": entry["v"], "hist": entry["hist"], "gpus": entry_snapshots(entry)} == want


def test_a_state_that_cannot_be_encoded_is_counted_lost_and_the_other_gpus_go_on() -> None:
    """A GPU whose state the contract refuses (here a health component that is no string) loses that state, counted
    as a publish failure, and is held published until its refresh: it does not fail every heartbeat, and the GPUs
    after it are refreshed."""
    from gpuaware.stream.state_codec import GpuStateCodec

    proc = StreamProcessor({})
    codec = GpuStateCodec()
    proc.render = lambda t, now: codec.encode_tracker(t, now)
    assert len(proc.on_telemetry(telemetry_batch("bad", 1, T0, gpus=4), 0, T0)) == 4
    proc.trackers["GPU-bad-1"].health_components = {1: 0.5}
    published = []
    for second in range(1, 71):
        published += [key for key, _ in proc.heartbeats(T0 + second * 1000, None)]
    assert proc.stats.publish_failed == 2  # once at each 30 s refresh, not at every heartbeat
    assert sorted(published) == sorted([b"GPU-bad-0", b"GPU-bad-2", b"GPU-bad-3"] * 2)
