"""`gpuaware bench` as a user runs it: the agent benchmark prints its figures as JSON."""

from __future__ import annotations

import json

import pytest

from tests.support import run


@pytest.mark.broker
def test_bench_agent_prints_the_figures_as_json():
    result = run("bench", "agent", "--seconds", "3", "--gpus", "2", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("cpu_percent_of_core", "rss_mib", "bytes_per_gpu_sample", "dcgm_text_bytes_per_gpu"):
        assert figures[key] > 0, key
    assert figures["gpus"] == 2 and figures["spool_dropped"] == 0
