"""gpuaware/bench/ledger_cost.py: the ledger built from the kept sums is the one charging every running pod gives."""

from __future__ import annotations

import json
import sys

from gpuaware.bench import ledger_cost


def test_the_ledger_from_sums_agrees_with_charging_every_running_pod(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ledger_cost", "--nodes", "12", "--running", "40", "--repeat", "1"])
    ledger_cost.main()
    out = json.loads(capsys.readouterr().out)
    assert out["running"] == 40 and out["same"] is True
