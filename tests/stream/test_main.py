"""The worker's Faust wrapper (no broker needed)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import faust
import pytest

from gpuaware.stream.main import make_worker, node_verifier
from gpuaware.stream.metrics import StreamStats
from gpuaware.stream.settings import StreamSettings


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


def test_node_identity_is_required_by_default_and_a_worker_without_an_apiserver_says_what_to_set(tmp_path):
    """The worker as its command runs it: no apiserver to check node tokens with, so it stops at once with the fix
    (before waiting for Kafka, which is not there either), rather than letting any agent speak for any node."""
    assert StreamSettings().node_identity == "required"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAWARE_", "KUBERNETES_SERVICE"))}
    env["KUBECONFIG"] = str(tmp_path / "no-kubeconfig")
    done = subprocess.run([sys.executable, "-m", "gpuaware", "--bootstrap-servers", "127.0.0.1:1", "stream",
                           "--metrics-port", "0", "--data-dir", str(tmp_path / "data")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "stream.node_identity is required" in done.stderr and "node_identity: off" in done.stderr, done.stderr


def test_with_node_identity_off_no_verifier_is_made_and_the_worker_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="gpuaware.stream.main"):
        assert node_verifier(StreamSettings(node_identity="off"), StreamStats()) is None
    assert "any agent may speak for any node" in caplog.text
