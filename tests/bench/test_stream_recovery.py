"""gpuaware/bench/stream_recovery.py end to end at a tiny size: it ran against stream_bench's three-value
``_wait_applied`` with two names and failed before measuring anything."""

from __future__ import annotations

import asyncio

import pytest

from gpuaware.bench.stream_recovery import run_store

pytestmark = pytest.mark.timeout(300)


def test_a_restarted_rocksdb_worker_recovers_exactly_and_replays_nothing(kafka_settings, tmp_path) -> None:
    result = asyncio.run(run_store(kafka_settings, tmp_path, "rocksdb", gpus=16, rounds=2, samples_per_batch=2))
    assert result["recovered_exactly"] and result["changelog_records_replayed"] == 0
    assert result["changelog_records"] >= 2 * 2  # rounds x nodes: one node entry per batch
