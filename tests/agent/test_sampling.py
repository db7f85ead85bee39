"""Adaptive sampling: the sampler backs off while stable and snaps back on change; policy parsing names the
field, and hostile input is rejected with a PolicyError, never a crash."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuaware.agent.sampling import AdaptiveSampler, PolicyError, SamplingPolicy, load_policy, parse_policy
from tests.support import FUZZ, json_values, printable_text, reading


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


def test_sampler_backs_off_while_stable_and_snaps_to_the_floor():
    policy = SamplingPolicy(floor_s=1, ceiling_s=30, backoff=2, light_points=False)
    s = AdaptiveSampler(policy, fb_total_mib=80000, power_limit_w=700)
    t, taken = 0.0, []
    while t < 200:
        r = reading(t)
        if s.due(r):
            s.taken(r, changed=s.outside_deadband(r) not in (None, "first") if s.last else False)
            taken.append(t)
        t += 1
    assert s.interval == 30
    assert len(taken) < 20
    jump = reading(t, util=90.0)
    assert s.outside_deadband(jump) == "util_gpu" and s.due(jump)
    s.taken(jump, changed=True)
    assert s.interval == 1
    s.taken(reading(t + 1, util=90.0), changed=False)
    assert s.interval == 2
    s.snap()
    assert s.due(reading(t + 1.5, util=90.0))


def test_utilisation_moves_are_light_points_and_the_full_interval_keeps_backing_off():
    s = AdaptiveSampler(SamplingPolicy(floor_s=1, ceiling_s=30, backoff=2), fb_total_mib=80000, power_limit_w=700)
    points, full = [], []
    for t in range(120):
        # bursty: 3 s busy, 9 s idle
        r = reading(float(t), util=95.0 if (t // 3) % 4 == 0 else 5.0, power=650.0 if (t // 3) % 4 == 0 else 100.0)
        sampled = s.due(r)
        if sampled:
            s.taken(r, changed=False)
            full.append(r.ts)
        points += s.light(r, sampled)
    assert s.interval == 30  # the bursts never snapped the full-sample interval
    # Each step publishes the new level and the end of the plateau before it: a line through the
    # published points follows the steps.
    published = {p.ts for p in points} | set(full)
    assert published >= {11.0, 12.0, 14.0, 15.0, 23.0, 24.0, 26.0, 27.0}
    assert len(full) < 10 and len(points) < 60
    hot = reading(121.0, temp=80.0)
    assert s.outside_deadband(hot) == "temp" and s.due(hot)  # other metrics still take full samples


def test_policy_validation_names_the_field():
    with pytest.raises(PolicyError, match=r"floor_s: 10\.0 is above ceiling_s 5\.0"):
        parse_policy("floor_s: 10\nceiling_s: 5\n")
    with pytest.raises(PolicyError, match=r"deadbands\.util_gpu"):
        parse_policy("deadbands:\n  util_gpu: -1\n")
    with pytest.raises(PolicyError, match="samplng_floor"):
        parse_policy("samplng_floor: 1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        parse_policy("floor_s: [1\n")
    p = parse_policy("ceiling_s: 60\nnodes:\n  gpu-node-7:\n    floor_s: 5\n")
    assert p.for_node("gpu-node-7").floor_s == 5 and p.for_node("other").floor_s == 1


@FUZZ
@given(st.one_of(printable_text, st.builds(yaml.safe_dump, st.dictionaries(
    st.sampled_from(["floor_s", "ceiling_s", "backoff", "flush_s", "deadbands", "nodes", "other"]), json_values,
    max_size=4))))
def test_sampling_policy_parses_or_raises_policy_error(source):
    try:
        parse_policy(source, "fuzz")
    except PolicyError as exc:
        assert str(exc)
