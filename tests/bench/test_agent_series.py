"""The series-per-GPU figures docs/agent.md states are what the agent's /metrics carries."""

from __future__ import annotations

import re

from gpuaware.bench.agent_series import measure
from tests.support import REPO


def test_docs_state_the_measured_series_per_gpu():
    result = measure()
    (para,) = re.findall(r"\*\*Series per GPU\*\*:(.*?)\n\n", (REPO / "docs" / "agent.md").read_text(), re.S)
    said = " ".join(para.split())
    for model, name in (("H100", "an H100"), ("A100", "an A100"), ("L4", "an L4")):
        (n,) = {r["per_gpu"] for r in result[model].values()}  # the same in every schema
        assert f"{n} on {name}" in said, (model, n)
    (node,) = {r["per_node"] for m in ("H100", "A100", "L4") for r in result[m].values()}
    assert f"plus {node} per node" in said
    assert f"one MIG instance adds {result['mig_instance_adds']} (A100)" in said
    assert f"one more pod sharing a GPU adds {result['shared_pod_adds']}" in said
    (labels,) = {r["max_labels"] for m in ("H100", "A100", "L4") for r in result[m].values()}
    assert f"at most {labels} labels" in said
