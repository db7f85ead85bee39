"""The worker's Faust wrapper (no broker needed)."""

from __future__ import annotations

import logging

import faust
import pytest

from gpuaware.stream.main import make_worker


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
