"""gpuaware/bench/publish_latency.py: samples are timed to the first state carrying them, by kind of state, under either
publishing policy."""

from __future__ import annotations

import json
import sys

import pytest

from gpuaware.bench import publish_latency


@pytest.mark.parametrize(("flags", "latest_s"), [([], 6), (["--on-change"], 35)])
def test_states_are_timed_from_their_samples_and_printed(monkeypatch, capsys, flags, latest_s):
    monkeypatch.setattr(sys, "argv", ["publish_latency", "--nodes", "2", "--seconds", "60", *flags])
    publish_latency.main()
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 16 and out["states"] == out["on_change"] + out["by_heartbeat"] > 0
    assert out["every_sample"] == (flags == []) and out["published"] >= out["states"] and out["samples"] > 0
    # No broker and no lag: a sample is at most a flush (5 s) old when its batch is handed over. A state carries it
    # then, or one minimum interval (1 s) later; with states on change only, at the latest with the 30 s refresh.
    assert 0 <= out["p50_s"] <= out["p99_s"] <= out["max_s"] <= latest_s
    assert out["batch_age_p99_s"] <= 5
