"""``gpuaware/bench/nvml_pipeline_check.py``, the end-to-end check run on a GPU machine, exercised here on the sim
collector:
the agent process publishes, every record read back decodes, and the DCGM families are scraped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.broker
def test_the_check_reads_back_what_the_agent_process_published():
    check = [sys.executable, "-m", "gpuaware.bench.nvml_pipeline_check", "--collector", "sim", "--seconds", "8"]
    done = subprocess.run(check,
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["agent_rc"] == 0 and found["undecodable"] == []
    assert len(found["gpus"]) == 16 and sum(found["samples_per_gpu"].values()) >= 16
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"} <= set(found["dcgm_families_exported"])
