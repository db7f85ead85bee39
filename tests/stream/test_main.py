"""The worker's Faust wrapper and collector tuning (no broker needed)."""

from __future__ import annotations

import gc
import logging

import faust
import pytest
from aiokafka.structs import TopicPartition

from stream.main import make_worker, tune_gc


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]


def test_a_worker_at_warning_does_not_build_every_debug_record(root_logging, tmp_path):
    # Faust's spinner set the root logger to DEBUG at WARNING and above: every aiokafka/Faust debug
    # record (several per message produced) was then built and handled on the hot path.
    app = faust.App("test-make-worker", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), web_enabled=False)
    worker = make_worker(app, "warning")
    worker._setup_logging()  # what Worker.start does first
    assert not logging.getLogger("aiokafka.producer.producer").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("faust.topics").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("faust.topics").isEnabledFor(logging.WARNING)


async def test_the_worker_freezes_what_full_collections_keep_and_a_revocation_reclaims(tmp_path):
    # A full collection walked the whole fleet's trackers every few seconds, holding the GIL for over a second
    # at 16,384 GPUs (docs/performance.md).
    app = faust.App("test-tune-gc", broker="kafka://127.0.0.1:1", datadir=str(tmp_path), web_enabled=False)
    survivors, handler = tune_gc(app)
    try:
        kept = [[i] for i in range(1000)]
        gc.collect()
        assert gc.get_freeze_count() >= len(kept) and survivors.frozen >= 1
        await app.on_partitions_revoked.send(set())  # the first join revokes nothing
        assert survivors.reclaims == 0 and gc.get_freeze_count() >= len(kept)
        await app.on_partitions_revoked.send({TopicPartition("gpu.telemetry.v1", 0)})
        assert survivors.reclaims == 1 and gc.get_freeze_count() == 0
    finally:
        app.on_partitions_revoked.disconnect(handler)
        survivors.uninstall()
