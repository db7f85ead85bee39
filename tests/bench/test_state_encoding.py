"""The state-encoding bench times the two encoders on the same bytes and prints its JSON."""

from __future__ import annotations

import json
import sys

from gpuaware.bench import state_encoding
from gpuaware.contract.events import encode


def test_the_bench_s_states_encode_to_the_same_bytes_and_it_prints_both_timings(monkeypatch, capsys) -> None:
    batch = state_encoding.states(16)
    assert len({s.gpu_uuid for s in batch}) == 16 and all(encode(s) for s in batch)
    monkeypatch.setattr(sys, "argv", ["state_encoding", "--gpus", "16", "--passes", "1", "--rounds", "2"])
    state_encoding.main()
    out = json.loads(capsys.readouterr().out)
    assert len(out["kept_forecasts_us"]) == len(out["codec_us"]) == 2 and out["ratio"] > 0 and out["gpus"] == 16
