"""Sampling-policy parsing: hostile input is rejected with a PolicyError, never a crash."""

from __future__ import annotations

import pytest

from agent.sampling import PolicyError, load_policy, parse_policy


def _nested_block(levels: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(levels))


@pytest.mark.parametrize("text", [
    _nested_block(500),
    "nodes: " + "[" * 500 + "]" * 500,
    "nodes: " + "{a: " * 500 + "1" + "}" * 500,
], ids=["block-mapping", "flow-sequence", "flow-mapping"])
def test_a_policy_nested_500_levels_is_rejected_naming_the_limit(text):
    with pytest.raises(PolicyError, match=r"nested deeper than \d+ levels"):
        parse_policy(text, "control c1")


def test_a_10_mb_policy_is_rejected_naming_the_limit(tmp_path):
    text = "# padding\n" * (10 * 2**20 // 10)
    with pytest.raises(PolicyError, match=r"larger than \d+ bytes"):
        parse_policy(text)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=r"larger than \d+ bytes"):
        load_policy(path)


def test_an_ordinary_policy_with_per_node_overrides_still_parses():
    nodes = "".join(f"  gpu-node-{i}: {{floor_s: 2.0, ceiling_s: 60.0}}\n" for i in range(4096))
    p = parse_policy("floor_s: 1\ndeadbands: {util_gpu: 2}\nnodes:\n" + nodes)
    assert p.for_node("gpu-node-17").ceiling_s == 60.0 and p.deadbands.util_gpu == 2
