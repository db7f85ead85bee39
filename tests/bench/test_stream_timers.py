"""gpuaware/bench/stream_timers.py: the three timers are timed over a small fleet."""

from __future__ import annotations

import json
import sys

from gpuaware.bench import stream_timers


def test_the_timers_are_timed_and_printed(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["stream_timers", "--gpus", "800", "--rounds", "2"])
    stream_timers.main()
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 800
    assert out["fleet_check_ms_p50"] > 0 and out["node_states_ms_p50"] > 0 and out["heartbeat_ms_p50"] >= 0
