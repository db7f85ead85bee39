"""The Faust app's table store: a restarted worker's per-GPU state, and how much changelog it replays.

The table holds one entry per node (its GPUs' snapshots), so the changelog has one record per node per take
(the records a worker handles together), at most one per batch."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition
from faust.transport.drivers.aiokafka import Producer as AIOKafkaProducerService

from gpuaware.contract import topics
from gpuaware.contract.events import GpuState, encode
from gpuaware.local.stream_workers import StreamWorkerProcess
from gpuaware.plumbing.kafka_admin import end_offsets
from gpuaware.plumbing.kafka_settings import KafkaSettings
from gpuaware.stream import faust_fixes
from gpuaware.stream.app import StreamWorker, tracker_settings
from gpuaware.stream.changelog import ChangelogTable
from gpuaware.stream.gpu_state import GpuTracker
from gpuaware.stream.settings import StreamSettings
from tests.support import fleet_batch as _batch
from tests.support import produce as _produce
from tests.support import watch as _watch
from tests.system.test_stream_workers import MINUTE_MS, _latest

pytestmark = pytest.mark.timeout(300)
ROUNDS = 40
NODES = 3
RESTORED_ACTIVE = 'gpuaware_stream_changelog_restored_total{role="active"}'
# A worker's start, group join and recovery before its first state: 25 s alone, over 90 s once in CI beside the
# rest of the suite on 2 cores. A deadline for a slow machine, not a figure.
WAIT_S = 240.0


def _restart(kafka: KafkaSettings, tmp_path: Path, unique: str, store: str) -> tuple[dict, dict, int, float]:
    """Fill a worker's table, stop it, start it again on the same data dir, and re-send the last batch.

    The re-sent samples are duplicates only to a worker that got its table back; the state it then
    publishes is what it recovered. Returns (states before the stop, states after the restart, records
    in the table's changelog at the restart, and how many of them the restarted worker replayed)."""
    app_id = f"test-app-{store}-{unique}"
    nodes = [f"ra-{store}-{unique}-{n}" for n in range(NODES)]
    mine = {f"GPU-{n}-{i}" for n in nodes for i in range(2)}
    start = int(time.time() * 1000) - 30 * MINUTE_MS
    last = {n: _batch(n, ROUNDS, start + ROUNDS * 5000) for n in nodes}
    records = [(topics.TELEMETRY, n.encode(), encode(_batch(n, seq, start + seq * 5000)))
               for seq in range(1, ROUNDS) for n in nodes]
    records += [(topics.TELEMETRY, n.encode(), encode(b)) for n, b in last.items()]
    asyncio.run(_produce(kafka, records))

    def worker() -> StreamWorkerProcess:
        # A 1 s heartbeat, so the newest state of every GPU is out soon after its last sample.
        w = StreamWorkerProcess(kafka, app_id, tmp_path, f"{store}-w", node_identity="off", store=store,
                                standby_replicas=0,
                                max_publish_interval_ms=1000)
        w.start()
        return w

    def all_at(samples: int, since_ms: int = 0):
        def done(states: list[GpuState]) -> bool:
            latest = _latest([s for s in states if s.published_ms >= since_ms])
            return set(latest) == mine and all(s.samples == samples for s in latest.values())
        return done

    def keep(s: object) -> bool:
        return isinstance(s, GpuState) and s.gpu_uuid in mine

    first = worker()
    try:
        before = _latest(asyncio.run(_watch(kafka, topics.GPU_STATE, all_at(ROUNDS), keep, timeout_s=WAIT_S)))
    finally:
        assert first.stop() == 0, first.log_tail()
    changelog = [TopicPartition(f"{app_id}-gpus-changelog", p) for p in range(topics.spec(topics.TELEMETRY).partitions)]
    written = sum(asyncio.run(end_offsets(kafka, changelog)).values())
    restarted_ms = int(time.time() * 1000)
    second = worker()
    try:
        asyncio.run(_produce(kafka, [(topics.TELEMETRY, n.encode(), encode(b)) for n, b in last.items()]))
        states = asyncio.run(_watch(kafka, topics.GPU_STATE, all_at(ROUNDS, restarted_ms), keep, timeout_s=WAIT_S))
        after = _latest([s for s in states if s.published_ms >= restarted_ms])
        # Every re-sent sample is a duplicate; so are records redelivered because the first worker stopped
        # between two offset commits (Faust commits on an interval; Apache Kafka redelivers them, Tansu did not).
        assert second.counter("gpuaware_stream_duplicate_samples_total") >= len(mine)
        return before, after, written, second.counter(RESTORED_ACTIVE)
    finally:
        second.stop()


def _values(state: GpuState) -> GpuState:
    return dataclasses.replace(state, published_ms=0)


@pytest.mark.timeout(4 * WAIT_S + 120)  # two restarts, two waits each
def test_a_restarted_rocksdb_worker_recovers_state_exactly_from_disk_and_the_changelog_tail(
        kafka_settings, tmp_path, unique) -> None:
    before, after, written, replayed = _restart(kafka_settings, tmp_path, unique, "rocksdb")
    assert {k: _values(s) for k, s in after.items()} == {k: _values(s) for k, s in before.items()}
    # Every acknowledged changelog write was already on disk: nothing was left to replay.
    assert len(before) == 2 * NODES and written >= NODES and replayed == 0
    # The memory store gets the same state back only by replaying the table's whole changelog.
    before, after, written, replayed = _restart(kafka_settings, tmp_path, unique, "memory")
    assert {k: _values(s) for k, s in after.items()} == {k: _values(s) for k, s in before.items()}
    assert written >= NODES and replayed == written


def test_a_record_older_in_the_log_than_a_heartbeat_interval_with_newer_ones_after_it_means_catching_up() -> None:
    from types import SimpleNamespace

    from gpuaware.stream.app import _behind

    now = 1_700_000_000_000

    def record(age_ms: int | None, offset: int = 10) -> SimpleNamespace:
        return SimpleNamespace(timestamp=None if age_ms is None else (now - age_ms) / 1000, offset=offset)

    assert _behind(record(30_001), now, 30_000, highwater=100)
    assert not _behind(record(2_000), now, 30_000, highwater=100)
    assert not _behind(record(30_001, offset=99), now, 30_000, highwater=100)  # the partition's last record
    assert not _behind(record(None), now, 30_000, highwater=100)  # no log time: treated as live
    assert not _behind(record(30_001), now, 30_000, highwater=None)  # no fetch position: treated as live


def test_the_stream_section_reaches_every_gpu_tracker() -> None:
    t = tracker_settings(StreamSettings(min_publish_interval_ms=2000, max_publish_interval_ms=20_000,
                                        publish_every_sample=False, max_clock_skew_s=5, gpu_rehome_after_s=60,
                                        horizons_min=[15, 5]))
    assert (t.min_interval_ms, t.max_interval_ms, t.every_sample, t.max_clock_skew_ms, t.rehome_after_ms,
            t.horizons_min) == (2000, 20_000, False, 5000, 60_000, (5, 15))
    assert tracker_settings(StreamSettings()).every_sample is True


def test_the_node_entry_version_reaches_the_processor(tmp_path) -> None:
    """Version 4 while a rolling upgrade runs beside workers that write it (docs/deploy.md, "Upgrade")."""
    for version in (4, 5):
        worker = StreamWorker(KafkaSettings(bootstrap_servers="127.0.0.1:1"),
                              StreamSettings(data_dir=str(tmp_path), node_entry_version=version))
        assert worker.processor.entry_version == version
    assert StreamSettings().node_entry_version == 5
    with pytest.raises(ValueError):
        StreamSettings(node_entry_version=3)


def test_a_revocation_calls_after_revoke_once_the_trackers_are_dropped(tmp_path) -> None:
    """The worker's collector policy reclaims there (gpuaware/stream/main.py): after the forget, so the next full
    collection
    may free what it dropped (review: two handlers of the signal ran in no set order)."""
    seen: list[int] = []
    worker = StreamWorker(KafkaSettings(bootstrap_servers="127.0.0.1:1"), StreamSettings(data_dir=str(tmp_path)),
                          after_revoke=lambda: seen.append(len(processor.trackers)))
    app, processor = worker.app, worker.processor
    processor.trackers["GPU-rv-0"], processor.partition_of["GPU-rv-0"] = GpuTracker(uuid="GPU-rv-0"), 3

    async def revoke(tps: set) -> None:
        await app.on_partitions_revoked.send(tps)

    asyncio.run(revoke(set()))  # the first join revokes nothing
    assert seen == []
    asyncio.run(revoke({TopicPartition(topics.TELEMETRY, 3)}))
    assert seen == [0]


def test_the_table_is_written_through_the_changelog_batches_whose_check_runs_before_commits(tmp_path) -> None:
    worker = StreamWorker(KafkaSettings(bootstrap_servers="127.0.0.1:1"), StreamSettings(data_dir=str(tmp_path)))
    app, processor = worker.app, worker.processor
    assert isinstance(processor.snapshots, ChangelogTable)
    assert app.gpuaware_after_flush == processor.snapshots.settle
    assert AIOKafkaProducerService.flush is faust_fixes._producer_flush  # (fix 5, installed by StreamWorker)
    handed_over: list[int] = []

    async def hand_over() -> None:  # what the changelog does then (tests/stream/test_changelog.py)
        handed_over.append((len(processor.trackers), processor.snapshots.owns(3)))

    processor.snapshots.hand_over = hand_over
    processor.trackers["GPU-rv-0"], processor.partition_of["GPU-rv-0"] = GpuTracker(uuid="GPU-rv-0"), 3

    async def rebalance(revoked: set, assigned: set) -> None:
        await app.on_partitions_revoked.send(revoked)
        await app.on_partitions_assigned.send(assigned)

    mine = {TopicPartition(topics.TELEMETRY, p) for p in (3, 4)}
    asyncio.run(rebalance(set(), {*mine, TopicPartition("gpuaware-stream-gpus-changelog", 5)}))
    assert [p for p in range(8) if processor.snapshots.owns(p)] == [3, 4]  # actives only, not a standby's 5
    assert handed_over == []  # the first join revokes nothing
    processor.trackers["GPU-rv-0"], processor.partition_of["GPU-rv-0"] = GpuTracker(uuid="GPU-rv-0"), 3
    asyncio.run(rebalance({TopicPartition(topics.TELEMETRY, 3)}, set()))
    assert handed_over == [(1, True)]  # handed over while the partition was still held, its trackers too
    assert [p for p in range(8) if processor.snapshots.owns(p)] == [4]  # before any new assignment
