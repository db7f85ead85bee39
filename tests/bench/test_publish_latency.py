"""bench/publish_latency.py: samples are timed to the first state carrying them, by kind of state."""

from __future__ import annotations

import json
import sys

from bench import publish_latency


def test_states_are_timed_from_their_samples_and_printed(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["publish_latency", "--nodes", "2", "--seconds", "60"])
    publish_latency.main()
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 16 and out["states"] == out["on_change"] + out["by_heartbeat"] > 0
    # No broker and no lag: a sample is at most a flush (5 s) old when its batch is handed over, and a state
    # carries it then or at the latest with the 30 s refresh.
    assert 0 <= out["p50_s"] <= out["p99_s"] <= out["max_s"] <= 35
    assert out["batch_age_p99_s"] <= 5
